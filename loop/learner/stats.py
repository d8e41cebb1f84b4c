"""What the learner measures: the terms of a micro-batch's loss, one iteration's statistics, the
parity of the learner's log-probs with the sampler's, and the sampler-learner mismatch split at
the version each rollout sampled (loop/learner/learner.py does the learning).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from loop.algo.correction import (
    Correction,
    WeightStats,
    behaviour_weights,
    split_mismatch,
    weight_stats,
)
from loop.algo.losses import PolicyLoss, ValueLoss
from loop.learner.batch import Sample
from loop.learner.settings import LearnerSettings
from loop.model import distributed

log = logging.getLogger(__name__)


class Losses(NamedTuple):
    """The per-sequence terms of one micro-batch (None: the term is off)."""

    total: Tensor  # (B,) what is backpropagated: policy + kl_coef * KL + coef * value
    policy: PolicyLoss | None  # None while the actor is frozen (critic warm-up)
    value: ValueLoss | None
    kl_ref: Tensor | None  # (B,) k3 to the reference


@dataclass
class LearnStats:
    """What one iteration of learning did (summed or averaged over its steps)."""

    optimizer_steps: int = 0
    skipped_nan: int = 0
    skipped_high_kl: int = 0
    stopped_early: bool = False
    losses: list[float] = field(default_factory=list)
    clip_fractions: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    kl_k1: list[float] = field(default_factory=list)
    kl_k3: list[float] = field(default_factory=list)
    trained_tokens: int = 0
    value_losses: list[float] = field(default_factory=list)
    value_errors: list[float] = field(default_factory=list)
    value_clip_fractions: list[float] = field(default_factory=list)
    kl_ref: list[float] = field(default_factory=list)
    demo_losses: list[float] = field(default_factory=list)  # the replayed demonstrations' CE
    value_coef: float | None = None
    actor_frozen: bool = False
    importance: dict[str, float] = field(default_factory=dict)  # is/*: behaviour weights

    def metrics(self) -> dict[str, float]:
        """Namespaced scalars for the run log."""

        def avg(values: list[float]) -> float:
            return sum(values) / len(values) if values else math.nan

        return {
            "learn/optimizer_steps": self.optimizer_steps,
            "learn/skipped_nan_steps": self.skipped_nan,
            "learn/skipped_high_kl": self.skipped_high_kl,
            "learn/stopped_early": float(self.stopped_early),
            "loss/policy": avg(self.losses),
            "loss/clipfrac": avg(self.clip_fractions),
            "loss/grad_norm": avg(self.grad_norms),
            "loss/grad_norm_max": max(self.grad_norms, default=math.nan),
            "loss/kl_k1": avg(self.kl_k1),
            "loss/kl_k3": avg(self.kl_k3),
            "learn/trained_tokens": self.trained_tokens,
        } | self._optional_metrics(avg)

    def _optional_metrics(self, avg: Callable[[list[float]], float]) -> dict[str, float]:
        """The critic's and the reference KL's metrics when those terms are on; `is/*`."""
        out: dict[str, float] = {}
        if self.value_coef is not None:
            out |= {
                "loss/value": avg(self.value_losses),
                "loss/value_mse": avg(self.value_errors),
                "loss/value_clipfrac": avg(self.value_clip_fractions),
                "loss/value_coef": self.value_coef,
                "learn/actor_frozen": float(self.actor_frozen),
            }
        if self.kl_ref:
            out["loss/kl_ref"] = avg(self.kl_ref)
        if self.demo_losses:
            out["loss/demo"] = avg(self.demo_losses)
        return out | self.importance


def parity_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """How far the learner's old log-probs are from the sampler's, over output tokens.

    Only tokens with a finite sampler log-prob count. Returns `recompute/*` metrics: mean and
    max |delta log p|; mean, max, p95 and p99 of |delta p|; min and max of p_learner/p_sampler.
    """
    learner, sampler = [], []
    for sample in samples:
        assert sample.old_logprobs is not None
        known = sample.is_output & torch.isfinite(sample.sampler_logprobs)
        learner.append(sample.old_logprobs[known].double())
        sampler.append(sample.sampler_logprobs[known].double())
    if not learner or sum(len(x) for x in learner) == 0:
        return {"recompute/tokens": 0.0}
    new, old = torch.cat(learner), torch.cat(sampler)
    dlogp = (new - old).abs()
    dp = (new.exp() - old.exp()).abs()
    ratio = (new - old).exp()
    return {
        "recompute/tokens": float(len(new)),
        "recompute/abs_logprob_diff_mean": float(dlogp.mean()),
        "recompute/abs_logprob_diff_max": float(dlogp.max()),
        "recompute/abs_prob_diff_mean": float(dp.mean()),
        "recompute/abs_prob_diff_max": float(dp.max()),
        "recompute/abs_prob_diff_p95": float(torch.quantile(dp, 0.95)),
        "recompute/abs_prob_diff_p99": float(torch.quantile(dp, 0.99)),
        "recompute/ratio_min": float(ratio.min()),
        "recompute/ratio_max": float(ratio.max()),
    }


def record_extras(losses: Losses, stats: LearnStats) -> None:
    """Per-micro-batch means of the value loss and the reference KL (when on)."""
    if losses.value is not None:
        stats.value_losses.append(float(losses.value.loss.detach().mean()))
        stats.value_errors.append(float(losses.value.error.mean()))
        stats.value_clip_fractions.append(float(losses.value.clipped.mean()))
    if losses.kl_ref is not None:
        stats.kl_ref.append(float(losses.kl_ref.detach().mean()))


def token_weights(
    samples: Sequence[Sample], *, correction: Correction, cap: float, band: tuple[float, float]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Every output token's raw and applied behaviour weight and its corrected and unknown
    flags, flat over `samples` (old log-probs set): the inputs of `weight_stats`."""
    parts: list[tuple[Tensor, ...]] = [(torch.empty(0), torch.empty(0),
                                       torch.empty(0, dtype=torch.bool),
                                       torch.empty(0, dtype=torch.bool))]  # fmt: skip
    for sample in samples:
        assert sample.old_logprobs is not None
        mask = sample.is_output
        out = behaviour_weights(
            sample.old_logprobs[None], sample.sampler_logprobs[None], mask[None],
            correction=correction, cap=cap, band=band,
        )  # fmt: skip
        parts.append(tuple(x[0][mask] for x in out))
    ratio, weights, corrected, unknown = (torch.cat(column) for column in zip(*parts, strict=True))
    return ratio, weights, corrected, unknown


def importance_stats(samples: Sequence[Sample], settings: LearnerSettings) -> dict[str, float]:
    """The `is/*` metrics of the behaviour weights pi_prox/mu over every process's output
    tokens (collective; fixed for the iteration: neither depends on the weights trained)."""
    s = settings
    local = token_weights(samples, correction=s.is_correction, cap=s.is_cap, band=s.is_band)
    ratio, weights, corrected, unknown = (distributed.all_gather_cat(t) for t in local)
    return importance_metrics(weight_stats(ratio, weights, corrected, unknown), s.is_correction)


def importance_metrics(stats: WeightStats, correction: Correction) -> dict[str, float]:
    """`is/*` metrics of one learn call: the raw weight pi_prox/mu (w_*), the applied weights'
    effective sample size, the mu-pi_prox mismatch, and the share the correction changed."""
    out = {
        "is/tokens": stats.tokens,
        "is/unknown_tokens": stats.unknown,
        "is/w_mean": stats.w_mean,
        "is/w_max": stats.w_max,
        "is/w_p99": stats.w_p99,
        "is/ess": stats.ess,
        "is/mismatch_k3": stats.mismatch_k3,
    }
    if correction == "truncate":
        out["is/truncated_frac"] = stats.corrected_frac
    elif correction == "mask":
        out["is/masked_frac"] = stats.corrected_frac
    return out


def mismatch_stats(
    samples: Sequence[Sample],
    versions: Sequence[int | None],
    iteration: int,
    published: Callable[[int], Path],
    logprobs_with_adapter: Callable[[Path, list[Sample]], list[Tensor]],
) -> dict[str, float]:
    """`mismatch/*`: the sampler-learner mismatch over the iteration's output tokens, split at
    pi_v, the learner's log-probs under the version v each rollout sampled (`versions`, one per
    sample): its published adapter (`published(v)`, kept while groups may sample it, read by
    `logprobs_with_adapter`: the learner's) for a stale rollout, the recompute's for one of the
    current version (`iteration`; also a rollout that names none, as in the synchronous loop).
    Also `time/split_mismatch_s`, the time it took. The old log-probs are set."""
    started = time.monotonic()
    behaviour = [s.old_logprobs for s in samples]
    for version in sorted({v for v in versions if v is not None and v != iteration}):
        stale = [i for i, v in enumerate(versions) if v == version]
        adapter = published(version)
        if not adapter.is_dir():  # a diagnostic: it never stops the run
            log.warning("split_mismatch: no adapter of version %d at %s", version, adapter)
            for i in stale:
                behaviour[i] = None
            continue
        found = logprobs_with_adapter(adapter, [samples[i] for i in stale])
        for i, logprobs in zip(stale, found, strict=True):
            behaviour[i] = logprobs
    scored: list[tuple[Sample, Tensor, Tensor]] = [
        (s, s.old_logprobs, b)
        for s, b in zip(samples, behaviour, strict=True)
        if s.old_logprobs is not None and b is not None
    ]
    split = split_mismatch(
        torch.cat([s.sampler_logprobs for s, _, _ in scored]),
        torch.cat([b for _, _, b in scored]),
        torch.cat([old for _, old, _ in scored]),
        torch.cat([s.is_output for s, _, _ in scored]),
    )
    return {
        "mismatch/tokens": split.tokens,
        "mismatch/engine_k3": split.engine_k3,
        "mismatch/staleness_k3": split.staleness_k3,
        "time/split_mismatch_s": time.monotonic() - started,
    }
