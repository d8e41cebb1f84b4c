"""The one model copy: built-in model aliases, loading with LoRA (and a 4-bit base), FSDP2
sharding and its collectives, saving and restoring weights and checkpoints."""
