"""Steps 4-5 of an iteration, the learner's side, as one call (`update_policy`): the old
log-probs (the learner's recompute, checked against the sampler's, or the sampler's own), the
sampler-learner mismatch split at the version each rollout sampled
(`train.off_policy.split_mismatch`), the learned critic's advantages, then the epochs of
minibatch steps. The trainer runs it in a worker thread while collections run ahead
(loop/rollout/ahead.py `off_loop`), so it touches no asyncio object and reports everything it
measured in its result. And `keep_start`: the starting policy saved where steps 4-5 read it (the
KL's reference, version 0's adapter)."""

from __future__ import annotations

import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loop.algo.credit import Credit
from loop.config import RunConfig, TrainConfig
from loop.learner.batch import Sample, take_sampler_logprobs
from loop.learner.critic import assign_gae
from loop.learner.learner import Learner, LearnStats
from loop.learner.stats import mismatch_stats
from loop.model import checkpoint, distributed
from loop.rollout.trajectory import Trajectory
from loop.seeds import minibatch_seed


@dataclass
class Update:
    """What steps 4-5 did: their metrics (the learner's `stats.metrics()` last), the learner's
    statistics, and the credit with the learned critic's per-turn advantages."""

    metrics: dict[str, float]
    stats: LearnStats
    credit: Credit


def update_policy(
    learner: Learner,
    samples: list[Sample],
    groups: list[list[Trajectory]],
    credit: Credit,
    config: RunConfig,
    iteration: int,
    published: Callable[[int], Path],
    show_progress: bool,
) -> Update:
    """Steps 4-5 on this process's `samples` of the iteration's `groups` (`published(v)`: the
    directory of version v's published adapter, pi_v of a stale rollout)."""
    distributed.use_device(learner.policy.device)  # a worker thread starts on cuda:0
    cfg = config.train
    metrics: dict[str, float] = {}
    if cfg.off_policy.old_logprobs == "sampler":  # the hf engine runs the learner's weights
        metrics |= take_sampler_logprobs(samples)
    else:
        metrics |= learner.recompute_old_logprobs(samples)
        check_parity(metrics, cfg)
    if cfg.off_policy.split_mismatch:  # the mismatch's engine and staleness parts, at pi_v
        flat = [traj for group in groups for traj in group]
        versions = [flat[s.source].policy_version for s in samples]
        metrics |= mismatch_stats(
            samples, versions, iteration, published, learner.logprobs_with_adapter
        )
    critic = assign_gae(samples, config)  # gae / verlog: old values
    metrics |= critic.metrics
    stats = learn(learner, samples, cfg, iteration, config.seed, show_progress)
    return Update(metrics | stats.metrics(), stats, credit.with_turn_advantages(critic.turn_means))


def check_parity(metrics: dict[str, float], cfg: TrainConfig) -> None:
    """Stop when the learner and the sampler disagree beyond the configured threshold."""
    worst = metrics.get("recompute/abs_logprob_diff_max", 0.0)
    if (
        cfg.off_policy.logprob_diff_threshold is not None
        and worst > cfg.off_policy.logprob_diff_threshold
    ):
        raise RuntimeError(
            f"learner and sampler log-probs differ by up to {worst:.4f} > "
            "train.off_policy.logprob_diff_threshold="
            f"{cfg.off_policy.logprob_diff_threshold}: the sampler does not sample from the model "
            "being trained (dtype, adapter sync or sampling settings)"
        )


def learn(
    learner: Learner,
    samples: list[Sample],
    cfg: TrainConfig,
    iteration: int,
    seed: int,
    show_progress: bool,
) -> LearnStats:
    """Step 5, with strictly-on-policy mode as one minibatch of everything."""
    if not samples:
        learner.step_schedule()
        return LearnStats()
    from tqdm import tqdm

    world = distributed.world_size()
    # strictly on policy: one minibatch of everything, whatever train.minibatch_size says
    minibatch_size = len(samples) * world if cfg.strictly_on_policy else cfg.minibatch_size
    steps = cfg.epochs * math.ceil(len(samples) * world / minibatch_size)
    progress = tqdm(
        total=steps,
        desc=f"iter {iteration} learn",
        unit="step",
        disable=not show_progress,
        file=sys.stderr,
        leave=False,
    )
    try:
        return learner.learn(
            samples,
            seed=minibatch_seed(seed, iteration),
            iteration=iteration,
            minibatch_size=minibatch_size,
            on_step=lambda: progress.update(1),
        )
    finally:
        progress.close()


def keep_start(learner: Learner, version_zero: Path | None) -> None:
    """Save the policy RL starts from where later steps read it, once: the KL's reference
    (`train.kl.reference: start`) and version 0's adapter (`version_zero`), pi_v of the groups
    that sampled it (`train.off_policy.split_mismatch`; a warm start serves its own copy). A
    resumed run keeps what its first launch saved."""
    for target in [learner.settings.reference_adapter, version_zero]:
        if target is None or target.is_dir():
            continue
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        checkpoint.save_weights(learner.model, partial)  # whole or not at all
        partial.rename(target)
