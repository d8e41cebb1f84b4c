"""The LOOP algorithm and the training system, by role. It builds on `sandbox/` (isolated
kernels) and `tasks/` (environments, seen only through `tasks/core.py`'s contract); nothing
there imports from here.

    algo/        pure math, tensors in and out: advantages, GAE, losses, credit assignment
    rollout/     episodes and their concurrent collection, the task sampler (no torch)
    learner/     what trains the model: samples, chunked log-probs, minibatch steps, value head
    model/       the one model copy: aliases, loading with LoRA, FSDP2, checkpoints
    generators/  sampling backends (hf, vllm_server, openai, scripted), weight publication to them
    run/         what a run writes and reads back (no torch at import)
    inspect/     behaviour metrics, terminal tables and the HTML report (`python -m loop.inspect`)

The top level keeps the loop and the edges: `trainer.py` (the iteration, written once),
`warmstart.py` and `demos.py` (fine-tuning on demonstrations before RL), `evaluation.py`
(evaluate.py's and the trainer's one scoring path), `build.py` (config -> objects; only
train.py and evaluate.py import it), `config.py` / `config_types.py` / `checks.py` (load,
document and validate a config) and `seeds.py` (every seed). tests/test_layout.py holds the
rules: which folder may import which, and which load no torch.
"""
