"""Generalised advantage estimation over the tokens of multi-turn rollouts: pure functions.

The advantages of the learned-critic methods (the LOOP paper's "PPO (learned critic)" row and
Verlog, paper 000), per output token, from per-token rewards and the value head's predictions:

- `compute_dual_discount_gae`: Verlog's dual-discount GAE (paper 000 Eq. 2, App. B.3.1),
      A_t = gamma lambda A_{t+1} + delta_t,   delta_t = r_t + gamma V(s_{t+1}) - V(s_t),
  where (gamma, lambda) = (gamma_token, lambda_token) when token t+1 is in the same turn as t
  and (gamma_step, lambda_step) when it is in the next turn. "t+1" is the next *output* token:
  the recursion starts from the last token of the last turn, runs backwards through the turn,
  then jumps to the last token of the previous turn, skipping every environment token (the
  observation and the chat-template glue are not actions; the paper treats a state as one
  chunk of input). After the last output token comes the bootstrap value V(s_{T+1}) (a
  truncated trajectory: the value of the state after it, taken across a turn boundary so with
  gamma_step) or 0 (a finished episode: no state follows).
- `compute_gae`: plain per-token GAE (gamma, lambda) over the output tokens: the same recursion
  with one pair for both levels. The LOOP paper's critic baseline used gamma = lambda = 1, so
  A_t = R - V(s_t) for a reward R at the end.

Two steps Verlog's code takes around the recursion and its paper does not state ([V]: the
Verlog repository, WentseChen/Verlog at 589eb7e, verl/trainer/ppo/core_algos.py and
ray_trainer.py; verl does the same for its own GAE):
- `kl_reward`: the KL to the reference folded into the per-token rewards before GAE, with the
  k1 estimate log pi_old - log pi_ref on every output token (`use_kl_in_reward`, coefficient
  0.001 in its launch scripts), instead of a k3 term in the loss.
- `whiten`: the advantages of the whole batch shifted to zero mean and scaled to unit variance
  (over the output tokens, unbiased variance, eps 1e-8) before the policy loss; the value
  targets (`returns`) are computed from the raw advantages first.

Values: `values[b, t]` is V(s_t), the critic's value of the state in which output token t was
sampled (the learner takes it from the hidden state of the token before t, the one whose logits
sampled t). `returns = advantages + values` are the value head's regression targets (the
lambda-returns). Everything is 0.0 off the mask. The recursion is sequential per trajectory, so
it runs over Python floats (a 32K-token rollout takes milliseconds); `gae_reference` is a
direct, slow transcription of the definition (sums of discounted TD residuals) the tests
compare against.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

# Verlog's values (paper 000, App. B.3.1): the config defaults for `train.advantage: verlog`.
VERLOG_GAMMA_STEP = 0.99
VERLOG_LAMBDA_STEP = 0.95
VERLOG_GAMMA_TOKEN = 1.0
VERLOG_LAMBDA_TOKEN = 1.0


class GAE(NamedTuple):
    """Per-token advantages and value targets."""

    advantages: Tensor  # (B, T) float64, 0.0 off the mask
    returns: Tensor  # (B, T) float64: advantages + values (the critic's targets), 0.0 off mask


def compute_dual_discount_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    turn_ids: Tensor,
    *,
    gamma_token: float = VERLOG_GAMMA_TOKEN,
    lambda_token: float = VERLOG_LAMBDA_TOKEN,
    gamma_step: float = VERLOG_GAMMA_STEP,
    lambda_step: float = VERLOG_LAMBDA_STEP,
    bootstrap: Tensor | None = None,
) -> GAE:
    """Verlog's dual-discount GAE (paper 000 Eq. 2) over the output tokens of each rollout.

    rewards: (B, T) float, r_t at output tokens (an outcome reward sits on the last output
        token of the last turn); ignored off the mask.
    values: (B, T) float, V(s_t) at output tokens; ignored off the mask.
    mask: (B, T) bool, is_output.   turn_ids: (B, T) int64, each output token's turn.
    bootstrap: (B,) V(s_{T+1}) of truncated rollouts, 0.0 for finished ones (None: all 0).
    Returns `GAE` in float64.
    """
    _check(rewards, values, mask, turn_ids, bootstrap)
    for name, value in (("gamma_token", gamma_token), ("lambda_token", lambda_token),
                        ("gamma_step", gamma_step), ("lambda_step", lambda_step)):  # fmt: skip
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    advantages = torch.zeros(rewards.shape, dtype=torch.float64)
    ends = bootstrap.tolist() if bootstrap is not None else [0.0] * rewards.shape[0]
    for b in range(rewards.shape[0]):
        positions = mask[b].nonzero().flatten().tolist()
        r = rewards[b, positions].double().tolist()
        v = values[b, positions].double().tolist()
        turn = turn_ids[b, positions].tolist()
        out = [0.0] * len(positions)
        next_value, next_adv, next_turn = float(ends[b]), 0.0, None  # after the last token
        for i in range(len(positions) - 1, -1, -1):
            same_turn = next_turn == turn[i]
            gamma = gamma_token if same_turn else gamma_step
            lam = lambda_token if same_turn else lambda_step
            delta = r[i] + gamma * next_value - v[i]
            out[i] = delta + gamma * lam * next_adv
            next_value, next_adv, next_turn = v[i], out[i], turn[i]
        advantages[b, positions] = torch.tensor(out, dtype=torch.float64)
    returns = torch.where(mask, advantages + values.double(), 0.0)
    return GAE(advantages, returns)


def compute_gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    bootstrap: Tensor | None = None,
) -> GAE:
    """Per-token GAE (gamma, lambda) over the output tokens, environment tokens skipped.

    rewards, values, mask, bootstrap: as in `compute_dual_discount_gae`. Defaults are the LOOP
    paper's critic baseline (gamma = lambda = 1: A_t = sum of later rewards - V(s_t)).
    """
    turn_ids = torch.zeros(mask.shape, dtype=torch.long)  # one level: turns do not matter
    return compute_dual_discount_gae(
        rewards, values, mask, turn_ids, gamma_token=gamma, lambda_token=lam,
        gamma_step=gamma, lambda_step=lam, bootstrap=bootstrap,
    )  # fmt: skip


def gae_reference(
    rewards: list[float],
    values: list[float],
    turns: list[int],
    *,
    gamma_token: float,
    lambda_token: float,
    gamma_step: float,
    lambda_step: float,
    bootstrap: float = 0.0,
) -> list[float]:
    """The slow definition for one rollout's output tokens (lists, in order).

    A_t = sum_{k >= t} (prod_{t <= j < k} gamma_j lambda_j) delta_k, with delta_k =
    r_k + gamma_k V_{k+1} - V_k, where (gamma_j, lambda_j) is the token pair when tokens j and
    j + 1 share a turn and the step pair otherwise, and V after the last token is `bootstrap`.
    """
    n = len(rewards)
    gammas = [gamma_token if j + 1 < n and turns[j + 1] == turns[j] else gamma_step
              for j in range(n)]  # fmt: skip
    lambdas = [lambda_token if j + 1 < n and turns[j + 1] == turns[j] else lambda_step
               for j in range(n)]  # fmt: skip
    next_values = [*values[1:], bootstrap]
    deltas = [rewards[k] + gammas[k] * next_values[k] - values[k] for k in range(n)]
    out = []
    for t in range(n):
        total, weight = 0.0, 1.0
        for k in range(t, n):
            total += weight * deltas[k]
            weight *= gammas[k] * lambdas[k]
        out.append(total)
    return out


def _check(
    rewards: Tensor, values: Tensor, mask: Tensor, turn_ids: Tensor, bootstrap: Tensor | None
) -> None:
    if rewards.dim() != 2 or values.shape != rewards.shape or mask.shape != rewards.shape:
        raise ValueError(
            f"rewards, values and mask must be (B, T): {tuple(rewards.shape)}, "
            f"{tuple(values.shape)}, {tuple(mask.shape)}"
        )
    if turn_ids.shape != mask.shape:
        raise ValueError(f"turn_ids {tuple(turn_ids.shape)} vs mask {tuple(mask.shape)}")
    if mask.dtype != torch.bool:
        raise ValueError(f"mask must be bool, got {mask.dtype}")
    if bootstrap is not None and bootstrap.shape != rewards.shape[:1]:
        raise ValueError(f"bootstrap must be (B,), got {tuple(bootstrap.shape)}")


def kl_reward(old_logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, coef: float) -> Tensor:
    """The per-token reward for staying near the reference ([V] `apply_kl_penalty`):
    -coef * (log pi_old - log pi_ref) (the k1 estimate) on output tokens, 0.0 elsewhere.

    old_logprobs, ref_logprobs: (B, T) log-probs of the sampled tokens under the policy that
    sampled them (the learner's recompute) and under the reference; mask: (B, T) bool.
    Returns (B, T) float64, to add to the outcome rewards before `compute_*gae`.
    """
    if old_logprobs.shape != mask.shape or ref_logprobs.shape != mask.shape:
        raise ValueError(
            f"log-probs {tuple(old_logprobs.shape)}, {tuple(ref_logprobs.shape)} vs mask "
            f"{tuple(mask.shape)}"
        )
    k1 = old_logprobs.double() - ref_logprobs.double()
    return torch.where(mask, -coef * k1, torch.zeros_like(k1))


def whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """`values` shifted and scaled to zero mean and unit variance over the masked entries
    ([V] and verl `masked_whiten`: unbiased variance, `eps` inside the square root); 0.0
    off the mask. values, mask: same shape; fewer than two masked entries: a ValueError (no
    variance to scale by)."""
    if values.shape != mask.shape or mask.dtype != torch.bool:
        raise ValueError(f"values {tuple(values.shape)} and a bool mask {tuple(mask.shape)}")
    n = int(mask.sum())
    if n < 2:
        raise ValueError(f"whitening needs at least two masked values, got {n}")
    picked = values[mask].double()
    mean = picked.mean()
    variance = ((picked - mean) ** 2).sum() / (n - 1)
    out = (values.double() - mean) * torch.rsqrt(variance + eps)
    return torch.where(mask, out, torch.zeros_like(out)).to(values.dtype)
