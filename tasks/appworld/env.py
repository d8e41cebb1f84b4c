"""`AppWorldEnv`: one AppWorld task instance, run by an engine process from the suite's pool.

reset -> step/astep ... -> done -> evaluate, as in DESIGN.md section 4, with AppWorld's own
semantics: agent code runs in the engine's REPL (`world.execute`), `done` is the engine's
task-completed state, and `evaluate()` is AppWorld's grader on the final state.

Timing: `reset()` only reads the task's specs (it runs inside the event loop); the engine is
taken from the pool and the task opened on the first step, in a worker thread. When a step
completes the task, the grader runs in that same thread call, so `evaluate()` (also called from
the event loop) only hands back the ready report and returns the engine to the pool.
`evaluate()` ends the episode: the engine goes back, later steps need a new `reset()`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any

from sandbox import ExecutionResult
from tasks.appworld.engine import EngineCrashError, EngineProcess, EngineRequestError
from tasks.core import (
    ApiCall,
    EnvironmentFailureError,
    Task,
    TestReport,
    TestResult,
    task_context,
)

if TYPE_CHECKING:
    from tasks.appworld.pool import EnginePool

OPEN_TIMEOUT_S = 120.0  # initialize: loads the task's databases
EVALUATE_TIMEOUT_S = 300.0
CLOSE_TIMEOUT_S = 60.0
STEP_GRACE_S = 30.0  # past the engine's own cell timeout, before the engine is declared hung
EXCEPTION_LINE = re.compile(r"^[A-Za-z_.]*(Error|Exception|Exit|Interrupt|Warning)(:|$)")


class AppWorldEnv:
    """One rollout's view of an AppWorld task (see the module docstring)."""

    def __init__(
        self,
        task: Task,
        *,
        specs: dict[str, Any],
        engines: Callable[[], EnginePool],
        io_threads: Executor,
        timeout_s: int,
        max_output_chars: int,
    ):
        """`specs`: the task's specs.json (supervisor, datetime). `engines`: the suite's engine
        pool (started on the first call). `io_threads`: where `astep`/`aevaluate` block.
        `timeout_s`, `max_output_chars`: the engine's cell time limit and output cap."""
        self.task = task
        self.specs = specs
        self.engines = engines
        self.io_threads = io_threads
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.api_calls: list[ApiCall] = []
        self.last_result: Any = None  # a sandbox.ExecutionResult of the latest step
        self.start_fingerprint: str | None = None  # the engine loads the task's own databases
        self._engine: EngineProcess | None = None
        self._pool: EnginePool | None = None  # the pool the engine came from
        self._finalizer: weakref.finalize | None = None
        self._completed = False
        self._report: TestReport | None = None
        self._failure: EnvironmentFailureError | None = None  # raised again by evaluate()
        self._ended = True  # no episode until reset()
        self._lock = threading.Lock()

    def reset(self) -> str:
        """Start a fresh episode; return the task context (who the user is, the date, the
        instruction). The engine opens the task on the first step."""
        self.close()
        self.api_calls, self.last_result = [], None
        self._completed, self._report, self._failure, self._ended = False, None, None, False
        specs = self.specs
        now = dt.datetime.fromisoformat(specs["datetime"])
        user = specs["supervisor"]
        name = f"{user['first_name']} {user['last_name']}"
        return task_context(now, name, user["email"], user["phone_number"], self.task.instruction)

    async def areset(self) -> str:
        """`reset` (it only reads the specs; the engine opens the task on the first step)."""
        return self.reset()

    async def aclose(self) -> None:
        """`close` off the event loop: the engine goes back to the pool."""
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.io_threads, self.close)

    @property
    def done(self) -> bool:
        """The agent called apis.supervisor.complete_task (the engine's task state)."""
        return self._completed

    @property
    def engine(self) -> EngineProcess | None:
        """The engine running this episode (None before the first step and after evaluate)."""
        return self._engine

    def step(self, code: str) -> str:
        """Run one cell in the engine's REPL and return AppWorld's output for it. Raises
        EngineCrashError (an EnvironmentFailureError) when the engine died or hung."""
        with self._lock:
            if self._failure is not None:
                raise self._failure
            engine = self._open_engine()
            started = time.monotonic()
            timeout = self.timeout_s + STEP_GRACE_S
            reply = self._request(engine, {"op": "execute", "code": code}, timeout)
            self.api_calls += [ApiCall(**call) for call in reply["api_calls"]]
            self._completed = bool(reply["completed"])
            output = str(reply["output"])
            self.last_result = _execution_result(output, time.monotonic() - started)
            self._report = None
            if self._completed:  # grade now, off the event loop (see the module docstring)
                try:
                    self._report = self._grade(engine)
                except EnvironmentFailureError as exc:
                    self._failure = exc  # evaluate() reports it: the step itself went fine
            return output

    async def astep(self, code: str) -> str:
        """`step` for asyncio rollouts (runs in the suite's I/O threads)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.io_threads, self.step, code)

    def evaluate(self) -> TestReport:
        """AppWorld's own tests on the final state; ends the episode and frees the engine.
        Raises EnvironmentFailureError when the engine or the grader failed."""
        with self._lock:
            try:
                if self._failure is not None:
                    raise self._failure
                if self._report is None:
                    self._report = self._grade(self._open_engine())
                return self._report
            finally:
                self._end_episode()

    async def aevaluate(self) -> TestReport:
        """`evaluate` off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.io_threads, self.evaluate)

    def close(self) -> None:
        """Give the engine back (closing the task) without grading; safe to call any time."""
        with self._lock:
            self._end_episode()

    # -- internals -----------------------------------------------------------------------------

    def _open_engine(self) -> EngineProcess:
        if self._engine is not None:
            return self._engine
        if self._ended:
            raise RuntimeError(
                f"{self.task.id}: no episode is running (evaluate() ends one); call reset()"
            )
        self._pool = pool = self.engines()
        engine = pool.acquire()
        engine.tasks_started += 1
        self._engine = engine
        self._finalizer = weakref.finalize(self, _abandon, pool, engine)
        request = {
            "op": "initialize",
            "task_id": self.task.id,
            "timeout_s": self.timeout_s,
            "max_output_chars": self.max_output_chars,
        }
        context = self._request(engine, request, OPEN_TIMEOUT_S)["context"]
        expected = self.specs
        if (context["instruction"], context["supervisor"]) != (
            self.task.instruction,
            expected["supervisor"],
        ):
            self._failure = EnvironmentFailureError(
                f"{self.task.id}: the engine opened a task unlike its specs.json: {context}"
            )
            raise self._failure
        return engine

    def _grade(self, engine: EngineProcess) -> TestReport:
        reply = self._request(engine, {"op": "evaluate"}, EVALUATE_TIMEOUT_S)
        return report_from(self.task.id, reply)

    def _request(
        self, engine: EngineProcess, message: dict[str, Any], timeout_s: float
    ) -> dict[str, Any]:
        op = message["op"]
        try:
            return engine.request(message, timeout_s)
        except EngineCrashError as exc:
            self._drop_engine(reusable=False)
            self._failure = EngineCrashError(
                f"env_crash: {self.task.id}: {exc}; the pool starts a fresh engine"
            )
        except EngineRequestError as exc:
            what = "AppWorld's grader failed" if op == "evaluate" else f"the engine refused {op}"
            self._failure = EnvironmentFailureError(f"{self.task.id}: {what}: {exc}")
        raise self._failure

    def _end_episode(self) -> None:
        self._ended = True
        if self._engine is None:
            return
        try:
            self._engine.request({"op": "close"}, CLOSE_TIMEOUT_S)
        except (EngineCrashError, EngineRequestError):
            self._drop_engine(reusable=False)
            return
        self._drop_engine(reusable=True)

    def _drop_engine(self, *, reusable: bool) -> None:
        engine, self._engine = self._engine, None
        if self._finalizer is not None:
            self._finalizer.detach()
            self._finalizer = None
        if engine is not None and self._pool is not None:
            self._pool.release(engine, reusable=reusable)


def _abandon(pool: EnginePool, engine: EngineProcess) -> None:
    """An env was dropped mid-episode (a timeout, an error above us): its engine may still be
    running the agent's cell, so it is not reused."""
    pool.release(engine, reusable=False)


def _execution_result(output: str, duration_s: float) -> ExecutionResult:
    """The sandbox's result type, read off AppWorld's output text."""
    failed = output.startswith("Execution failed.")
    timed_out = failed and "Execution timed out after" in output
    error = None
    if failed:  # the traceback's "SomeError: message" line (the message may span lines)
        lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1])
    return ExecutionResult(output, error, timed_out, False, duration_s)


def report_from(task_id: str, reply: dict[str, Any]) -> TestReport:
    """AppWorld's TestTracker (passes, failures, test_data) as a TestReport, in the task's
    test order. A listed test that never ran (the evaluation stopped early) is a failure."""
    passes = [p["requirement"] for p in reply["passes"]]
    failures = {f["requirement"]: f["trace"] for f in reply["failures"]}
    order = [t["requirement"] for t in reply["test_data"] or []]
    if not order:
        order = passes + list(failures)
    tests = []
    for index, requirement in enumerate(order, start=1):
        name = f"test_{index}"
        if requirement in passes:
            passes.remove(requirement)
            tests.append(TestResult(name, requirement, True))
        elif requirement in failures:
            message = failures.pop(requirement) or "failed"
            tests.append(TestResult(name, requirement, False, message))
        else:
            message = "not run: the task's evaluation stopped before this test"
            tests.append(TestResult(name, requirement, False, message))
    if not tests:
        raise EnvironmentFailureError(f"{task_id}: AppWorld's evaluation ran no tests")
    return TestReport(task_id, tuple(tests))
