"""Environments and task suites (no torch, and nothing from `loop/`).

from tasks import get_suite
suite = get_suite("apptown")          # or suite_for_run(name, RunSettings(...)) from a config
task = suite.tasks("train")[0]
env = suite.make_env(task, sandbox)   # sandbox: a sandbox.Sandbox
context = env.reset(); observation = env.step(code); report = env.evaluate()
"""

from tasks.core import (
    EXAMPLE_TASK,
    SPLITS,
    ApiCall,
    Environment,
    EnvironmentFailureError,
    SandboxLike,
    SuiteSetupError,
    Task,
    TaskSuite,
    TestReport,
    TestResult,
    format_assistant,
    format_observation,
)
from tasks.registry import SUITES, RunSettings, get_suite, suite_for_run

__all__ = [
    "EXAMPLE_TASK",
    "SPLITS",
    "SUITES",
    "ApiCall",
    "Environment",
    "EnvironmentFailureError",
    "RunSettings",
    "SandboxLike",
    "SuiteSetupError",
    "Task",
    "TaskSuite",
    "TestReport",
    "TestResult",
    "format_assistant",
    "format_observation",
    "get_suite",
    "suite_for_run",
]
