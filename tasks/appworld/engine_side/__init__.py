"""Scripts that run inside the AppWorld virtualenv, never in the trainer's process.

They import `appworld` (pydantic 1, a frozen clock, one task per process), so the host starts
them as separate processes with the venv's Python (`python -I <file>`) and never imports them:
- `worker.py`: one engine process, JSON lines over stdin/stdout (tasks/appworld/engine.py).
- `small_root.py`: builds a small data root from scratch with the package's own models and
  API-doc generator (the tests and the benchmark use it; tasks/appworld/data_root.py).
"""
