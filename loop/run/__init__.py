"""What a run writes and reads back: the run directory's layout, the per-iteration log and
rollout files, evaluation metrics, significance tests and the learning report. No torch at
import, and nothing from `loop.learner` or `loop.model` at run time (tests/test_layout.py)."""
