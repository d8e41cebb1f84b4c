"""Any `TaskSuite` as an OpenEnv environment: `build_app(suite, pool, ...)` is the ASGI app.

A WebSocket session is one OpenEnv environment instance (`SuiteEnvironment`) and, while an
episode runs, one sandbox from our `KernelPool`, taken at `reset` and given back (destroyed) at
the next reset or when the session ends: on `close`, on a dropped connection, and, for any
still open, when the server exits (the pool destroys every sandbox). At most `max_sessions`
sessions are open at once; one more is refused with OpenEnv's CAPACITY_REACHED error.

reset: `task_id` picks a task of the suite, `seed` the task `seed % n` of the served split,
neither the next task of the split in turn. step: `code` runs one cell; the episode ends when
the agent calls `complete_task`, sends `submit: true`, or takes `max_steps` steps, and the last
observation carries the reward and the report of the suite's own grader, run here on the final
state (the same `aevaluate` as a local rollout). Nothing of the grader or the state reaches the
client or the kernel. A bad request (unknown task, a step before reset or after the end, an
argument we do not take, a cell over MAX_CODE_CHARS) is an error message naming the cause; a
message over `max_message_bytes` closes its session, and nothing else is affected.

Two routes of our own sit beside OpenEnv's: `GET /loop/example` (the suite's worked example,
which the import side puts in the prompt) and `GET /loop/status` (sessions and sandboxes now).

Idle sessions end (tasks/openenv/guard.py): a WebSocket whose client is silent for
`idle_timeout_s` is closed, and a session with no connection (OpenEnv's `/mcp` sessions) is
reaped by OpenEnv's reaper once idle for `idle_timeout_s` plus the longest one message may take
(`acquire_timeout_s` + `longest_step_s`): that reaper counts a message's run time as idle, and
must never take a session mid-step. With `token`, every request but `GET /health` needs
`Authorization: Bearer <token>`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import threading
from typing import Any

from fastapi import FastAPI
from openenv.core.env_server.http_server import create_fastapi_app
from openenv.core.env_server.interfaces import Environment as OpenEnvEnvironment
from openenv.core.env_server.types import ConcurrencyConfig

from sandbox import KernelPool
from tasks.core import Environment, Task, TaskSuite
from tasks.openenv.guard import SessionGuard
from tasks.openenv.wire import MAX_CODE_CHARS, CellAction, CellObservation, SuiteState

MAX_STEPS = 50  # the paper's turn limit in evaluation; the client's limit usually comes first
ACQUIRE_TIMEOUT_S = 300.0  # how long a reset waits for a sandbox before failing
IDLE_TIMEOUT_S = 300.0  # a session whose client is silent this long ends
LONGEST_STEP_S = 90.0  # one step at most: a cell (30 s by default) and the grading after it
RESET_ARGUMENTS = frozenset({"task_id", "split"})


@dataclasses.dataclass
class SuiteHost:
    """What every session of one server shares: the suite, the sandboxes, the limits."""

    suite: TaskSuite
    pool: KernelPool | None  # None when the suite runs the agent's code itself
    split: str
    max_steps: int = MAX_STEPS
    acquire_timeout_s: float = ACQUIRE_TIMEOUT_S
    turn: itertools.count = dataclasses.field(default_factory=itertools.count)
    leased: int = 0  # sandboxes held by sessions now
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def next_task(self, seed: int | None) -> Task:
        """The task `seed % n` of the served split, or the next in turn without a seed."""
        tasks = self.suite.tasks(self.split)
        if not tasks:
            raise ValueError(f"split {self.split!r} of suite {self.suite.name} has no tasks")
        index = next(self.turn) if seed is None else seed
        return tasks[index % len(tasks)]


class SuiteEnvironment(OpenEnvEnvironment[CellAction, CellObservation, SuiteState]):
    """One session: at most one episode at a time, in its own sandbox."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session holds its own sandbox and state

    def __init__(self, host: SuiteHost):
        super().__init__()
        self.host = host
        self.env: Environment | None = None
        self.task_id = ""  # the task of the episode `env` runs
        self.sandbox: Any = None
        self.steps = 0
        self.finished = False
        self._state = SuiteState()

    # -- OpenEnv's environment API ----------------------------------------------------------

    def reset(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> CellObservation:
        """Start an episode of `task_id` (or of the task for `seed`) in a fresh sandbox."""
        unknown = sorted(set(kwargs) - RESET_ARGUMENTS)
        if unknown:
            raise ValueError(f"reset takes task_id, split or seed, not {unknown[0]!r}")
        suite = self.host.suite
        if kwargs.get("split") not in (None, self.host.split):
            self._tasks(kwargs["split"])  # raises, naming the split served
        task_id = kwargs.get("task_id")
        try:
            task = suite.task(task_id) if task_id is not None else self.host.next_task(seed)
        except KeyError as exc:
            raise ValueError(exc.args[0] if exc.args else f"no task {task_id!r}") from None
        self._release()
        if suite.uses_sandbox:
            assert self.host.pool is not None, f"suite {suite.name} needs a sandbox pool"
            self.sandbox = self.host.pool.acquire(timeout=self.host.acquire_timeout_s)
            with self.host.lock:
                self.host.leased += 1
        self.env, self.task_id = suite.make_env(task, self.sandbox), task.id
        context = asyncio.run(self.env.areset())  # its own loop: this is a session thread
        self.steps, self.finished = 0, False
        self._state = SuiteState(episode_id=episode_id, task_id=task.id)
        return CellObservation(
            text=context, task_id=task.id, start_fingerprint=self.env.start_fingerprint
        )

    def step(
        self, action: CellAction, timeout_s: float | None = None, **kwargs: Any
    ) -> CellObservation:
        """Run one cell (or grade, on `submit`); the last step carries reward and report."""
        env = self.env
        if env is None:
            raise ValueError("no episode: send reset first")
        if self.finished:
            raise ValueError("the episode is over: send reset to start another")
        if action.submit:
            return self._finish(CellObservation(task_id=self.task_id))
        if len(action.code) > MAX_CODE_CHARS:
            raise ValueError(
                f"the cell has {len(action.code)} characters, more than the {MAX_CODE_CHARS} "
                "a step takes"
            )
        calls_before = len(env.api_calls)
        observation = asyncio.run(env.astep(action.code))
        self.steps += 1
        self._state.step_count = self.steps
        out = CellObservation(
            text=observation, task_id=self.task_id,
            api_calls=[dataclasses.asdict(c) for c in env.api_calls[calls_before:]],
        )  # fmt: skip
        result = env.last_result  # a sandbox.ExecutionResult
        if result is not None:
            out.error, out.timed_out = result.error, result.timed_out
            out.crashed, out.duration_s = result.crashed, result.duration_s
        if env.done or self.steps >= self.host.max_steps:
            return self._finish(out)
        return out

    @property
    def state(self) -> SuiteState:
        return self._state

    def close(self) -> None:
        """The session ended (close, a dropped connection, server exit): give the sandbox back."""
        self._release()

    # -- OpenEnv's task API (GET /{name}/splits, POST /{name}/tasks ...) ---------------------

    def list_splits(self) -> list[str]:
        return [self.host.split]

    def list_tasks(self, split: str) -> list[dict[str, Any]]:
        return [_task_spec(t) for t in self._tasks(split)]

    def num_tasks(self, split: str) -> int:
        return len(self._tasks(split))

    def get_task(self, split: str, index: int) -> dict[str, Any]:
        return _task_spec(self._tasks(split)[index])

    def get_task_range(
        self, split: str, start: int | None = None, stop: int | None = None
    ) -> list[dict[str, Any]]:
        return [_task_spec(t) for t in self._tasks(split)[start:stop]]

    # -- internals ----------------------------------------------------------------------------

    def _tasks(self, split: str) -> list[Task]:
        if split != self.host.split:
            raise ValueError(f"this server serves split {self.host.split!r}, not {split!r}")
        return self.host.suite.tasks(split)

    def _finish(self, out: CellObservation) -> CellObservation:
        """Grade the final state with the suite's own grader (as a local rollout does)."""
        assert self.env is not None
        self.finished = True
        self._state.done = True
        if self.sandbox is not None:  # nothing the agent left running may act any more
            self.sandbox.set_handler(None)
        report = asyncio.run(self.env.aevaluate())  # its own loop: this is a session thread
        out.done, out.reward, out.report = True, report.reward, report.to_dict()
        return out

    def _release(self) -> None:
        sandbox, self.sandbox, self.env = self.sandbox, None, None
        if sandbox is not None and self.host.pool is not None:
            self.host.pool.release(sandbox)
            with self.host.lock:
                self.host.leased -= 1


def _task_spec(task: Task) -> dict[str, Any]:
    """A task as the task API lists it (a `Task` holds no ground truth)."""
    return dataclasses.asdict(task)


def build_app(
    suite: TaskSuite,
    pool: KernelPool | None,
    *,
    split: str,
    max_sessions: int,
    max_steps: int = MAX_STEPS,
    acquire_timeout_s: float = ACQUIRE_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    longest_step_s: float = LONGEST_STEP_S,
    token: str | None = None,
) -> FastAPI:
    """The OpenEnv app serving `split` of `suite` (see the module docstring); `pool` gives the
    sessions their sandboxes and is the caller's to close when the server stops."""
    suite.tasks(split)  # an unknown split fails here, in one line, not at the first reset
    if max_sessions < 1 or max_steps < 1:
        raise ValueError(f"max_sessions and max_steps must be >= 1: {max_sessions}, {max_steps}")
    if idle_timeout_s <= 0:
        raise ValueError(f"the idle timeout must be > 0 seconds: {idle_timeout_s}")
    host = SuiteHost(suite, pool, split, max_steps, acquire_timeout_s)
    reap_after_s = idle_timeout_s + acquire_timeout_s + longest_step_s
    app = create_fastapi_app(
        functools.partial(SuiteEnvironment, host), CellAction, CellObservation,
        concurrency_config=ConcurrencyConfig(
            max_concurrent_envs=max_sessions, session_timeout=reap_after_s
        ),
        env_name=suite.name, state_cls=SuiteState,
        mode="production",  # sessions over /ws only: no stateless HTTP reset/step
    )  # fmt: skip
    app.add_middleware(SessionGuard, token=token, idle_timeout_s=idle_timeout_s)
    example = suite.example_messages()

    @app.get("/loop/example")
    def worked_example() -> list[dict[str, str]]:
        """The suite's worked example for the agent's prompt."""
        return example

    @app.get("/loop/status")
    def status() -> dict[str, int]:
        """Open sessions and the sandboxes they hold."""
        return {"sandboxes_leased": host.leased, "max_sessions": max_sessions}

    return app
