"""Per-rollout policy losses over a padded batch, and KL diagnostics: pure tensor functions.

Shapes: B sequences of T positions. `mask` (B, T) bool is `is_output`: True only for tokens the
policy sampled (loop_spec.md 1.3), so prompts, observations and padding get no gradient.
`old_logprobs` may hold NaN off the mask (the reference stores NaN there); every value off the
mask is ignored without letting a NaN into the loss or its gradient. Each function returns one
loss per sequence; the trainer sums a minibatch's losses and divides by the configured
minibatch size (the reference divides by 32 even for a short last minibatch, loop_spec.md 2.6).

Where each formula comes from ([P] the LOOP paper, [C] its reference code apple/ml-loop, as
summarised in loop_spec.md 2.7-2.8):
- Clip function g(A) and objective o = min(r A, g(A)):
  `lower="reciprocal"`: g(A) = (1 + eps) A if A >= 0 else A / (1 + eps), i.e. the ratio band
  [1/(1+eps), 1+eps] of [C] (0.9091..1.1 at eps = 0.1); `lower="symmetric"`: g(A) = A + eps|A|,
  the band [1-eps, 1+eps] of [P] Eq. 4/5.
- `level="token"`: per-token ratios r_t, loss = -(1/|a(x)|) sum_t o_t, the mean over the
  sequence's output tokens with all turns pooled ([P] Eq. 10; [C] `pg_per_token`).
- Behaviour weights (token level, optional): loss = -(1/|a(x)|) sum_t w_t o_t with
  w_t = stopgrad(min(pi_prox/mu, C)) or IcePop's band mask, AReaL's decoupled PPO for rollouts
  sampled by another distribution mu than pi_prox (loop/algo/correction.py).
- `level="trajectory"`: one ratio exp(sum_t log r_t), loss = -o with no token mean ([P] Eq. 4/9;
  [C] the per-trajectory "bandit" loss).
- `level="turn"`: one ratio per turn, exp(sum of the turn's log r_t), loss = -(mean over the
  sequence's turns of the turn objectives). [P] evaluates per-turn importance weights (Fig. 2,
  Table 1 "LOOP (turn)") without a formula and [C] does not implement them; the choice of a
  plain mean over turns is ours (see `clipped_surrogate_loss`).
- `reinforce_loss`: [C] without PPO clipping: per token -mean_t(A log p); per trajectory
  ("vanilla RLOO") -A mean_t log p.
- `cross_entropy_loss`: supervised fine-tuning on demonstrations and expert iteration ([P] App.
  C: SFT-GT, RFT, EI): -mean_t log p over the sequence's output tokens, reduced like the
  policy losses (one value per sequence), so SFT and RL share minibatches and normalisation.
- `clipped_value_loss`: the critic's loss of the learned-critic baselines ([P] App. C "PPO with
  a learned critic"; Verlog, paper 000): PPO's clipped value loss (Schulman et al. 2017, as in
  the PPO2 baselines and cleanrl), 1/2 max((V - R)^2, (V_clip - R)^2) with V_clip the old value
  moved at most `clip_eps` towards V, a token-weighted mean per sequence (Verlog weighs the first
  token of each turn more, App. B.3.2).
- `kl_penalty`: the KL-to-reference term of GRPO (DeepSeekMath Eq. 4): the k3 estimator
  pi_ref/pi - log(pi_ref/pi) - 1 per output token, unbiased for KL(pi_theta || pi_ref) on
  samples of pi_theta and never negative; the mean over the sequence's output tokens.
- `kl_estimates`: [C]'s high-KL early stop uses k1 = -mean(per-trajectory log ratio); k3 is
  Schulman's estimator (http://joschu.net/blog/kl-approx.html), which [C] has but does not use.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

ClipLower = Literal["reciprocal", "symmetric"]
Level = Literal["token", "turn", "trajectory"]

# |summed log-ratio| beyond which exp() is saturated (e^20 ~ 4.9e8), see clipped_surrogate_loss.
MAX_LOG_RATIO = 20.0


class PolicyLoss(NamedTuple):
    """Per-sequence loss and diagnostics."""

    loss: Tensor  # (B,) per-sequence loss (differentiable)
    clipped: Tensor  # (B,) fraction of the sequence's units (tokens/turns/1) that were clipped
    ratio_mean: Tensor  # (B,) mean importance ratio over the units, detached (1.0 if none)
    log_ratio_sum: Tensor  # (B,) sum over output tokens of (logprobs - old_logprobs), detached


class ValueLoss(NamedTuple):
    """Per-sequence value loss and diagnostics."""

    loss: Tensor  # (B,) weighted mean over output tokens of 1/2 max(unclipped, clipped) error
    clipped: Tensor  # (B,) weighted share of tokens where the clipped error was the larger
    error: Tensor  # (B,) weighted mean of (V - R)^2, detached (the value MSE the paper reports)


class KLEstimates(NamedTuple):
    """Two estimates of KL(pi_old || pi_theta) from samples of pi_old (scalars)."""

    k1: Tensor
    k3: Tensor


def clip_value(advantages: Tensor, *, clip_eps: float, lower: ClipLower = "reciprocal") -> Tensor:
    """g(A), the value the clipped objective cannot exceed (any shape in, same shape out).

    reciprocal: (1 + eps) A for A >= 0, A / (1 + eps) for A < 0   ([C]).
    symmetric:  A + eps |A|, i.e. (1 + eps) A or (1 - eps) A      ([P] Eq. 4/5).
    """
    if clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    if lower == "reciprocal":
        return torch.where(
            advantages >= 0, (1 + clip_eps) * advantages, advantages / (1 + clip_eps)
        )
    if lower == "symmetric":
        return advantages + clip_eps * advantages.abs()
    raise ValueError(f"lower must be 'reciprocal' or 'symmetric', got {lower!r}")


def clipped_objective(
    ratio: Tensor, advantages: Tensor, *, clip_eps: float, lower: ClipLower = "reciprocal"
) -> tuple[Tensor, Tensor]:
    """o = min(r A, g(A)) elementwise, and where the clipped branch is the smaller (bool).

    ratio, advantages: same shape. Where clipped, o = g(A) carries no gradient, exactly as
    min(r A, clamp(r, low, high) A) (the form [C] asserts it equals). At a tie (e.g. A = 0)
    the unclipped branch is taken, so `clipped` counts only strict clipping.
    """
    unclipped = ratio * advantages
    bound = clip_value(advantages, clip_eps=clip_eps, lower=lower)
    clipped = unclipped > bound
    return torch.where(clipped, bound, unclipped), clipped


def clipped_surrogate_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_eps: float = 0.1,
    lower: ClipLower = "reciprocal",
    level: Level = "token",
    turn_ids: Tensor | None = None,
    max_log_ratio: float | None = MAX_LOG_RATIO,
    weights: Tensor | None = None,
) -> PolicyLoss:
    """The PPO clipped surrogate, per sequence, with per-token, per-turn or per-trajectory ratios.

    logprobs: (B, T) float, with grad.   old_logprobs: (B, T), no grad (NaN allowed off mask).
    advantages: (B,) per sequence, or (B, T) per token. At the turn level a turn's advantage is
        the mean of its tokens' advantages; at the trajectory level the sequence's advantage is
        the mean over its output tokens (both equal the broadcast value in the intended use).
    mask: (B, T) bool, is_output.
    turn_ids: (B, T) int64, the turn index of each output token (-1 elsewhere); level "turn".
    weights: (B, T), no grad, level "token" only: the behaviour weights w_t of the decoupled
        loss (loop/algo/correction.py); loss = -mean_t w_t o_t, the mean still over all output
        tokens (a masked token, w = 0, counts in the denominator). None: no weighting, today's
        loss to the last bit.

    Units and reduction, with o = min(r A, g(A)):
    - token: r_t = exp(log p - log p_old) per output token; loss = -mean_t o_t.
    - turn: r_k = exp(sum of log-ratios of turn k's output tokens) = prod_t r_t, the importance
      weight of the turn as one action (the environment's factors cancel as in [P] 1.2);
      loss = -(1/#turns) sum_k o_k. A plain mean over turns (not weighted by turn length) is our
      choice: the units of the level are averaged as the token level averages tokens and the
      trajectory level has one unit, so at r = 1 every level gives -A.
    - trajectory: r = exp(sum_t log-ratio); loss = -o.
    A sequence with no output tokens gives loss 0 (and ratio_mean 1, clipped 0), not NaN.
    Numerical safety: the (summed) log-ratio is clamped to [-max_log_ratio, max_log_ratio]
    before exp (None: no clamp). Beyond the clamp the ratio is saturated: finite, no gradient.
    Where |log r| > 20 the objective is clipped anyway except for A < 0 with r > e^20 (whose
    unclamped gradient, ~e^20 |A|, would be useless) and for A > 0 with r < e^-20 (whose
    gradient is negligible). Per-token log-ratios never get near the clamp in normal training,
    so the token level equals [C]'s loss.
    """
    _check_inputs(logprobs, old_logprobs, mask)
    log_ratio = torch.where(mask, logprobs - old_logprobs, 0.0)
    per_token_adv = _per_token(advantages, mask, logprobs.dtype)
    n_tokens = mask.sum(dim=1)
    has_output = n_tokens > 0

    if level == "token":
        ratio = torch.exp(_clamp(log_ratio, max_log_ratio))
        unit_adv, unit_mask = per_token_adv, mask
    elif level == "turn":
        turn_log_ratio, unit_adv, unit_mask = _per_turn(log_ratio, per_token_adv, mask, turn_ids)
        ratio = torch.exp(_clamp(turn_log_ratio, max_log_ratio))
    elif level == "trajectory":
        ratio = torch.exp(_clamp(log_ratio.sum(dim=1, keepdim=True), max_log_ratio))
        unit_adv = _sequence_mean(per_token_adv, mask)[:, None]
        unit_mask = has_output[:, None]
    else:
        raise ValueError(f"level must be 'token', 'turn' or 'trajectory', got {level!r}")

    objective, clipped = clipped_objective(ratio, unit_adv, clip_eps=clip_eps, lower=lower)
    if weights is not None:
        if level != "token" or weights.shape != mask.shape:
            raise ValueError(f"weights are (B, T) at level 'token', got {tuple(weights.shape)} "
                             f"at level {level!r}")  # fmt: skip
        objective = objective * torch.where(mask, weights.detach(), 0.0).to(objective.dtype)
    n_units = unit_mask.sum(dim=1).clamp(min=1).to(logprobs.dtype)
    loss = -torch.where(unit_mask, objective, 0.0).sum(dim=1) / n_units
    clip_frac = (clipped & unit_mask).sum(dim=1).to(logprobs.dtype) / n_units
    ratio_sum = torch.where(unit_mask, ratio.detach(), 0.0).sum(dim=1)
    ratio_mean = torch.where(unit_mask.any(dim=1), ratio_sum / n_units, 1.0)
    return PolicyLoss(loss, clip_frac, ratio_mean, log_ratio.detach().sum(dim=1))


def reinforce_loss(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    level: Literal["token", "trajectory"] = "token",
    old_logprobs: Tensor | None = None,
) -> PolicyLoss:
    """REINFORCE without clipping or importance weights ([C] with `do_ppo_clipping=False`).

    logprobs: (B, T) with grad.  advantages: (B,) or (B, T).  mask: (B, T) bool.
    token:      loss = -mean_t(A_t log p_t) over output tokens.
    trajectory: loss = -A * mean_t log p_t ("vanilla RLOO"; A = the mean of a (B, T) input over
                the output tokens). Equal to the token level when A is one value per sequence.
    old_logprobs (optional, (B, T)): fills ratio_mean and log_ratio_sum for the diagnostics;
    without it they are 1 and 0. `clipped` is always 0. No output tokens: loss 0.
    """
    reference = logprobs.detach() if old_logprobs is None else old_logprobs
    _check_inputs(logprobs, reference, mask)
    per_token_adv = _per_token(advantages, mask, logprobs.dtype)
    safe_logprobs = torch.where(mask, logprobs, 0.0)
    if level == "token":
        loss = -_sequence_mean(per_token_adv * safe_logprobs, mask)
    elif level == "trajectory":
        loss = -_sequence_mean(per_token_adv, mask) * _sequence_mean(safe_logprobs, mask)
    else:
        raise ValueError(f"level must be 'token' or 'trajectory', got {level!r}")
    log_ratio = torch.where(mask, logprobs.detach() - reference, 0.0)
    n_tokens = mask.sum(dim=1)
    ratio_sum = torch.where(mask, log_ratio.exp(), 0.0).sum(dim=1)
    ratio_mean = torch.where(n_tokens > 0, ratio_sum / n_tokens.clamp(min=1), 1.0)
    return PolicyLoss(loss, torch.zeros_like(ratio_mean), ratio_mean, log_ratio.sum(dim=1))


def cross_entropy_loss(
    logprobs: Tensor, mask: Tensor, *, old_logprobs: Tensor | None = None
) -> PolicyLoss:
    """Negative log-likelihood of the output tokens: loss = -mean_t log p_t per sequence.

    logprobs: (B, T) with grad.  mask: (B, T) bool (the tokens the policy would have sampled).
    Equals `reinforce_loss` with A = 1 on every output token. `clipped` is always 0.
    old_logprobs (optional, (B, T); expert iteration has them, demonstrations do not): fills
    ratio_mean and log_ratio_sum for the KL diagnostics; without it they are 1 and 0.
    A sequence with no output tokens gives loss 0.
    """
    ones = torch.ones(mask.shape[0], dtype=logprobs.dtype, device=logprobs.device)
    return reinforce_loss(logprobs, ones, mask, level="token", old_logprobs=old_logprobs)


def clipped_value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_eps: float | None = 0.2,
    weights: Tensor | None = None,
) -> ValueLoss:
    """PPO's clipped value loss per sequence.

    values: (B, T) with grad, V(s_t) now.   old_values: (B, T), V(s_t) when the rollouts'
    advantages were computed (no grad).   returns: (B, T), the targets R_t.   mask: (B, T) bool.
    V_clip = old + clamp(V - old, -clip_eps, clip_eps) (clip_eps None: no clipping);
    per token l_t = 1/2 max((V - R)^2, (V_clip - R)^2); loss = sum_t w_t l_t / sum_t w_t over
    output tokens, w_t = `weights` ((B, T), e.g. larger at the first token of each turn; None:
    1). A sequence with no output tokens gives 0.
    """
    _check_inputs(values, old_values, mask)
    if returns.shape != values.shape:
        raise ValueError(f"returns {tuple(returns.shape)} vs values {tuple(values.shape)}")
    if clip_eps is not None and clip_eps <= 0:
        raise ValueError(f"clip_eps must be > 0 or None, got {clip_eps}")
    w = torch.ones_like(values) if weights is None else weights.to(values.dtype)
    w = torch.where(mask, w, 0.0)
    old = torch.where(mask, old_values, 0.0).to(values.dtype)
    target = torch.where(mask, returns, 0.0).to(values.dtype)
    safe_values = torch.where(mask, values, 0.0)
    unclipped = (safe_values - target) ** 2
    if clip_eps is None:
        worst, clipped = unclipped, torch.zeros_like(mask)
    else:
        moved = old + (safe_values - old).clamp(-clip_eps, clip_eps)
        clipped_error = (moved - target) ** 2
        worst = torch.maximum(unclipped, clipped_error)
        clipped = clipped_error > unclipped
    total_w = w.sum(dim=1).clamp(min=1e-12)
    loss = 0.5 * (w * worst).sum(dim=1) / total_w
    clip_frac = (w * clipped.to(w.dtype)).sum(dim=1) / total_w
    error = (w * unclipped.detach()).sum(dim=1) / total_w
    return ValueLoss(loss, clip_frac.detach(), error)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor) -> Tensor:
    """GRPO's KL-to-reference term per sequence: mean over output tokens of k3.

    logprobs: (B, T) with grad, log pi_theta.   ref_logprobs: (B, T), log pi_ref (no grad; NaN
    allowed off the mask).   mask: (B, T) bool.
    k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1 (DeepSeekMath Eq. 4), >= 0, 0 where the
    two agree. Returns (B,); 0 for a sequence with no output tokens.
    """
    _check_inputs(logprobs, ref_logprobs, mask)
    diff = torch.where(mask, ref_logprobs.detach() - logprobs, 0.0)
    return _sequence_mean(torch.expm1(diff) - diff, mask)


def kl_estimates(log_ratio_sums: Tensor) -> KLEstimates:
    """KL(pi_old || pi_theta) per trajectory, estimated from rollouts sampled from pi_old.

    log_ratio_sums: (B,) per-trajectory sum over output tokens of (log p_theta - log p_old),
        i.e. `PolicyLoss.log_ratio_sum` gathered over all ranks.
    With lr = log(pi_theta / pi_old) and x ~ pi_old:
    - k1 = mean(-lr): unbiased for KL(pi_old || pi_theta), can be negative; what [C]'s
      high-KL early stop compares (|k1| > 20) with its threshold.
    - k3 = mean(exp(lr) - 1 - lr): unbiased for the same KL, never negative, lower variance
      near pi_theta = pi_old (Schulman). Computed in float64; a trajectory with lr > ~709
      makes it inf, which still reads as "far too large".
    Empty input gives zeros. Returns scalars in the input's dtype.
    """
    if log_ratio_sums.dim() != 1:
        raise ValueError(f"log_ratio_sums must be (B,), got {tuple(log_ratio_sums.shape)}")
    if log_ratio_sums.numel() == 0:
        zero = log_ratio_sums.new_zeros(())
        return KLEstimates(zero, zero.clone())
    lr = log_ratio_sums.detach().to(torch.float64)
    k1 = (-lr).mean()
    k3 = (torch.expm1(lr) - lr).mean()
    return KLEstimates(k1.to(log_ratio_sums.dtype), k3.to(log_ratio_sums.dtype))


def token_kl_estimates(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> KLEstimates:
    """Per-token k1 and k3 of KL(pi_old || pi_theta), averaged over all output tokens of the batch.

    logprobs, old_logprobs: (B, T); mask: (B, T) bool. The usual `approx_kl` diagnostic
    (cleanrl logs k3 under that name); detached. No output tokens: zeros.
    """
    _check_inputs(logprobs, old_logprobs, mask)
    lr = torch.where(mask, logprobs.detach() - old_logprobs, 0.0)
    n = mask.sum().clamp(min=1).to(lr.dtype)
    k1 = -lr.sum() / n
    k3 = torch.where(mask, torch.expm1(lr) - lr, 0.0).sum() / n
    return KLEstimates(k1, k3)


# ----------------------------------------------------------------------------- helpers


def _check_inputs(logprobs: Tensor, old_logprobs: Tensor, mask: Tensor) -> None:
    if logprobs.dim() != 2 or old_logprobs.shape != logprobs.shape or mask.shape != logprobs.shape:
        raise ValueError(
            f"logprobs, old_logprobs and mask must all be (B, T): {tuple(logprobs.shape)}, "
            f"{tuple(old_logprobs.shape)}, {tuple(mask.shape)}"
        )
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")


def _clamp(log_ratio: Tensor, bound: float | None) -> Tensor:
    return log_ratio if bound is None else log_ratio.clamp(min=-bound, max=bound)


def _per_token(advantages: Tensor, mask: Tensor, dtype: torch.dtype) -> Tensor:
    """(B,) or (B, T) advantages as (B, T), 0.0 off the mask (so no NaN reaches a gradient)."""
    if advantages.shape == mask.shape[:1]:
        advantages = advantages[:, None].expand(mask.shape)
    elif advantages.shape != mask.shape:
        raise ValueError(f"advantages must be (B,) or (B, T): {tuple(advantages.shape)}")
    return torch.where(mask, advantages.detach().to(dtype), 0.0)


def _sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    """(B, T) -> (B,): mean over each sequence's output tokens; 0.0 for a sequence with none."""
    total = torch.where(mask, values, 0.0).sum(dim=1)
    return total / mask.sum(dim=1).clamp(min=1).to(values.dtype)


def _per_turn(
    log_ratio: Tensor, advantages: Tensor, mask: Tensor, turn_ids: Tensor | None
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-turn summed log-ratio, mean advantage and presence: three (B, N_turns) tensors.

    log_ratio, advantages: (B, T), already 0.0 off the mask. turn_ids: (B, T) int64.
    """
    if turn_ids is None or turn_ids.shape != mask.shape:
        raise ValueError("level='turn' needs turn_ids of the same (B, T) shape as mask")
    if bool((mask & (turn_ids < 0)).any()):
        raise ValueError("an output token has no turn (turn_ids < 0 where mask is True)")
    index = torch.where(mask, turn_ids, 0)
    n_turns = int(index.max()) + 1 if index.numel() else 1
    shape = (mask.shape[0], n_turns)
    turn_log_ratio = log_ratio.new_zeros(shape).scatter_add(1, index, log_ratio)
    lengths = log_ratio.new_zeros(shape).scatter_add(1, index, mask.to(log_ratio.dtype))
    adv_sum = advantages.new_zeros(shape).scatter_add(1, index, advantages)
    present = lengths > 0
    return turn_log_ratio, adv_sum / lengths.clamp(min=1), present
