"""Evaluation metrics over finished rollouts (pure functions; no model, no I/O).

- TGC, task goal completion: the share of tasks whose tests all pass. With K rollouts per task,
  the mean over tasks of each task's success rate (the expected TGC of one rollout).
- SGC, scenario goal completion: the share of scenarios whose variants all pass, counted per
  sample index k (the k-th rollout of every variant) and averaged over k.
- pass@k: the unbiased estimator 1 - C(n-c, k) / C(n, k) per task, averaged (Chen et al. 2021).
Rollouts that failed for an infrastructure reason count as failures here and are also counted
separately (`eval/infra_failures`), so a broken run cannot look like a good model.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import mean
from typing import Any

from loop.rollout.task_sampler import Signal, group_signal
from loop.rollout.trajectory import INFRA_STATUSES, Trajectory


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k rollouts drawn from n (c of them correct) is correct."""
    if not 0 < k <= n or not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 < k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def compute_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Namespaced metrics (`eval/...`) of one evaluation."""
    if not trajectories:
        raise ValueError("no rollouts to compute metrics on")
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for traj in trajectories:
        by_task[traj.task_id].append(traj)
    metrics: dict[str, float] = {
        "eval/tasks": len(by_task),
        "eval/rollouts": len(trajectories),
        "eval/tgc": mean(mean(bool(t.success) for t in group) for group in by_task.values()),
        "eval/sgc": scenario_goal_completion(trajectories),
        "eval/reward_mean": mean(t.reward or 0.0 for t in trajectories),
        "eval/infra_failures": sum(t.infra_failure for t in trajectories),
    }
    k_max = min(len(group) for group in by_task.values())
    for k in range(1, k_max + 1):
        metrics[f"eval/pass@{k}"] = mean(
            pass_at_k(len(g), sum(bool(t.success) for t in g), k) for g in by_task.values()
        )
    metrics.update(_behaviour(trajectories))
    metrics.update(_by_difficulty(trajectories))
    for status, count in Counter(t.status for t in trajectories).items():
        metrics[f"eval/status/{status}"] = count
    return metrics


def scenario_goal_completion(trajectories: Sequence[Trajectory]) -> float:
    """SGC: per sample index, the share of scenarios with every variant solved; then the mean."""
    solved: dict[tuple[str, int], list[bool]] = defaultdict(list)
    for traj in trajectories:
        solved[(traj.scenario_id, traj.sample_index)].append(bool(traj.success))
    per_sample: dict[int, list[bool]] = defaultdict(list)
    for (_, sample), outcomes in solved.items():
        per_sample[sample].append(all(outcomes))
    return mean(mean(values) for values in per_sample.values())


def _behaviour(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    calls = [t.api_calls for t in trajectories]
    return {
        "eval/turns_mean": mean(len(t.turns) for t in trajectories),
        "eval/api_calls_mean": mean(len(c) for c in calls),
        "eval/failed_api_calls_mean": mean(sum(not call["ok"] for call in c) for c in calls),
        "eval/output_tokens_mean": mean(sum(t.is_output) for t in trajectories),
        "eval/tokens_mean": mean(len(t.tokens) for t in trajectories),
    }


def _by_difficulty(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for traj in trajectories:
        groups[traj.difficulty].append(traj)
    out: dict[str, float] = {}
    for difficulty, group in sorted(groups.items()):
        out[f"eval/difficulty_{difficulty}/success_rate"] = mean(bool(t.success) for t in group)
        out[f"eval/difficulty_{difficulty}/reward_mean"] = mean(t.reward or 0.0 for t in group)
        out[f"eval/difficulty_{difficulty}/rollouts"] = len(group)
    return out


def iteration_metrics(
    groups: Sequence[Sequence[Trajectory]],
    credit: Any,
    discarded: int,
    samples: Sequence[Any],
    kept: Sequence[bool],
) -> dict[str, float]:
    """Namespaced metrics (`rollout/...`) of one training iteration's rollouts.

    `credit` is the iteration's `loop.algo.credit.Credit` (flattened in group order), `discarded`
    the rollouts cancelled by the straggler cut-off, `samples` what this process trains on and
    `kept` the rollouts trained on, after the top-up to a multiple of the world size.

    `reward_mean` and `success_rate` count every rollout, an excluded one (infrastructure
    failure) as 0, so a run whose failures are excluded cannot look better than it is; the
    `_scored` twins are over the scored rollouts only. `train_reward_mean` is the mean of the
    reward the advantages were computed from (`train.reward`), over the scored rollouts.
    """
    flat = [traj for group in groups for traj in group]
    if not flat:
        return {"rollout/count": 0.0, "rollout/discarded": float(discarded)}
    scored = [t for t, present in zip(flat, credit.present, strict=True) if present]
    statuses = Counter(t.status for t in flat)
    signals = Counter(group_signals(groups, credit))
    present_count = sum(credit.present)
    metrics: dict[str, float] = {
        "rollout/count": len(flat),
        "rollout/discarded": discarded,
        "rollout/tasks": len(groups),
        "rollout/reward_mean": sum(t.reward or 0.0 for t in scored) / len(flat),
        "rollout/success_rate": sum(bool(t.success) for t in scored) / len(flat),
        "rollout/reward_mean_scored": mean(t.reward or 0.0 for t in scored) if scored else math.nan,
        "rollout/success_rate_scored": mean(bool(t.success) for t in scored)
        if scored
        else math.nan,
        "rollout/train_reward_mean": _mean_or_nan(
            [r for r, present in zip(credit.rewards, credit.present, strict=True) if present]
        ),
        "rollout/attained_return_1": mean(any(t.reward == 1.0 for t in group) for group in groups),
        "rollout/infra_failures": credit.excluded,
        "rollout/infra_failure_share": sum(t.infra_failure for t in flat) / len(flat),
        "rollout/groups_dropped": credit.groups_dropped,
        "rollout/kept": sum(kept),
        **{f"rollout/groups_{kind}": signals[kind] for kind in ("stuck", "solved")},
        "rollout/filtered_fraction": 1 - sum(kept) / present_count if present_count else 0,
        "rollout/turns_mean": mean(len(t.turns) for t in flat),
        "rollout/output_tokens_mean": mean(sum(t.is_output) for t in flat),
        "rollout/tokens_max": max(len(t.tokens) for t in flat),
        "rollout/truncated": sum(s.truncated for s in samples),
        "rollout/api_calls_mean": mean(sum(len(turn.api_calls) for turn in t.turns) for t in flat),
    }
    for status, count in statuses.items():
        metrics[f"rollout/status/{status}"] = count
    by_difficulty: dict[int, list[bool]] = defaultdict(list)
    for traj in scored:
        by_difficulty[traj.difficulty].append(bool(traj.success))
    for difficulty, successes in sorted(by_difficulty.items()):
        metrics[f"rollout/success_rate/d{difficulty}"] = mean(successes)
    return metrics


def group_signals(groups: Sequence[Sequence[Trajectory]], credit: Any) -> list[Signal]:
    """What each group can teach (`group_signal`: "signal", "solved" or "stuck"), by the training
    reward of its scored rollouts (`credit`, flattened in group order): a leave-one-out or group
    baseline gives "solved" and "stuck" groups an advantage of 0 everywhere."""
    signals: list[Signal] = []
    start = 0
    for group in groups:
        scored = [i for i in range(start, start + len(group)) if credit.present[i]]
        rewards = [credit.rewards[i] for i in scored]
        signals.append(group_signal(rewards, [bool(group[i - start].success) for i in scored]))
        start += len(group)
    return signals


def infra_failure_problem(
    metrics: dict[str, float],
    max_share: float | None,
    groups: Sequence[Sequence[Trajectory]] = (),
) -> str | None:
    """Why the run must stop: more than `max_share` of the iteration's rollouts were
    infrastructure failures (named with their counts, and the first one's error from `groups`,
    e.g. every vLLM server gone and their logs); None when within it or unchecked."""
    share = metrics.get("rollout/infra_failure_share", 0.0)
    if max_share is None or share <= max_share:
        return None
    counts = {
        key.removeprefix("rollout/status/"): int(value)
        for key, value in sorted(metrics.items())
        if key.startswith("rollout/status/")
        and key.removeprefix("rollout/status/") in INFRA_STATUSES
    }
    named = ", ".join(f"{status} {count}" for status, count in counts.items())
    first = next((t.error for g in groups for t in g if t.infra_failure and t.error), None)
    return (
        f"{share:.0%} of the iteration's rollouts failed for infrastructure reasons ({named}), "
        f"more than train.max_infra_failure_share={max_share:g}: fix the cause before training on"
    ) + (f"; the first: {' '.join(first.split())}" if first else "")


def _mean_or_nan(values: list[float]) -> float:
    return mean(values) if values else math.nan


def throughput(
    metrics: dict[str, float], groups: list[list[Trajectory]], trained_tokens: int, total_s: float
) -> dict[str, float]:
    """Generated and learned tokens per second, and the iteration's wall time (`metrics` holds
    the iteration's `time/rollout_s` and `time/learn_s`)."""
    generated = sum(sum(t.is_output) for g in groups for t in g)
    return {
        "throughput/generated_tokens_per_s": generated / max(metrics["time/rollout_s"], 1e-9),
        "throughput/learned_tokens_per_s": trained_tokens / max(metrics["time/learn_s"], 1e-9),
        "time/iteration_s": total_s,
    }
