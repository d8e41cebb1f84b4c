"""The real AppWorld benchmark as a task suite (`suite: appworld`); see README.md here.

The engine (PyPI `appworld`, pinned) runs in its own virtualenv, one confined process per
concurrent rollout; this package never imports `appworld` itself.
"""

from tasks.appworld.engine import EngineCrashError, EngineStartError
from tasks.appworld.env import AppWorldEnv
from tasks.appworld.suite import (
    PAPER_DEV_DENYLIST,
    PAPER_TRAIN_SPLIT,
    AppWorldSuite,
)
from tasks.appworld.venv import AppWorldSetupError, build_small_root

__all__ = [
    "PAPER_DEV_DENYLIST",
    "PAPER_TRAIN_SPLIT",
    "AppWorldEnv",
    "AppWorldSetupError",
    "AppWorldSuite",
    "EngineCrashError",
    "EngineStartError",
    "build_small_root",
]
