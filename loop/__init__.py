"""The LOOP algorithm and the training system: policy, generators, rollouts, advantages,
losses, the trainer and evaluation. It builds on `sandbox/` (isolated kernels) and `tasks/`
(environments, seen only through `tasks/core.py`'s contract); nothing there imports from here.

The edges: `build.py` turns a config into objects and only train.py and evaluate.py import
it; `config.py` / `config_types.py` / `checks.py` load, document and validate a config;
`seeds.py` derives every seed; `rundir.py` owns the run directory's files; `trainer.py` is the
iteration, written once; `evaluation.py` is evaluate.py's and the trainer's one scoring path.
"""
