"""Environments and task suites (no torch, and nothing from `loop/`).

from tasks import get_suite
suite = get_suite("apptown")
task = suite.tasks("train")[0]
env = suite.make_env(task, sandbox)   # sandbox: a sandbox.Sandbox
context = env.reset(); observation = env.step(code); report = env.evaluate()
"""

from tasks.core import (
    SPLITS,
    ApiCall,
    Environment,
    EnvironmentFailureError,
    SandboxLike,
    Task,
    TaskSuite,
    TestReport,
    TestResult,
)
from tasks.registry import SUITES, get_suite

__all__ = [
    "SPLITS",
    "SUITES",
    "ApiCall",
    "Environment",
    "EnvironmentFailureError",
    "SandboxLike",
    "Task",
    "TaskSuite",
    "TestReport",
    "TestResult",
    "get_suite",
]
