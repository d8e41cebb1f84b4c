"""Environments and task suites (no torch, and nothing from `loop/`).

`tasks/core.py` is the whole contract `loop/` sees: `Task`, `TestReport`, `ApiCall`, the
`Environment` and `TaskSuite` Protocols (whether a suite runs the agent's code in our sandbox,
async grading, the prompt's worked example) and the example's message format. Each suite keeps
its own worked example (tasks/apptown/example.py, tasks/appworld/example.py); its registry
entry (tasks/registry.py) turns a run's plain settings into the suite.

from tasks import get_suite
suite = get_suite("apptown")          # or suite_for_run(name, RunSettings(...)) from a config
task = suite.tasks("train")[0]
env = suite.make_env(task, sandbox)   # sandbox: a sandbox.Sandbox
context = await env.areset(); observation = await env.astep(code)
report = await env.aevaluate(); await env.aclose()
"""

from tasks.core import (
    EXAMPLE_TASK,
    SPLITS,
    ApiCall,
    Environment,
    EnvironmentFailureError,
    GoldSolutions,
    SandboxLike,
    SuiteSetupError,
    Task,
    TaskSuite,
    TestReport,
    TestResult,
    format_assistant,
    format_observation,
)
from tasks.registry import SUITES, RunSettings, get_suite, suite_class, suite_for_run

__all__ = [
    "EXAMPLE_TASK",
    "SPLITS",
    "SUITES",
    "ApiCall",
    "Environment",
    "EnvironmentFailureError",
    "GoldSolutions",
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
    "suite_class",
    "suite_for_run",
]
