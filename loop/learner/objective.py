"""The policy loss of a batch as the learner's settings choose it (the math is in
loop/algo/losses.py; the behaviour weights of `is_correction` in loop/algo/correction.py)."""

from __future__ import annotations

from torch import Tensor

from loop.algo.correction import behaviour_weights
from loop.algo.losses import (
    PolicyLoss,
    clipped_surrogate_loss,
    cross_entropy_loss,
    reinforce_loss,
)
from loop.learner.batch import Batch
from loop.learner.settings import LearnerSettings


def policy_loss(batch: Batch, logprobs: Tensor, settings: LearnerSettings) -> PolicyLoss:
    """The policy loss `settings.loss` names, of `batch` whose output tokens have `logprobs`
    under the weights being trained: the clipped surrogate (weighted by the behaviour weights
    with `is_correction`), REINFORCE, or the cross-entropy of the warm start."""
    mask, s = batch.is_output, settings
    if s.loss == "cross_entropy":
        return cross_entropy_loss(logprobs, mask, old_logprobs=batch.old_logprobs)
    if s.loss == "reinforce":
        assert s.ratio_level != "turn", "no per-turn REINFORCE (loop/checks.py refuses it)"
        return reinforce_loss(  # old log-probs only feed k1/k3 and the high-KL stop
            logprobs, batch.advantages, mask, level=s.ratio_level,
            old_logprobs=batch.old_logprobs,
        )  # fmt: skip
    assert batch.old_logprobs is not None
    weights = None  # none: no weighting at all, so the paper's loss stays bit-exact
    if s.is_correction != "none":
        weights = behaviour_weights(
            batch.old_logprobs, batch.sampler_logprobs, mask, correction=s.is_correction,
            cap=s.is_cap, band=s.is_band,
        ).weights  # fmt: skip
    return clipped_surrogate_loss(
        logprobs, batch.old_logprobs, batch.advantages, mask, clip_eps=s.clip_eps,
        lower=s.clip_lower, level=s.ratio_level, turn_ids=batch.turn_ids, weights=weights,
    )  # fmt: skip
