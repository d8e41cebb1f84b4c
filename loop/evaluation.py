"""Evaluate a policy on a split: rollouts, TGC/SGC/pass@k, files for inspection.

    python evaluate.py --config configs/quickstart.yaml --split dev [--checkpoint DIR]

Writes `<run_dir>/eval/<split>/`: `config.yaml` (resolved), `rollouts.jsonl` (one trajectory per
line, appended as each finishes, so an interrupted evaluation keeps what it completed; the
trainer's rerun, or evaluate.py's with `--resume`, rolls out only the rest) and
`metrics.json`. With `eval.sampled_rollouts_per_task` K > 0 the same pass also samples K
rollouts per task at `eval.sampled_temperature` into `<run_dir>/eval/<split>@T<t>/` (metrics
`eval/sampled/*`): a greedy score can rise while the policy's sampled success does not. The
trainer's periodic evaluation calls `run_evaluations` too: one code path. evaluate.py builds the
parts (`loop.build.build_evaluation`) and hands them to `evaluate`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loop.config import AgentConfig, RunConfig
from loop.generators.base import Generator
from loop.generators.tokenizer import Tokenizer
from loop.rollout.collect import RolloutJob, SandboxPool, collect_rollouts
from loop.rollout.prompt import prompt_example
from loop.rollout.task_sampler import split_tasks
from loop.rollout.trajectory import Trajectory
from loop.run.metrics import compute_metrics
from loop.run.rundir import (
    RunDir,
    eval_rollouts_lines,
    eval_rollouts_sink,
    same_settings,
    write_config,
    write_eval_metrics,
)
from loop.seeds import eval_seed
from tasks import Task, TaskSuite

log = logging.getLogger(__name__)
# What an evaluation's rollouts depend on besides the weights: a pass resumes only where these
# config sections are as they were (a key added to another section since does not matter).
ROLLOUT_SETTINGS = ("suite", "seed", "model", "agent", "eval")


def eval_jobs(tasks: list[Task], rollouts_per_task: int, seed: int) -> list[RolloutJob]:
    """Every (task, sample) pair, with its seed (`loop.seeds.eval_seed`)."""
    return [
        RolloutJob(task, k, seed=eval_seed(seed, i, k))
        for i, task in enumerate(tasks)
        for k in range(rollouts_per_task)
    ]


def finished_rollouts(
    out_dir: Path, config: dict[str, Any], jobs: list[RolloutJob]
) -> dict[tuple[str, int], tuple[str, Trajectory]]:
    """The rollouts of `jobs` that an earlier pass with the same `ROLLOUT_SETTINGS` of the
    resolved `config` wrote to `out_dir` before it was interrupted, by (task, sample): their
    JSON line and trajectory (a line cut short by the kill is not kept); none when one of those
    settings differs there."""
    if not same_settings(out_dir, config, ROLLOUT_SETTINGS):
        return {}
    wanted = {(job.task.id, job.sample_index) for job in jobs}
    kept: dict[tuple[str, int], tuple[str, Trajectory]] = {}
    for line in eval_rollouts_lines(out_dir):
        try:
            traj = Trajectory.from_json(json.loads(line))
        except (ValueError, TypeError, KeyError):
            continue
        if (key := (traj.task_id, traj.sample_index)) in wanted:
            kept[key] = (line, traj)
    return kept


def eval_agent_settings(config: RunConfig) -> AgentConfig:
    """The agent settings evaluation runs with: `agent`, with eval.temperature and
    eval.max_turns where they are set (the paper evaluates with 50 turns, trains with 40)."""
    changes: dict[str, Any] = {}
    if config.eval.temperature is not None:
        changes["temperature"] = config.eval.temperature
    if config.eval.max_turns is not None:
        changes["max_turns"] = config.eval.max_turns
    return dataclasses.replace(config.agent, **changes)


def sampled_label(split: str, temperature: float) -> str:
    """The name a split's sampled pass is written and plotted under: `<split>@T<temperature>`."""
    return f"{split}@T{temperature:g}"


def evaluation_passes(config: RunConfig, split: str) -> list[tuple[str, RunConfig]]:
    """(label, config) of each pass over `split`: the configured one, labelled by the split,
    and with eval.sampled_rollouts_per_task K > 0 a second one of K rollouts per task at
    eval.sampled_temperature (`sampled_label`), so that a greedy score's rise can be told from
    the policy's."""
    passes = [(split, config)]
    settings = config.eval
    if settings.sampled_rollouts_per_task:
        sampled = dataclasses.replace(
            settings,
            temperature=settings.sampled_temperature,
            rollouts_per_task=settings.sampled_rollouts_per_task,
        )
        label = sampled_label(split, settings.sampled_temperature)
        passes.append((label, dataclasses.replace(config, eval=sampled)))
    return passes


async def run_evaluations(
    config: RunConfig,
    *,
    suite: TaskSuite,
    pool: SandboxPool,
    generator: Generator,
    tokenizer: Tokenizer,
    out_dir: Callable[[str], Path],
    show_progress: bool = True,
    split: str | None = None,
    resume: bool = False,
) -> dict[str, float]:
    """Every pass of `evaluation_passes` over `split` (default: eval.split) at once, their
    rollouts decoding together, at most `eval.max_concurrent_rollouts` in flight for all of
    them (a rollout in flight holds its keys and values between turns: more than the
    generator's rows only wait), each written under `out_dir(label)`: the metrics of the
    first (`eval/*`) and of the sampled one (`eval/sampled/*`); `resume`: as `run_evaluation`'s."""
    split = split or config.eval.split
    passes = evaluation_passes(config, split)
    in_flight = asyncio.Semaphore(config.eval.max_concurrent_rollouts)
    results = await asyncio.gather(*(
        run_evaluation(
            settings, suite=suite, pool=pool, generator=generator, tokenizer=tokenizer,
            out_dir=out_dir(label), show_progress=show_progress, split=split, label=label,
            in_flight=in_flight, resume=resume,
        )
        for label, settings in passes
    ))  # fmt: skip
    metrics = dict(results[0])
    for scores in results[1:]:
        metrics |= {"eval/sampled/" + k.removeprefix("eval/"): v for k, v in scores.items()}
    return metrics


async def run_evaluation(
    config: RunConfig,
    *,
    suite: TaskSuite,
    pool: SandboxPool,
    generator: Generator,
    tokenizer: Tokenizer,
    out_dir: Path,
    show_progress: bool = True,
    split: str | None = None,
    label: str | None = None,
    in_flight: asyncio.Semaphore | None = None,
    resume: bool = False,
) -> dict[str, float]:
    """Roll out `split` (default: eval.split), write rollouts and metrics under `out_dir`,
    return the metrics (`label` names the progress bar; default: the split; `in_flight`: a
    bound on rollouts in flight shared with other passes, else `eval.max_concurrent_rollouts`
    of this pass's). With `resume` (the caller knows the policy is the one that wrote
    `out_dir`), the rollouts an interrupted pass of the same config finished are kept, not
    rolled out again."""
    split = split or config.eval.split
    tasks = split_tasks(suite, split, config.eval.max_difficulty, "eval.split")
    if config.eval.limit is not None:
        tasks = tasks[: config.eval.limit]
    jobs = eval_jobs(tasks, config.eval.rollouts_per_task, config.seed)
    settings = eval_agent_settings(config)
    written = dataclasses.replace(config, eval=dataclasses.replace(config.eval, split=split))
    resolved = written.to_dict()
    kept = finished_rollouts(out_dir, resolved, jobs) if resume else {}
    if kept:
        log.info("%s: %d of %d rollouts kept from an interrupted evaluation",
                 out_dir, len(kept), len(jobs))  # fmt: skip
    write_config(out_dir, resolved)
    progress = tqdm(
        total=len(jobs),
        initial=len(kept),
        desc=f"eval {label or split}",
        unit="rollout",
        disable=not show_progress,
        file=sys.stderr,
    )
    solved = sum(bool(traj.success) for _, traj in kept.values())
    jobs = [job for job in jobs if (job.task.id, job.sample_index) not in kept]
    with eval_rollouts_sink(out_dir, kept=[line for line, _ in kept.values()]) as sink:

        def record(traj: Trajectory) -> None:
            nonlocal solved
            sink.write(json.dumps(traj.to_json()) + "\n")
            sink.flush()
            solved += bool(traj.success)
            progress.update(1)
            progress.set_postfix(solved=f"{solved}/{progress.n}", last=traj.status)

        trajectories = await collect_rollouts(
            jobs, suite=suite, pool=pool, generator=generator, tokenizer=tokenizer,
            settings=settings, example=prompt_example(suite, config.agent.worked_example),
            max_concurrent=in_flight or config.eval.max_concurrent_rollouts, on_done=record,
        )  # fmt: skip
    progress.close()
    metrics = compute_metrics([*(traj for _, traj in kept.values()), *trajectories])
    write_eval_metrics(out_dir, metrics)
    return metrics


def evaluate(
    config: RunConfig,
    *,
    suite: TaskSuite,
    generator: Generator,
    tokenizer: Tokenizer,
    pool: contextlib.AbstractContextManager[SandboxPool],
    resume: bool = False,
) -> dict[str, float]:
    """Evaluate `eval.split` (and its sampled pass, when configured) with the built parts (the
    pool is entered and closed here, the generator closed), print a summary table; returns the
    metrics. `resume`: keep what an interrupted evaluation of the same policy finished."""
    started = time.monotonic()
    run = RunDir(config.run_dir)

    async def main() -> dict[str, float]:
        try:
            with pool as entered:
                return await run_evaluations(
                    config, suite=suite, pool=entered, generator=generator,
                    tokenizer=tokenizer, out_dir=run.eval_dir, resume=resume,
                )  # fmt: skip
        finally:
            await generator.close()

    metrics = asyncio.run(main())
    print(summary_table(metrics, title=f"{config.name}: {config.eval.split}"))
    passes = evaluation_passes(config, config.eval.split)
    folders = [str(run.eval_dir(label)) for label, _ in passes]
    print(f"rollouts and metrics in {', '.join(folders)} ({time.monotonic() - started:.0f} s)")
    return metrics


def summary_table(metrics: dict[str, float], title: str) -> str:
    """The metrics as an aligned two-column table."""
    width = max(len(key) for key in metrics)
    lines = [title, "-" * (width + 12)]
    for key, value in metrics.items():
        counted = key.endswith(("/tasks", "/rollouts", "/infra_failures")) or "/status/" in key
        lines.append(f"{key:<{width}}  {int(value) if counted else f'{value:.3f}'}")
    return "\n".join(lines)
