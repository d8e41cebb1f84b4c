"""Many rollouts at once: asyncio over a bounded sandbox pool and the generator's batching.

`collect_rollouts` runs every (task, sample) job concurrently, at most `max_concurrent` at a
time, each in a fresh sandbox from the pool (released, so destroyed, after the episode). Each
job ends as a `Trajectory` with an explicit status, and is scored by the environment's own
tests (the same code evaluate.py reports). Our failures become statuses, never exceptions that
take down the other rollouts and never a silent reward of 0.0; what the agent's own code causes
is scored (the attribution rule in `loop/rollout/trajectory.py`). Once the episode ends the sandbox
stops serving `apis`, so the state that is graded is the state the episode ended with.

The rollouts of one task must start from the same state (else their leave-one-out baseline
compares different problems): each records its environment's `start_fingerprint`, and a rollout
whose fingerprint differs from that of the task's first finished rollout in this collection is
an infrastructure failure (`start_state_mismatch`), so the survivors of a group share one start.

Every rollout of a task's group samples one policy version: `pin` is asked once per group, when
its first rollout gets a slot (the group's dispatch), and the answer goes with every turn of
every rollout of the group (`SamplingParams.version`) and on each `Trajectory.policy_version`.

A rollout that reaches `agent.rollout_timeout_s` is the agent's or ours by the time it was
charged for (loop/rollout/attribution.py): its cells, and its emitted tokens at the backend's
time per token, measured over every turn generated so far in this collection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loop.config import AgentConfig, TrainConfig
from loop.generators.base import Generator
from loop.generators.tokenizer import Tokenizer
from loop.rollout.agent import run_episode
from loop.rollout.attribution import (
    generation_points,
    timeout_status,
    token_time_bound,
    token_time_charged,
)
from loop.rollout.trajectory import Trajectory
from loop.seeds import rollout_seed
from tasks import Environment, EnvironmentFailureError, Task, TaskSuite

log = logging.getLogger(__name__)


class SandboxPool(Protocol):
    """Where rollouts get their sandboxes (`sandbox.KernelPool`; tests pass stand-ins)."""

    async def acquire_async(self) -> Any: ...

    async def release_async(self, sandbox: Any) -> None: ...


@dataclass(frozen=True)
class VersionPin:
    """The weights a group samples: the trainer's policy version (updates published), and the
    generator's name for them (None: whatever the generator serves newest, unpinned)."""

    number: int
    name: str | None = None


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: which task, which of its K samples, which seed."""

    task: Task
    sample_index: int
    seed: int


async def collect_rollouts(
    jobs: Sequence[RolloutJob],
    *,
    suite: TaskSuite,
    pool: SandboxPool,
    generator: Generator,
    tokenizer: Tokenizer,
    settings: AgentConfig,
    example: list[dict[str, str]],
    max_concurrent: int | asyncio.Semaphore,
    on_done: Callable[[Trajectory], None] | None = None,
    enough: Callable[[list[Trajectory]], bool] | None = None,
    pin: Callable[[], VersionPin] | None = None,
) -> list[Trajectory]:
    """Run the jobs; the finished rollouts come back in job order.

    `max_concurrent`: the rollouts in flight at once, or a semaphore shared with other
    collections running together (their rollouts in flight together at most its value).
    `pin` names the version a task's group samples, asked when its first rollout starts (None:
    unpinned, `policy_version` unset). `on_done` sees each rollout as it finishes. `enough`
    (the straggler cut-off) is asked after each one with all finished so far; once it says
    True, the rollouts still running are cancelled, their sandboxes released, and they are
    left out of the result.
    """
    slots = (
        max_concurrent
        if isinstance(max_concurrent, asyncio.Semaphore)
        else asyncio.Semaphore(max_concurrent)
    )
    started: list[Trajectory] = []  # every rollout begun: their turns measure the backend
    starts: dict[str, str] = {}  # task id -> the start fingerprint its first rollout reported
    pins: dict[str, VersionPin] = {}  # task id -> its group's version, from its first start

    async def run(job: RolloutJob) -> Trajectory:
        async with slots:
            version = None
            if pin is not None:
                version = pins.get(job.task.id) or pins.setdefault(job.task.id, pin())
            traj = await _rollout(
                job, suite, pool, generator, tokenizer, settings, example, started, version
            )
        check_start_state(traj, starts)
        if on_done is not None:
            on_done(traj)
        return traj

    tasks = [asyncio.ensure_future(run(job)) for job in jobs]
    finished: dict[int, Trajectory] = {}
    index: dict[asyncio.Future[Trajectory], int] = {task: i for i, task in enumerate(tasks)}
    pending: set[asyncio.Future[Trajectory]] = set(tasks)
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                finished[index[task]] = task.result()
            if enough is not None and pending and enough(list(finished.values())):
                break
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return [finished[i] for i in sorted(finished)]


def iteration_jobs(
    tasks: Sequence[Task], iteration: int, seed: int, train: TrainConfig
) -> tuple[list[RolloutJob], Callable[[list[Trajectory]], bool]]:
    """K jobs per task drawn for `iteration`, seeded by (iteration, draw, k), and the straggler
    cut-off over them (`train.rollouts_fraction` done and `min_rollouts_per_task` of every
    task). A task drawn twice is one group of 2K, with twice the minimum."""
    jobs: list[RolloutJob] = []
    occurrences: dict[str, int] = defaultdict(int)
    for g, task in enumerate(tasks):
        first = occurrences[task.id] * train.rollouts_per_task
        occurrences[task.id] += 1
        for k in range(train.rollouts_per_task):
            jobs.append(RolloutJob(task, first + k, seed=rollout_seed(seed, iteration, g, k)))
    need_total = math.ceil(len(jobs) * train.rollouts_fraction)
    need_each = {t: train.min_rollouts_per_task * n for t, n in occurrences.items()}

    def enough(done: list[Trajectory]) -> bool:
        counts: dict[str, int] = defaultdict(int)
        for traj in done:
            counts[traj.task_id] += 1
        return len(done) >= need_total and all(counts[t] >= n for t, n in need_each.items())

    return jobs, enough


def by_group(done: Sequence[Trajectory]) -> list[list[Trajectory]]:
    """Finished rollouts as their tasks' groups, in order of each group's first rollout."""
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in done:
        groups[traj.task_id].append(traj)
    return list(groups.values())


def check_start_state(traj: Trajectory, starts: dict[str, str]) -> None:
    """Mark `traj` `start_state_mismatch` when its start fingerprint differs from the first one
    seen for its task (`starts`, updated); rollouts with no fingerprint are not compared."""
    printed = traj.start_fingerprint
    if printed is None:
        return
    reference = starts.setdefault(traj.task_id, printed)
    if printed != reference and not traj.infra_failure:
        traj.status, traj.reward, traj.success = "start_state_mismatch", None, None
        traj.error = (
            f"{traj.task_id}: started from state {printed[:12]}, the task's other rollouts from "
            f"{reference[:12]}: the environment does not reset a task to one state"
        )


async def _rollout(
    job: RolloutJob,
    suite: TaskSuite,
    pool: SandboxPool,
    generator: Generator,
    tokenizer: Tokenizer,
    settings: AgentConfig,
    example: list[dict[str, str]],
    started: list[Trajectory],
    version: VersionPin | None,
) -> Trajectory:
    task = job.task
    traj = Trajectory(task.id, task.scenario_id, task.difficulty, job.sample_index)
    traj.policy_version = None if version is None else version.number
    started.append(traj)
    sandbox = None
    env = None
    try:
        if suite.uses_sandbox:  # AppWorld runs the agent's code in its own engine
            sandbox = await pool.acquire_async()
    except Exception as exc:
        traj.status, traj.error = "sandbox_crash", f"no sandbox: {type(exc).__name__}: {exc}"
        return traj
    try:
        env = suite.make_env(task, sandbox)
        episode = run_episode(
            env, task, generator, tokenizer, settings,
            example=example, sample_index=job.sample_index, seed=job.seed, trajectory=traj,
            version=None if version is None else version.name,
        )  # fmt: skip
        try:
            await asyncio.wait_for(episode, timeout=settings.rollout_timeout_s)
        except TimeoutError:
            points = generation_points(turn for other in started for turn in other.turns)
            token_time = token_time_bound(points, settings.token_time_z)
            traj.status, traj.error = timeout_status(
                traj.cell_time_s,
                settings.rollout_timeout_s,
                token_time_charged(traj.turns, token_time),
            )
            traj.api_calls = [dataclasses.asdict(c) for c in env.api_calls]
        traj.start_fingerprint = env.start_fingerprint
        if sandbox is not None:  # the episode is over: nothing the agent left running may act
            sandbox.set_handler(None)
        if not traj.infra_failure:
            await _score(traj, env)
    except Exception as exc:  # a bug below us must not take the other rollouts down
        traj.status, traj.error = "env_error", f"{type(exc).__name__}: {exc}"
    finally:
        if env is not None:
            await _close(env, traj)
        if sandbox is not None:
            await pool.release_async(sandbox)
    return traj


async def _close(env: Environment, traj: Trajectory) -> None:
    """Release the episode's remote resources; a failure to is logged, never raised (the
    rollout's score, if any, stands: grading came first)."""
    try:
        await asyncio.shield(env.aclose())  # a cancelled rollout still closes its session
    except Exception as exc:
        log.warning("%s: closing the environment failed: %s: %s", traj.task_id,
                    type(exc).__name__, exc)  # fmt: skip


async def _score(traj: Trajectory, env: Environment) -> None:
    """The environment's tests on the final state give the reward (one scoring path)."""
    try:
        report = await env.aevaluate()  # off the event loop: it holds up no other rollout
    except EnvironmentFailureError as exc:  # its engine died before grading: as during a step
        traj.status, traj.error = "env_crash", f"grading failed: {type(exc).__name__}: {exc}"
        return
    except Exception as exc:
        traj.status, traj.error = "env_error", f"grading failed: {type(exc).__name__}: {exc}"
        return
    traj.tests = [dict(vars(test)) for test in report.tests]
    traj.reward = report.reward
    traj.success = report.success
    traj.state_changed = report.state_changed
