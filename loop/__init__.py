"""The LOOP algorithm and the training system: policy, generators, rollouts, advantages,
losses, the trainer and evaluation. It builds on `sandbox/` (isolated kernels) and `tasks/`
(environments); nothing there imports from here."""
