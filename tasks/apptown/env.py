"""`AppTownEnv`: one AppTown task instance bound to one sandbox kernel.

The environment is the sandbox's bridge handler: `apis.<app>.<api>(**kwargs)` in agent code
arrives at `handle`, runs against this instance's private SQLite state, and is recorded in
`api_calls`. Errors the agent caused (not logged in, unknown id, bad arguments, more than
MAX_CALLS calls in one episode) go back to agent code as `sandbox.ApiError` with status
401/404/422/429; anything else is an environment bug, which the sandbox records in
`handler_errors` and `evaluate` raises as `EnvironmentFailureError`.

`aevaluate` grades on a thread of its own, never on the event loop, and waits at most
`grade_timeout_s`. Grading a state takes milliseconds and reads only what the agent left (its
writes, at most MAX_CALLS of bounded size, and its answer, bounded by the API and parsed in
linear time), so a grader past the limit was made slow by the agent's state: the agent's
failure, reported as one failed test (`graded_in_time`), not an exception that would exclude
the rollout. A thread cannot be stopped: one that overruns finishes on its own, holding up
nothing else (not the loop, not a shared pool).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

from sandbox import ApiError
from tasks.apptown.api import AppError
from tasks.apptown.people import Person
from tasks.apptown.server import AppServer
from tasks.apptown.world import Snapshot
from tasks.core import (
    ApiCall,
    EnvironmentFailureError,
    SandboxLike,
    Task,
    TestReport,
    TestResult,
    recorded_arguments,
    task_context,
)

MAX_CALLS = 10_000  # API calls one episode may make; every one is kept in host memory
# Grading takes milliseconds; the most an agent can leave (MAX_CALLS writes of bounded size:
# 10,000 files of 10,000 characters) took 0.3 s. A minute is far past both, even under load.
GRADE_TIMEOUT_S = 60.0


class AppTownEnv:
    """reset -> step/astep ... -> done -> evaluate, as in DESIGN.md section 4."""

    def __init__(
        self,
        task: Task,
        sandbox: SandboxLike,
        *,
        user: Person,
        initial_state: Snapshot,
        now: dt.datetime,
        grade: Callable[[sqlite3.Connection, Any, bool], TestReport],
        grade_timeout_s: float = GRADE_TIMEOUT_S,
    ):
        """`user`: the supervisor the agent acts for. `initial_state`: the task's state, forked
        per episode. `now`: the world's clock. `grade(db, answer, completed)`: the task's tests
        on a final state (the suite's one scoring path). `grade_timeout_s`: how long
        `aevaluate` waits for them (see the module docstring)."""
        self.task = task
        self.grade_timeout_s = grade_timeout_s
        self.sandbox = sandbox
        self.user = user
        self.initial_state = initial_state
        self.now = now
        self.grade = grade
        self.api_calls: list[ApiCall] = []
        self.last_result: Any = None  # the ExecutionResult of the latest step
        self.start_fingerprint: str | None = None  # sha256 of the forked state, set by reset
        self._server: AppServer | None = None
        self._lock = threading.Lock()  # the bridge thread and evaluate never overlap on the db

    def reset(self) -> str:
        """Fork a fresh copy of the task's initial state, attach to the sandbox, return the
        task context (who the user is, today's date, the instruction)."""
        user = self.user
        db = self.initial_state.fork()
        # Of the very copy this episode runs on (about 3 ms): equal for equal starts.
        self.start_fingerprint = fingerprint(db)
        self._server = AppServer(db, user.id, self.now)
        self.api_calls = []
        self.last_result = None
        self.sandbox.set_handler(self.handle)
        return task_context(
            self.now, user.name, user.email, user.phone_number, self.task.instruction
        )

    async def areset(self) -> str:
        """`reset` (a fork in memory: nothing to wait for)."""
        return self.reset()

    def state_fingerprint(self) -> str:
        """The fingerprint of the state now, as `start_fingerprint` is of the start's: equal
        for equal states (a restore by replay is checked with it)."""
        with self._lock:
            return fingerprint(self.server.ctx.db)

    async def aclose(self) -> None:
        """Nothing outside the sandbox to release (the pool destroys the kernel)."""

    @property
    def server(self) -> AppServer:
        assert self._server is not None, f"call reset() before using the env of {self.task.id}"
        return self._server

    @property
    def done(self) -> bool:
        """The agent called apis.supervisor.complete_task."""
        return self._server is not None and self._server.ctx.completed

    def handle(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        """The sandbox's bridge handler: run one API call and record it."""
        if len(self.api_calls) >= MAX_CALLS:  # not recorded: the host keeps a bounded list
            raise ApiError(f"this episode has made its {MAX_CALLS} API calls", status=429)
        start = time.perf_counter()
        try:
            with self._lock:
                result = self.server.call(app, api, kwargs)
        except AppError as e:
            self._record(app, api, kwargs, start, f"{e.status}: {e.message}")
            raise ApiError(e.message, status=e.status) from None
        except Exception as e:
            self._record(app, api, kwargs, start, f"internal error: {type(e).__name__}: {e}")
            raise
        self._record(app, api, kwargs, start, None)
        return result

    def _record(
        self, app: str, api: str, kwargs: dict[str, Any], start: float, error: str | None
    ) -> None:
        self.api_calls.append(
            ApiCall(
                app,
                api,
                recorded_arguments(kwargs),  # bounded: agent code controls their size
                error is None,
                error,
                time.perf_counter() - start,
                self.server.read_only(app, api),
            )
        )

    def step(self, code: str) -> str:
        """Run one cell in the kernel and return what the agent sees."""
        self.server  # noqa: B018 - fail fast before running code against no state
        self.last_result = self.sandbox.execute(code)
        return format_observation(self.last_result)

    async def astep(self, code: str) -> str:
        """`step` for asyncio rollouts."""
        self.server  # noqa: B018
        self.last_result = await self.sandbox.execute_async(code)
        return format_observation(self.last_result)

    def evaluate(self) -> TestReport:
        """Run the task's tests on the current state. Raises EnvironmentFailureError if the
        environment itself failed during the rollout (its reward would be meaningless)."""
        if self.sandbox.handler_errors:
            raise EnvironmentFailureError(
                f"{self.task.id}: the API handler failed: {self.sandbox.handler_errors}"
            )
        ctx = self.server.ctx
        with self._lock:
            return self.grade(ctx.db, ctx.answer, ctx.completed)

    async def aevaluate(self) -> TestReport:
        """`evaluate` on a thread of its own, waiting at most `grade_timeout_s`; past it, the
        agent's state made grading slow: one failed test (see the module docstring)."""
        try:
            return await asyncio.wait_for(_on_own_thread(self.evaluate), self.grade_timeout_s)
        except TimeoutError:
            limit = f"{self.grade_timeout_s:g} s"
            test = TestResult(
                "graded_in_time",
                f"The final state and answer can be graded within {limit}",
                False,
                f"grading the state the agent left took longer than {limit}",
            )
            return TestReport(self.task.id, (test,))


async def _on_own_thread(fn: Callable[[], TestReport]) -> TestReport:
    """`fn()` on a new daemon thread: one that never returns holds no pool's worker."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[TestReport] = loop.create_future()

    def settle(setter: Callable[[Any], None], value: Any) -> None:
        if not future.done():  # else the caller stopped waiting
            setter(value)

    def run() -> None:
        try:
            outcome: tuple[Callable[[Any], None], Any] = (future.set_result, fn())
        except BaseException as exc:  # raised to the caller
            outcome = (future.set_exception, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=run, name="apptown-grade", daemon=True).start()
    return await future


def format_observation(result: Any) -> str:
    """AppWorld-style reply from a `sandbox.ExecutionResult`: the output, and a clear first line
    when the cell failed, timed out or killed the kernel."""
    output = result.output.rstrip()
    if result.crashed:
        head = (
            "Execution failed: the Python kernel crashed and was restarted; all variables are lost."
        )
    elif result.timed_out:
        head = "Execution failed: the cell ran past the time limit and was interrupted."
    elif result.error is not None:
        head = "Execution failed."
    else:
        return output or "Execution successful."
    return f"{head}\n{output}" if output else head


def fingerprint(db: Any) -> str:
    """sha256 of a world's whole SQLite state (equal states, equal fingerprints)."""
    return hashlib.sha256(db.serialize()).hexdigest()
