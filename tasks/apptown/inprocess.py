"""Run solution cells against a task in this process, without a sandbox.

For authoring and testing scenarios and for benchmarks only: the code runs with plain `exec` and
is NOT isolated. Agents always run through `sandbox.Sandbox` and `AppTownEnv`. The stand-in
`apis` behaves like the sandbox's for well-behaved code: keyword arguments only, JSON
round-tripped results, and API errors raised as `ApiError` whose str() is "<status>: <message>".
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from typing import Any

from tasks.apptown.server import ApiError, AppServer, InProcessApis
from tasks.apptown.suite import AppTownSuite
from tasks.core import Task, TestReport

__all__ = ["ApiError", "InProcessApis", "InProcessRun", "run_in_process"]


@dataclass
class InProcessRun:
    """The outcome of running cells: the report, and each cell's output or error."""

    report: TestReport
    outputs: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def run_in_process(suite: AppTownSuite, task: Task, cells: list[str]) -> InProcessRun:
    """Fork the task's state, exec `cells` in one namespace, and grade the final state."""
    server = AppServer(suite.initial_state(task).fork(), suite.user_of(task).id, suite.world.now)
    namespace: dict[str, Any] = {"apis": InProcessApis(server)}
    outputs, errors = [], []
    for cell in cells:
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer):
                exec(compile(cell, "<cell>", "exec"), namespace)
        except Exception as e:  # an agent's failing cell is data here, not a crash
            errors.append(f"{type(e).__name__}: {e}")
        outputs.append(buffer.getvalue())
    ctx = server.ctx
    report = suite.grade(task, ctx.db, ctx.answer, ctx.completed)
    return InProcessRun(report, outputs, errors)
