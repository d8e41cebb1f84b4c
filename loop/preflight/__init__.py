"""The preflight: plan a config at its real world size and refuse what cannot work, with no GPU
and no weights (`python train.py --config X --preflight`; docs/preflight.md)."""
