"""AppTown through the real sandbox: every gold solution passes and every wrong one fails, and
the environment's reset/step/done/evaluate/api_calls behave as DESIGN.md section 4 says.

Starts real kernels (one KernelPool for the module); about a minute or two on 2 CPUs.
Run: python -m pytest tests/tasks/test_apptown_sandbox.py -q
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

from sandbox import ExecutionResult, KernelPool
from tasks import SPLITS, EnvironmentFailureError, Task, TestReport
from tasks.apptown import AppTownSuite
from tasks.apptown.env import AppTownEnv, format_observation

CONCURRENCY = 4


@pytest.fixture(scope="module")
def pool() -> Iterator[KernelPool]:
    with KernelPool(size=CONCURRENCY, timeout_s=30) as kernels:
        yield kernels


async def _rollout(
    pool: KernelPool, suite: AppTownSuite, task: Task, cells: list[str]
) -> tuple[TestReport, list[str], AppTownEnv]:
    sandbox = await pool.acquire_async()
    try:
        env = suite.make_env(task, sandbox)
        env.reset()
        observations = [await env.astep(cell) for cell in cells]
        return env.evaluate(), observations, env
    finally:
        await pool.release_async(sandbox)


@pytest.mark.slow  # runs by default; about two minutes of kernel starts on 2 CPUs
async def test_every_gold_passes_and_every_wrong_fails(
    pool: KernelPool, suite: AppTownSuite
) -> None:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def check(task: Task, kind: str) -> str | None:
        cells = suite.gold_solution(task) if kind == "gold" else suite.wrong_solution(task)
        async with gate:
            report, observations, _ = await _rollout(pool, suite, task, cells)
        if kind == "gold" and not report.success:
            return f"gold: {report.summary()}\n{observations}"
        if kind == "wrong" and report.success:
            return f"the wrong solution of {task.id} passes"
        return None

    tasks = [t for split in SPLITS for t in suite.tasks(split)]
    problems = await asyncio.gather(*(check(t, k) for t in tasks for k in ("gold", "wrong")))
    assert not [p for p in problems if p], "\n".join(p for p in problems if p)


async def test_context_observations_calls_and_done(pool: KernelPool, suite: AppTownSuite) -> None:
    task = suite.task("payments_balance_1")
    user = suite.user_of(task)
    sandbox = await pool.acquire_async()
    try:
        env = suite.make_env(task, sandbox)
        context = env.reset()
        for part in (user.name, user.email, user.phone_number, "2024-05-15", task.instruction):
            assert part in context
        observation = await env.astep("apis.payments.show_balance()")
        assert observation.startswith("Execution failed.")
        assert "401: You are not logged in to payments" in observation
        assert env.step("x = 1") == "Execution successful."
        assert not env.done
        for cell in suite.gold_solution(task):
            env.step(cell)
        assert env.done and env.evaluate().success
        first = env.api_calls[0]
        assert (first.app, first.api, first.ok) == ("payments", "show_balance", False)
        assert first.error is not None and first.error.startswith("401: ")
        assert env.api_calls[-1].api == "complete_task" and env.api_calls[-1].ok
        assert all(0 <= c.latency_s < 0.1 for c in env.api_calls)
    finally:
        await pool.release_async(sandbox)


async def test_a_handler_bug_is_an_environment_failure(
    pool: KernelPool, suite: AppTownSuite
) -> None:
    task = suite.task("payments_balance_1")
    sandbox = await pool.acquire_async()
    try:
        env = suite.make_env(task, sandbox)
        env.reset()

        def broken(app: str, api: str, kwargs: dict[str, Any]) -> Any:
            raise RuntimeError("bug in the app")

        env.server.call = broken  # type: ignore[method-assign]
        await env.astep("apis.supervisor.show_profile()")
        assert env.api_calls[-1].error == "internal error: RuntimeError: bug in the app"
        with pytest.raises(EnvironmentFailureError, match="bug in the app"):
            env.evaluate()
    finally:
        await pool.release_async(sandbox)


def test_observation_says_when_a_cell_timed_out_or_the_kernel_crashed() -> None:
    def result(**kw: Any) -> ExecutionResult:
        base = {
            "output": "",
            "error": None,
            "timed_out": False,
            "crashed": False,
            "duration_s": 0.1,
        }
        return ExecutionResult(**{**base, **kw})

    assert format_observation(result(output="42\n")) == "42"
    assert format_observation(result()) == "Execution successful."
    assert "time limit" in format_observation(result(timed_out=True, error="TimeoutError: x"))
    assert "crashed" in format_observation(result(crashed=True, error="KernelDied: x"))
    failed = format_observation(result(output="Traceback ...", error="KeyError: 'a'"))
    assert failed == "Execution failed.\nTraceback ..."


def test_an_episode_past_its_call_budget_gets_429_and_the_record_stays_bounded(
    suite: AppTownSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tasks.apptown.env as apptown_env
    from sandbox import ApiError

    class NoKernel:
        def __init__(self) -> None:
            self.handler_errors: list[str] = []

        def set_handler(self, handler: Any) -> None:
            pass

    monkeypatch.setattr(apptown_env, "MAX_CALLS", 3)
    env = suite.make_env(suite.task("payments_balance_1"), NoKernel())  # type: ignore[arg-type]
    env.reset()
    for _ in range(3):
        env.handle("supervisor", "show_profile", {})
    with pytest.raises(ApiError, match="429: this episode has made its 3 API calls"):
        env.handle("supervisor", "show_profile", {})
    assert len(env.api_calls) == 3
