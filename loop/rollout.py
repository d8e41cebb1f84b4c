"""Many rollouts at once: asyncio over a bounded sandbox pool and the generator's batching.

`collect_rollouts` runs every (task, sample) job concurrently, at most `max_concurrent` at a
time, each in a fresh sandbox from the pool (released, so destroyed, after the episode). Each
job ends as a `Trajectory` with an explicit status, and is scored by the environment's own
tests (the same code evaluate.py reports). Our failures become statuses, never exceptions that
take down the other rollouts and never a silent reward of 0.0.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from loop.agent import run_episode
from loop.config import AgentConfig
from loop.generators.base import Generator
from loop.trajectory import Trajectory


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: which task, which of its K samples, which seed."""

    task: Any
    sample_index: int
    seed: int


async def collect_rollouts(
    jobs: Sequence[RolloutJob],
    *,
    suite: Any,
    pool: Any,
    generator: Generator,
    tokenizer: Any,
    settings: AgentConfig,
    example: list[dict[str, str]],
    max_concurrent: int,
    on_done: Callable[[Trajectory], None] | None = None,
) -> list[Trajectory]:
    """Run every job; results come back in job order. `on_done` sees each as it finishes."""
    slots = asyncio.Semaphore(max_concurrent)

    async def run(job: RolloutJob) -> Trajectory:
        async with slots:
            traj = await _rollout(job, suite, pool, generator, tokenizer, settings, example)
        if on_done is not None:
            on_done(traj)
        return traj

    return list(await asyncio.gather(*(run(job) for job in jobs)))


async def _rollout(
    job: RolloutJob,
    suite: Any,
    pool: Any,
    generator: Generator,
    tokenizer: Any,
    settings: AgentConfig,
    example: list[dict[str, str]],
) -> Trajectory:
    task = job.task
    traj = Trajectory(task.id, task.scenario_id, task.difficulty, job.sample_index)
    try:
        sandbox = await pool.acquire_async()
    except Exception as exc:
        traj.status, traj.error = "sandbox_crash", f"no sandbox: {type(exc).__name__}: {exc}"
        return traj
    try:
        env = suite.make_env(task, sandbox)
        episode = run_episode(
            env, task, generator, tokenizer, settings,
            example=example, sample_index=job.sample_index, seed=job.seed, trajectory=traj,
        )  # fmt: skip
        try:
            await asyncio.wait_for(episode, timeout=settings.rollout_timeout_s)
        except TimeoutError:
            traj.status = "timeout"
            traj.error = f"rollout exceeded {settings.rollout_timeout_s:g} s"
        if not traj.infra_failure:
            _score(traj, env)
    except Exception as exc:  # a bug below us must not take the other rollouts down
        traj.status, traj.error = "env_error", f"{type(exc).__name__}: {exc}"
    finally:
        await pool.release_async(sandbox)
    return traj


def _score(traj: Trajectory, env: Any) -> None:
    """The environment's tests on the final state give the reward (one scoring path)."""
    try:
        report = env.evaluate()
    except Exception as exc:
        traj.status, traj.error = "env_error", f"grading failed: {type(exc).__name__}: {exc}"
        return
    traj.tests = [dict(vars(test)) for test in report.tests]
    traj.reward = report.reward
    traj.success = report.success
