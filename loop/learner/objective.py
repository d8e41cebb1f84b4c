"""The policy loss of a batch as the learner's settings choose it (the math is in
loop/algo/losses.py and loop/algo/preference.py; the behaviour weights of `is_correction` in
loop/algo/correction.py).

`loss: dpo` (DMPO, DPO-MCTS): each rollout's sign (+1 chosen, -1 rejected) is the sign of its
advantage, and its reference log-probs are the old log-probs, the learner's recompute at the
iteration's start ([P] App. C: the reference refreshed every iteration; with LoRA the base with
the adapter off is NOT the reference). Its partner's score is taken as 0: the one on-policy
step of an iteration (loop/checks.py refuses more) runs the reference's weights, where every
score sum_t phi(t, T) log(pi/pi_ref) is exactly 0, so the step's gradient is the pair loss's."""

from __future__ import annotations

import torch
from torch import Tensor

from loop.algo.correction import behaviour_weights
from loop.algo.losses import (
    PolicyLoss,
    clipped_surrogate_loss,
    cross_entropy_loss,
    reinforce_loss,
)
from loop.algo.preference import dmpo_loss
from loop.learner.batch import Batch
from loop.learner.settings import LearnerSettings


def policy_loss(batch: Batch, logprobs: Tensor, settings: LearnerSettings) -> PolicyLoss:
    """The policy loss `settings.loss` names, of `batch` whose output tokens have `logprobs`
    under the weights being trained: the clipped surrogate (weighted by the behaviour weights
    with `is_correction`), REINFORCE, or the cross-entropy of the warm start."""
    mask, s = batch.is_output, settings
    if s.loss == "cross_entropy":
        return cross_entropy_loss(logprobs, mask, old_logprobs=batch.old_logprobs)
    if s.loss == "dpo":
        return preference_loss(batch, logprobs, settings)
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


def preference_loss(batch: Batch, logprobs: Tensor, settings: LearnerSettings) -> PolicyLoss:
    """Each rollout's share of its pair's DMPO loss (the module docstring), as a `PolicyLoss`:
    nothing is clipped; the ratio is exp of the mean log-ratio to the reference."""
    assert batch.old_logprobs is not None, "loss dpo needs the recomputed old log-probs"
    mask = batch.is_output
    signs = torch.sign(torch.where(mask, batch.advantages, 0.0).sum(dim=1))
    partner_scores = torch.zeros_like(signs)  # the reference's: see the module docstring
    out = dmpo_loss(
        logprobs,
        batch.old_logprobs,
        mask,
        batch.turn_ids,
        signs,
        partner_scores,
        beta=settings.dpo_beta,
        gamma=settings.dmpo_gamma,
    )
    ratio = torch.exp(out.log_ratio_sum / mask.sum(dim=1).clamp(min=1))
    return PolicyLoss(out.loss, torch.zeros_like(ratio), ratio, out.log_ratio_sum)
