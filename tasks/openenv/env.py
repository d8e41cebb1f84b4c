"""`OpenEnvEnv`: one rollout's episode in a remote OpenEnv environment, behind our contract.

One WebSocket session per rollout (OpenEnv's `GenericEnvClient`): `areset` opens it and resets
to the task (`task_id`, or `seed` for suites of seeds), `astep` sends one cell as the action's
code field and returns the observation's text, `aevaluate` ends the episode (a `submit` step
where the server takes one and the episode is still open) and returns the environment's reward
as `TestReport.external`, with the per-test detail of the server's report where it sends one,
and `aclose` ends the session. The reward is the server's report's when it sends one, else the
sum of the rewards of the episode's steps.

Whose failure: the agent's cell, its errors and time-outs, arrive as observations and are the
agent's. Ours, and excluded: a session that cannot be opened or is lost, a message that times
out, an error message from the server, an episode that ends with no reward at all; each raises
`EnvironmentFailureError` with one line naming it (loop/ makes it `env_crash`). So is a
malformed field: a reward that is not a finite number, `api_calls` that are not a list of calls,
a report without a list of tests; the line names the field. A cell longer than the server takes
is the agent's: it is answered here, as an observation, never sent.

What the server sends is untrusted. Its reset text and observations are cut to
`max_text_chars` with a notice, before anything tokenises them (loop/ then tokenises them with
special tokens split, so a server cannot forge chat turns). Success is derived from the reward:
`reward >= success_reward`, and not where the server's report denies it; a server that claims
success with a lower reward does not get it.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from sandbox import ExecutionResult
from tasks.core import (
    ApiCall,
    EnvironmentFailureError,
    SuiteSetupError,
    Task,
    TestReport,
    TestResult,
)


@dataclass(frozen=True)
class WireSpec:
    """How to speak to one OpenEnv server (read from its schema by the suite)."""

    url: str
    code_field: str = "code"  # the action field that carries the cell
    observation_field: str = "text"  # the observation field the agent sees (else all of it)
    submit_field: str | None = "submit"  # a bool field that ends the episode; None: none
    max_code_chars: int | None = None  # the schema's maxLength of the code field
    success_reward: float = 1.0  # success = reward >= this (and the server not denying it)
    max_text_chars: int = 100_000  # a reset text or observation is cut past this, with a notice
    connect_timeout_s: float = 30.0
    message_timeout_s: float = 300.0  # a reset waits for a sandbox, a step for its cell
    max_message_mb: float = 16.0
    token: str | None = field(default=None, repr=False)  # sent as a bearer token, if set

    def __post_init__(self) -> None:
        if self.max_text_chars < 1:
            raise SuiteSetupError(f"openenv.max_text_chars must be >= 1: {self.max_text_chars}")

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request carries (the bearer token, where there is one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


@dataclass
class OpenEnvEnv:
    """areset -> astep ... -> aevaluate over one OpenEnv session (see the module docstring)."""

    task: Task
    spec: WireSpec
    reset_args: dict[str, Any]  # {"task_id": ...} or {"seed": ...}
    api_calls: list[ApiCall] = field(default_factory=list)
    last_result: Any = None
    start_fingerprint: str | None = None
    done: bool = False
    _client: Any = None
    _rewards: list[float] = field(default_factory=list)
    _report: dict[str, Any] | None = None

    async def areset(self) -> str:
        """Open the session and reset it to the task; the task context for the prompt."""
        from openenv.core.generic_client import GenericEnvClient

        await self.aclose()
        self.api_calls, self.last_result, self.done = [], None, False
        self._rewards, self._report = [], None
        spec = self.spec
        self._client = GenericEnvClient(
            base_url=spec.url, connect_timeout_s=spec.connect_timeout_s,
            message_timeout_s=spec.message_timeout_s, max_message_size_mb=spec.max_message_mb,
            headers=spec.headers or None,
        )  # fmt: skip
        result = await self._call("reset", self._client.reset(**self.reset_args))
        observation = self._observation(result)
        text = self._text(observation)
        printed = observation.get("start_fingerprint")
        if printed is not None and not isinstance(printed, str):
            raise self._malformed("start_fingerprint", printed, "a string")
        self.start_fingerprint = printed or hashlib.sha256(text.encode()).hexdigest()
        self._take(result)
        return text

    async def astep(self, code: str) -> str:
        """Send one cell; the observation's text."""
        limit = self.spec.max_code_chars
        if limit is not None and len(code) > limit:  # the agent's: answered, never sent
            text = f"Execution failed: the cell has {len(code)} characters; at most {limit}."
            self.last_result = ExecutionResult(text, "CellTooLong", False, False, 0.0)
            return text
        if self.done:
            raise EnvironmentFailureError(f"{self.task.id}: a step after the episode ended")
        started = time.monotonic()
        result = await self._call("step", self._client.step({self.spec.code_field: code}))
        observation = self._observation(result)
        text = self._text(observation)
        error, duration = observation.get("error"), observation.get("duration_s")
        if error is not None and not isinstance(error, str):
            raise self._malformed("error", error, "a string or null")
        if duration is not None:
            duration = self._reward(duration, "duration_s")
        self.last_result = ExecutionResult(
            text, error, bool(observation.get("timed_out", False)),
            bool(observation.get("crashed", False)),
            time.monotonic() - started if duration is None else duration,
        )  # fmt: skip
        self.api_calls += self._api_calls(observation.get("api_calls"))
        self._take(result)
        return text

    async def aevaluate(self) -> TestReport:
        """End the episode (submit, where it is open and the server takes it); the reward."""
        if not self.done and self.spec.submit_field is not None and self._client is not None:
            result = await self._call("submit", self._client.step({self.spec.submit_field: True}))
            self._take(result)
        report = self._report
        if report is not None and "reward" in report:
            reward = self._reward(report["reward"], "report.reward")
            claimed = report.get("success", True)
            if not isinstance(claimed, bool):
                raise self._malformed("report.success", claimed, "a bool")
            # Success follows the reward: a server's `success: true` with a reward under the
            # threshold is not one (it would be a success the advantages never saw as such).
            success = claimed and reward >= self.spec.success_reward
            return TestReport.external(self.task.id, reward, success, self._tests(report))
        if not self._rewards:
            raise EnvironmentFailureError(f"{self.task.id}: the environment gave no reward")
        reward = sum(self._rewards)
        return TestReport.external(self.task.id, reward, reward >= self.spec.success_reward)

    async def aclose(self) -> None:
        """End the session (the server gives its sandbox back)."""
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.close()
            except Exception:  # the session is gone either way
                return

    # -- internals ----------------------------------------------------------------------------

    async def _call(self, what: str, request: Any) -> Any:
        """Await a client call; our failures as one-line EnvironmentFailureError."""
        try:
            return await request
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise EnvironmentFailureError(
                f"{self.task.id}: OpenEnv {what} failed: {type(exc).__name__}: {first}"
            ) from exc

    def _observation(self, result: Any) -> dict[str, Any]:
        """A result's observation, which must be an object."""
        if not isinstance(result.observation, dict):
            raise self._malformed("observation", result.observation, "an object")
        return result.observation

    def _take(self, result: Any) -> None:
        """Record a result's reward, end and report."""
        if result.reward is not None:
            self._rewards.append(self._reward(result.reward, "reward"))
        self.done = self.done or bool(result.done)
        report = self._observation(result).get("report")
        if report is not None and not isinstance(report, dict):
            raise self._malformed("report", report, "an object")
        if report is not None:
            self._report = report

    def _text(self, observation: dict[str, Any]) -> str:
        """What the agent sees: the observation field, else the whole observation as JSON;
        cut to `max_text_chars` with a notice (the sandbox's output cut reads the same)."""
        value = observation.get(self.spec.observation_field)
        if not isinstance(value, str):
            shown = {k: v for k, v in observation.items() if k not in ("metadata", "report")}
            value = json.dumps(shown, sort_keys=True, default=str)
        limit = self.spec.max_text_chars
        if len(value) <= limit:
            return value
        return f"{value[:limit]}\n[text truncated: {len(value) - limit} more characters not shown]"

    def _reward(self, value: Any, name: str) -> float:
        """A reward (or other number) field as a float; anything but a finite number is the
        server's fault."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self._malformed(name, value, "a number")
        if not math.isfinite(value):
            raise self._malformed(name, value, "a finite number")
        return float(value)

    def _api_calls(self, calls: Any) -> list[ApiCall]:
        """The step's `api_calls` (absent: none); a malformed one is the server's fault."""
        if calls is None:
            return []
        if not isinstance(calls, list):
            raise self._malformed("api_calls", calls, "a list of calls")
        try:
            parsed = [ApiCall(**call) for call in calls]
        except TypeError:  # not a dict, or not ApiCall's fields
            raise self._malformed("api_calls", calls, "a list of calls") from None
        for call in parsed:
            names = isinstance(call.app, str) and isinstance(call.api, str)
            if not (names and isinstance(call.arguments, dict) and isinstance(call.ok, bool)):
                raise self._malformed("api_calls", calls, "a list of calls")
        return parsed

    def _tests(self, report: dict[str, Any]) -> tuple[TestResult, ...]:
        """The report's per-test detail (absent: none)."""
        tests = report.get("tests", [])
        try:
            if not isinstance(tests, list):
                raise TypeError
            return tuple(TestResult(**t) for t in tests)
        except TypeError:
            raise self._malformed("report.tests", tests, "a list of tests") from None

    def _malformed(self, name: str, value: Any, wanted: str) -> EnvironmentFailureError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return EnvironmentFailureError(
            f"{self.task.id}: the OpenEnv server sent a malformed {name} ({wanted} expected): "
            f"{shown}"
        )
