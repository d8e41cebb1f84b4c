"""The sampler-mismatch correction of the decoupled PPO loss, and its diagnostics: pure tensors.

Three distributions meet in one iteration: mu, the sampling engine that generated the rollouts
(`Sample.sampler_logprobs`); pi_prox, the learner's recompute at the start of the iteration
(`old_logprobs`, the proximal policy of the clipped ratio r = pi_theta / pi_prox); and
pi_theta, the weights being trained. When the sampler is the learner's exact twin and
up to date, mu = pi_prox and today's loss is right. When it is not (another engine's kernels,
a quantised sampler, rollouts collected while the previous iteration learned), the tokens are
samples of mu, not of pi_prox, and the per-token objective is re-weighted by the behaviour
weight

    w_t = stopgrad(pi_prox(y_t) / mu(y_t))

(AReaL's decoupled PPO objective, Fu et al. 2025: the clip trusts pi_prox, the importance
weight corrects for mu). An unbounded w has unbounded variance, so it is tamed:
- `truncate`: w = min(pi_prox / mu, C), truncated importance sampling at the token level
  (verl's and SkyRL's "token TIS"; their default C = 2, ours);
- `mask`: w = pi_prox / mu inside the band [low, high], else 0: the token is dropped instead of
  down-weighted (IcePop, the Ring-1T report; band [0.5, 2]);
- `none`: w = 1, the loss of the paper and of the reference code, unchanged.
Tokens without a sampler log-prob (NaN: the backend gave none) get w = 1 and are counted.
The log of the raw weight is clamped to +-MAX_LOG_RATIO before exp, as the PPO ratio is.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import Tensor

from loop.algo.losses import MAX_LOG_RATIO

Correction = Literal["none", "truncate", "mask"]

DEFAULT_CAP = 2.0  # verl's and SkyRL's token TIS cap C
DEFAULT_BAND = (0.5, 2.0)  # IcePop's band


class BehaviourWeights(NamedTuple):
    """The per-token behaviour weights of a batch (all (B, T), detached)."""

    ratio: Tensor  # pi_prox / mu before the cap or the band; 1 off the mask and where unknown
    weights: Tensor  # w applied to the objective; 0 off the mask, 1 where mu is unknown
    corrected: Tensor  # bool: output tokens the cap truncated (truncate) or the band dropped (mask)
    unknown: Tensor  # bool: output tokens without a sampler log-prob


class WeightStats(NamedTuple):
    """The behaviour weights over a set of output tokens (float scalars)."""

    tokens: float  # output tokens
    unknown: float  # ... of which without a sampler log-prob (w = 1)
    w_mean: float  # mean of the raw weight pi_prox / mu (before the cap or band)
    w_max: float  # its max
    w_p99: float  # its 99th percentile (linear interpolation, torch.quantile)
    corrected_frac: float  # share of tokens truncated or masked (0 with `none`)
    ess: float  # (sum w)^2 / (n sum w^2) of the applied weights: 1 when all equal
    mismatch_k3: float  # mean over tokens with a known mu of rho - 1 - log rho, rho = pi_prox/mu


def behaviour_weights(
    old_logprobs: Tensor,
    sampler_logprobs: Tensor,
    mask: Tensor,
    *,
    correction: Correction,
    cap: float = DEFAULT_CAP,
    band: tuple[float, float] = DEFAULT_BAND,
) -> BehaviourWeights:
    """w_t per output token from log pi_prox and log mu (see the module docstring).

    old_logprobs: (B, T) log pi_prox (NaN allowed off the mask).   sampler_logprobs: (B, T)
    log mu, NaN where the sampler gave none and off the mask.   mask: (B, T) bool, is_output.
    truncate: w = min(rho, cap), corrected where rho > cap. mask: w = rho where
    band[0] <= rho <= band[1], else 0 (corrected). none: w = 1, corrected nowhere.
    """
    if old_logprobs.shape != mask.shape or sampler_logprobs.shape != mask.shape:
        raise ValueError(
            f"old_logprobs, sampler_logprobs and mask must be one shape: "
            f"{tuple(old_logprobs.shape)}, {tuple(sampler_logprobs.shape)}, {tuple(mask.shape)}"
        )
    old = old_logprobs.detach()
    unknown = mask & ~torch.isfinite(sampler_logprobs)
    known = mask & ~unknown
    log_rho = torch.where(known, old - sampler_logprobs, 0.0)
    ratio = torch.exp(log_rho.clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO))
    if correction == "none":
        weights, corrected = torch.ones_like(ratio), torch.zeros_like(mask)
    elif correction == "truncate":
        if cap <= 0:
            raise ValueError(f"cap must be > 0, got {cap}")
        weights, corrected = ratio.clamp(max=cap), ratio > cap
    elif correction == "mask":
        low, high = band
        if not 0 <= low < high:
            raise ValueError(f"band must be 0 <= low < high, got {band}")
        inside = (ratio >= low) & (ratio <= high)
        weights, corrected = torch.where(inside, ratio, 0.0), ~inside
    else:
        raise ValueError(f"correction must be 'none', 'truncate' or 'mask', got {correction!r}")
    weights = torch.where(mask, weights, 0.0)
    return BehaviourWeights(ratio, weights, corrected & known, unknown)


def weight_stats(ratio: Tensor, weights: Tensor, corrected: Tensor, unknown: Tensor) -> WeightStats:
    """Summaries of one set of output tokens' behaviour weights, in float64.

    ratio, weights: (n,) float, the raw and the applied weight of each output token (as
    `behaviour_weights` gives them, selected on the mask).   corrected, unknown: (n,) bool.
    k3 = rho - 1 - log rho is Schulman's estimator of KL(mu || pi_prox) from samples of mu
    (never negative, 0 where the two agree). No tokens: counts 0, w 1, ess 1, the rest 0.
    """
    n = ratio.numel()
    if not weights.numel() == corrected.numel() == unknown.numel() == n:
        raise ValueError(f"one length for all four, got {n}, {weights.numel()}, "
                         f"{corrected.numel()}, {unknown.numel()}")  # fmt: skip
    if n == 0:
        return WeightStats(0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0)
    rho, w = ratio.detach().double(), weights.detach().double()
    square_sum = float((w * w).sum())
    ess = float(w.sum()) ** 2 / (n * square_sum) if square_sum > 0 else 0.0
    known = ~unknown
    log_rho = rho[known].log()
    k3 = torch.expm1(log_rho) - log_rho  # rho - 1 - log rho
    return WeightStats(
        tokens=float(n),
        unknown=float(unknown.sum()),
        w_mean=float(rho.mean()),
        w_max=float(rho.max()),
        w_p99=float(torch.quantile(rho, 0.99)),
        corrected_frac=float(corrected.sum()) / n,
        ess=ess,
        mismatch_k3=float(k3.mean()) if k3.numel() else 0.0,
    )


class MismatchSplit(NamedTuple):
    """The mu-pi_prox mismatch of a set of output tokens, split at pi_v (float scalars)."""

    tokens: float  # output tokens with a known mu
    engine_k3: float  # mean k3 of pi_v / mu: the engine against the learner, same weights
    staleness_k3: float  # mean k3 of pi_prox / pi_v: the weights sampled against the trained


def split_mismatch(
    sampler_logprobs: Tensor, behaviour_logprobs: Tensor, old_logprobs: Tensor, mask: Tensor
) -> MismatchSplit:
    """Split the mismatch between mu (the engine) and pi_prox (the learner now) at pi_v, the
    learner's log-probs under the weights version v the rollout was sampled with.

    All (n,) or (B, T) tensors of log-probs; mask: bool, the output tokens. A rollout sampled
    by the current version has pi_v = pi_prox (staleness 0), so the whole mismatch is the
    engine's; a stale one adds the policy's drift between v and now. Each part is Schulman's
    k3 = rho - 1 - log rho (>= 0), a sample estimate of a KL from tokens drawn by mu ~ pi_v:
    engine KL(mu || pi_v), staleness KL(pi_v || pi_prox). Tokens without mu are left out.
    """
    if not sampler_logprobs.shape == behaviour_logprobs.shape == old_logprobs.shape == mask.shape:
        raise ValueError("sampler, behaviour and old log-probs and the mask must be one shape")
    known = mask & torch.isfinite(sampler_logprobs)
    if not bool(known.any()):
        return MismatchSplit(0.0, 0.0, 0.0)

    def k3(log_rho: Tensor) -> float:
        log_rho = log_rho.double().clamp(min=-MAX_LOG_RATIO, max=MAX_LOG_RATIO)
        return float((torch.expm1(log_rho) - log_rho).mean())

    mu, pi_v, pi_prox = (t[known] for t in (sampler_logprobs, behaviour_logprobs, old_logprobs))
    return MismatchSplit(float(known.sum()), k3(pi_v - mu), k3(pi_prox - pi_v))
