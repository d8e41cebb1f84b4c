"""Run solution cells against a task in this process, without a sandbox.

For authoring and testing scenarios and for benchmarks only: the code runs with plain `exec` and
is NOT isolated. Agents always run through `sandbox.Sandbox` and `AppTownEnv`. The stand-in
`apis` behaves like the sandbox's for well-behaved code: keyword arguments only, JSON
round-tripped results, and API errors raised as `ApiError` whose str() is "<status>: <message>".
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass, field
from typing import Any

from tasks.apptown.api import AppError
from tasks.apptown.server import AppServer
from tasks.apptown.suite import AppTownSuite
from tasks.core import Task, TestReport


class ApiError(Exception):
    """What agent code sees for an API error (mirrors sandbox.ApiError)."""


class _App:
    def __init__(self, server: AppServer, name: str):
        self._server, self._name = server, name

    def __getattr__(self, api: str) -> Any:
        def call(**kwargs: Any) -> Any:
            try:
                result = self._server.call(self._name, api, json.loads(json.dumps(kwargs)))
            except AppError as e:
                raise ApiError(f"{e.status}: {e.message}") from None
            return json.loads(json.dumps(result))

        return call


class InProcessApis:
    """`apis.<app>.<api>(**kwargs)` backed directly by an `AppServer`."""

    def __init__(self, server: AppServer):
        self._server = server

    def __getattr__(self, app: str) -> _App:
        return _App(self._server, app)


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
