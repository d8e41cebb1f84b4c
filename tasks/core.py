"""The contracts every task suite honours: tasks, test reports, recorded API calls, environments.

`loop/` and `evaluate.py` see suites only through these names (DESIGN.md section 4). A suite's
`Environment` is the bridge handler of one sandbox: agent code reaches the suite's world only
through `apis.<app>.<api>(...)`, and every such call is recorded as an `ApiCall`.

The reward and the evaluation report come from the same `TestReport` (STYLE.md habit 7):
`reward` is the fraction of tests passed, `success` is whether all passed. A suite whose reward
is computed by someone else (an OpenEnv server's grader) reports it with `TestReport.external`:
the given scalar reward and success, with any per-test detail it has; `loop/` reads `reward` and
`success` the same way for both kinds.

The leave-one-out baseline compares the K rollouts of a task, so they must start from the same
state. After `reset`, an environment states a fingerprint of the state it started from
(`Environment.start_fingerprint`, None where it cannot tell); collection checks that the
rollouts of a task share it (loop/rollout/collect.py).

What `train.reward: acted` needs is the suite's to say, from the state, never from API names:
its grader marks the collateral test (`TestResult.collateral`, it passes for an agent that
does nothing) and reports whether the final state differs from the initial one at all
(`TestReport.state_changed`); a suite that does both sets `TaskSuite.marks_collateral`.
`ApiCall.read_only` is the suite's declaration that an API only reads, for the record and the
behaviour metrics; no reward reads it.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

SPLITS: tuple[str, ...] = ("train", "dev", "test_normal", "test_challenge")

# The task every suite's worked example solves (`TaskSuite.example_messages`); the agent's
# prompt (loop/rollout/prompt.py) states it before the example's turns.
EXAMPLE_TASK = "What is the email address of my manager?"


def format_assistant(thought: str, code: str) -> str:
    """An assistant message in the shape the agent is asked to write: a thought, one block."""
    return f"{thought}\n```python\n{code}\n```"


def format_observation(output: str) -> str:
    """A user message carrying a cell's output."""
    return f"Output:\n```\n{output}\n```"


def task_context(
    now: dt.datetime, name: str, email: str, phone_number: str, instruction: str
) -> str:
    """The first user message of an episode (`Environment.areset`): who the supervisor is,
    today's date and the task, as AppWorld words it (both suites share it)."""
    return (
        f"Today is {now:%A, %Y-%m-%d} and the time is {now:%H:%M}.\n"
        f"My name is {name}. My personal email is {email} and my phone number is "
        f"{phone_number}.\n"
        f"Task: {instruction}"
    )


@dataclass(frozen=True)
class Task:
    """One task instance: variant `variant` of scenario `scenario_id`.

    Holds no ground truth, so it can be logged and shown to anyone.
    """

    id: str  # "<scenario_id>_<variant>"
    scenario_id: str
    variant: int
    difficulty: int  # 1 (one app, a few calls) .. 3 (several apps, long interaction)
    instruction: str
    apps: tuple[str, ...]  # the user apps the task needs (supervisor and api_docs not listed)
    split: str


@dataclass(frozen=True)
class TestResult:
    """The outcome of one state-based test: what was required, and on failure what differed."""

    __test__ = False  # not a pytest class

    name: str
    requirement: str
    passed: bool
    message: str = ""  # empty when passed
    # True for a test that checks nothing else changed: it passes for an agent that does
    # nothing, so `reward: acted` counts it only once the agent acted (loop/algo/credit.py)
    collateral: bool = False


@dataclass(frozen=True)
class TestReport:
    """All tests of one task on one final state; the single source of reward and success.

    Our graders give tests and the reward follows from them. An external grader gives the
    reward and success itself (`external`); its tests, if any, are detail for the record.
    """

    __test__ = False

    task_id: str
    tests: tuple[TestResult, ...]
    # Whether the final state of the apps' data differs from the task's initial state (a
    # change undone is none; logging in or answering changes no data); None where the suite
    # cannot tell. With the tests, what `reward: acted` reads (loop/algo/credit.py).
    state_changed: bool | None = None
    external_reward: float | None = None  # a reward computed by someone else (see `external`)
    external_success: bool | None = None  # ... and its success; both or neither

    def __post_init__(self) -> None:
        if (self.external_reward is None) != (self.external_success is None):
            raise ValueError(
                f"task {self.task_id}: an external reward and an external success come together"
            )
        if self.external_reward is not None and not math.isfinite(self.external_reward):
            raise ValueError(f"task {self.task_id}: external reward {self.external_reward!r}")

    @classmethod
    def external(
        cls, task_id: str, reward: float, success: bool, tests: tuple[TestResult, ...] = ()
    ) -> TestReport:
        """A report whose reward and success an external grader computed; `tests` is its
        per-test detail where it gives some (none is fine)."""
        return cls(task_id, tests, external_reward=float(reward), external_success=bool(success))

    @property
    def is_external(self) -> bool:
        """The reward was computed by someone else, not from `tests`."""
        return self.external_reward is not None

    @property
    def num_passed(self) -> int:
        return sum(t.passed for t in self.tests)

    @property
    def reward(self) -> float:
        """Fraction of tests passed, in [0, 1] (the training reward); or the external reward."""
        if self.external_reward is not None:
            return self.external_reward
        assert self.tests, f"task {self.task_id} has no tests"
        return self.num_passed / len(self.tests)

    @property
    def success(self) -> bool:
        """All tests passed (what TGC counts); or the external success."""
        if self.external_success is not None:
            return self.external_success
        return self.num_passed == len(self.tests)

    def summary(self) -> str:
        """A readable multi-line report: one line per test, with the failure message."""
        lines = [f"{self.task_id}: {self.num_passed}/{len(self.tests)} tests passed"]
        if self.is_external:
            lines = [f"{self.task_id}: reward {self.reward:g} (external), success {self.success}"]
        for t in self.tests:
            mark = "PASS" if t.passed else "FAIL"
            lines.append(f"  [{mark}] {t.name}: {t.requirement}")
            if not t.passed:
                lines.append(f"         {t.message}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible form for rollout files."""
        return {
            "task_id": self.task_id,
            "reward": self.reward,
            "success": self.success,
            "state_changed": self.state_changed,
            "external": self.is_external,
            "tests": [vars(t) for t in self.tests],
        }


@dataclass(frozen=True)
class ApiCall:
    """One call that agent code made through `apis`, as the environment saw it."""

    app: str
    api: str
    arguments: dict[str, Any]
    ok: bool
    error: str | None  # "<status>: <message>" of the error the agent saw, else None
    latency_s: float  # time spent in the environment's handler (not the bridge)
    read_only: bool = False  # the suite declares that the API only reads (no reward reads it)


MAX_RECORDED_STRING = 500  # characters of one string argument kept in an ApiCall
MAX_RECORDED_ITEMS = 50  # members of one list or object kept
MAX_RECORDED_DEPTH = 6  # nesting kept; deeper values become a short marker


def recorded_arguments(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A bounded copy of a call's arguments for `ApiCall.arguments`: still JSON values.

    Agent code controls its arguments; the host keeps every call for the whole rollout, so
    what it keeps must be small however large the arguments were. Long strings keep their head
    and say how much was cut; long lists and objects keep their first members and a marker;
    values nested deeper than MAX_RECORDED_DEPTH become "<list of N>" / "<object of N>".
    """
    return dict(_bounded(kwargs, 0))


def _bounded(value: Any, depth: int) -> Any:
    if isinstance(value, str):
        if len(value) <= MAX_RECORDED_STRING:
            return value
        cut = len(value) - MAX_RECORDED_STRING
        return f"{value[:MAX_RECORDED_STRING]}...[{cut} more characters]"
    if isinstance(value, list | dict):
        if depth >= MAX_RECORDED_DEPTH:
            kind = "list" if isinstance(value, list) else "object"
            return f"<{kind} of {len(value)}>"
        if isinstance(value, list):
            kept = [_bounded(v, depth + 1) for v in value[:MAX_RECORDED_ITEMS]]
            if len(value) > MAX_RECORDED_ITEMS:
                kept.append(f"...[{len(value) - MAX_RECORDED_ITEMS} more items]")
            return kept
        out = {}
        for i, (key, v) in enumerate(value.items()):
            if i == MAX_RECORDED_ITEMS:
                out["..."] = f"[{len(value) - MAX_RECORDED_ITEMS} more entries]"
                break
            out[_bounded(str(key), depth + 1)] = _bounded(v, depth + 1)
        return out
    return value


class SuiteSetupError(RuntimeError):
    """A suite cannot be built on this machine (missing data, venv, ...); the one-line message
    names what is missing and how to fix it."""


class EnvironmentFailureError(RuntimeError):
    """The environment itself broke (a handler bug, an inconsistent state): not the agent's fault.

    The trainer must count such a rollout as failed infrastructure and keep it out of advantages,
    never score it as 0.0 (STYLE.md habit 8).
    """


class SandboxLike(Protocol):
    """The part of `sandbox.Sandbox` an environment uses (see sandbox/ for the real one)."""

    handler_errors: list[str]

    def set_handler(self, handler: Callable[[str, str, dict[str, Any]], Any]) -> None: ...

    def execute(self, code: str, timeout: float | None = None) -> Any: ...

    def execute_async(self, code: str, timeout: float | None = None) -> Awaitable[Any]: ...


class Environment(Protocol):
    """One task instance bound to one sandbox (DESIGN.md section 4), as a rollout drives it:
    all asyncio, so a remote environment waits on the network and a local one off the event
    loop. A suite may add its own synchronous helpers (`AppTownEnv.step`); no caller of the
    contract needs them."""

    api_calls: list[ApiCall]
    last_result: Any  # the sandbox's ExecutionResult of the latest step (None before one)
    # After reset: a fingerprint of the state the episode started from (equal fingerprints:
    # equal states); None where the environment cannot tell
    start_fingerprint: str | None

    async def areset(self) -> str:
        """Fork a fresh state and return the task context for the prompt."""
        ...

    async def astep(self, code: str) -> str:
        """Run one cell of agent code and return the observation."""
        ...

    @property
    def done(self) -> bool:
        """The agent called `apis.supervisor.complete_task`."""
        ...

    async def aevaluate(self) -> TestReport:
        """Run the task's tests on the current state, off the event loop, so a slow grader
        holds up no other rollout. A grader that is slow because of the state the agent left
        (the only input that varies) is the agent's: a failed test, not an exception."""
        ...

    async def aclose(self) -> None:
        """Release what the episode holds outside the sandbox (a remote session); called once
        the rollout is over, scored or not."""
        ...


class TaskSuite(Protocol):
    """A named collection of tasks with splits, and the factory of their environments."""

    name: str
    uses_sandbox: bool  # agent code runs in our sandbox (else the suite runs it, e.g. AppWorld)
    # Its grader marks the collateral test (`TestResult.collateral`) and reports whether the
    # state changed (`TestReport.state_changed`): what `reward: acted` needs (loop.checks)
    marks_collateral: bool
    # The same cells from a task's reset give the same observations and state, every time:
    # a turn's state can be restored by replaying the episode's code into a fresh environment
    # (what DPO-MCTS's tree search needs, loop/rollout/search.py; loop.checks)
    replays_exactly: bool

    @property
    def splits(self) -> dict[str, list[Task]]: ...

    def tasks(self, split: str) -> list[Task]: ...

    def task(self, task_id: str) -> Task: ...

    def make_env(self, task: Task, sandbox: SandboxLike | None) -> Environment:
        """An environment for `task` in `sandbox` (None when `uses_sandbox` is False)."""
        ...

    def example_messages(self) -> list[dict[str, str]]:
        """The worked example of the prompt: alternating assistant (`format_assistant`) and
        user (`format_observation`) messages solving EXAMPLE_TASK with the suite's own APIs,
        ending with the assistant's `complete_task`."""
        ...


@runtime_checkable
class GoldSolutions(Protocol):
    """A suite that ships a reference solution for each task: what the warm start's gold
    demonstrations play (`warm_start.source: gold`). The built-in world has them; AppWorld's
    adapter does not."""

    def gold_solution(self, task: Task) -> list[str]:
        """The solution's code cells, in order; played as agent turns they solve `task`."""
        ...
