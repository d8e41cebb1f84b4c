"""The preference baselines' math: pairs from returns, and the DMPO / DPO loss. Pure tensors.

Two rows of the LOOP paper's Table 1 ([P] App. C) train on preference pairs instead of
advantages:
- **DMPO**: "two rollouts are sampled per task; they form a preference pair if their return
  gap exceeds a threshold; training uses the turn-level DMPO loss on-policy, with the reference
  model refreshed every iteration" ([P] App. C). `preference_signs` pairs rollouts 2j and 2j+1
  of a group (with K = 2, [P]'s one pair per task; a larger K gives K/2 independent pairs).
- **DPO-MCTS**: pairs of candidate turns from one node of a search tree; their loss is the same
  one with one turn per sequence, where DMPO's weights are 1 and it is plain DPO
  (loop/algo/mcts.py picks those pairs).

The DMPO loss (Shi et al. 2024, "Direct Multi-turn Preference Optimization for Language
Agents", arXiv 2406.14868, [DMPO] its Eq. 13; read at https://deep-paper.org/en/paper/2406.14868
and https://www.emergentmind.com/topics/direct-multi-turn-preference-optimization-dmpo):
replacing DPO's policy constraint by one on the discounted state-action occupancy measure, and
normalising the Bradley-Terry model by the length of each trajectory, gives

    L = -log sigmoid( beta * [ S(tau_w) - S(tau_l) ] ),
    S(tau) = sum_{t < T} phi(t, T) * log( pi_theta(a_t | s_t) / pi_ref(a_t | s_t) ),
    phi(t, T) = (1 - gamma^(T - t)) / (1 - gamma^T)

with T the trajectory's number of turns and a_t the whole turn t (the sum of its tokens'
log-probs). phi weighs early turns more (phi(0, T) = 1 ... phi(T-1, T) = (1-gamma)/(1-gamma^T));
at gamma = 1 it is its limit (T - t) / T. With one turn phi = 1 and L is DPO's (Rafailov et al.
2023).

The reference is the policy at the iteration's start ([P]: "refreshed every iteration"): the
learner's recomputed old log-probs, never the LoRA-disabled base. Its consequence, used by the
learner (loop/learner/objective.py): at the iteration's one on-policy step the policy IS the
reference, so every S is 0 and the gradient is exactly -beta/2 * grad(S_w - S_l).

`dmpo_loss` is the form the learner can use one sequence at a time (it never holds both members
of a pair in one forward pass): each member is given its partner's score as a constant, and its
loss m = -log sigmoid(beta * sign * (S_self - S_partner)) has, with respect to its own log-probs,
exactly the pair loss's gradient. So the pair's two members' gradients sum to grad L; their
values are halved (m - m.detach()/2), so that they also sum to L. `dpo_pair_loss` is the pair
form, the slow reference the tests compare against.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn.functional import logsigmoid


class PreferenceSigns(NamedTuple):
    """Which rollout of each pair won: +1 (chosen), -1 (rejected), 0 (no pair)."""

    signs: Tensor  # (G, K) float: +1 / -1 for the members of a kept pair, else 0
    valid: Tensor  # (G, K) bool: a member of a kept pair
    kept_groups: Tensor  # (G,) bool: the group formed at least one pair


class PreferenceLoss(NamedTuple):
    """Per-sequence loss and diagnostics."""

    loss: Tensor  # (B,) differentiable; a kept pair's two losses sum to its DMPO loss
    scores: Tensor  # (B,) S = sum_t phi(t, T) log(pi/pi_ref) over turns, detached
    log_ratio_sum: Tensor  # (B,) sum over output tokens of (logprobs - ref_logprobs), detached


def preference_signs(rewards: Tensor, present: Tensor, *, margin: float) -> PreferenceSigns:
    """Pairs (2j, 2j+1) of each group whose returns differ by more than `margin` ([P] App. C's
    threshold): the higher one +1, the lower -1. rewards, present: (G, K); a pair with a member
    not present (an infrastructure failure), and an unpaired last slot of an odd K, get 0."""
    if rewards.dim() != 2 or present.shape != rewards.shape:
        raise ValueError(f"rewards and present must be (G, K): {rewards.shape}, {present.shape}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    width = rewards.shape[1] - rewards.shape[1] % 2
    first, second = rewards[:, 0:width:2].double(), rewards[:, 1:width:2].double()
    both = present[:, 0:width:2] & present[:, 1:width:2]
    gap = first - second
    kept = both & (gap.abs() > margin)
    sign = torch.where(kept, torch.sign(gap), torch.zeros_like(gap))
    signs = torch.zeros(rewards.shape, dtype=torch.float64)
    signs[:, 0:width:2], signs[:, 1:width:2] = sign, -sign
    valid = torch.zeros(rewards.shape, dtype=torch.bool)
    valid[:, 0:width:2], valid[:, 1:width:2] = kept, kept
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return PreferenceSigns(signs.to(dtype), valid, valid.any(dim=1))


def dmpo_turn_weights(num_turns: Tensor, max_turns: int, *, gamma: float) -> Tensor:
    """phi(t, T) = (1 - gamma^(T-t)) / (1 - gamma^T) for t < T, else 0 ([DMPO] Eq. 13; gamma = 1:
    (T - t) / T). num_turns: (B,) int, T of each sequence. Returns (B, max_turns) float64."""
    if not 0 < gamma <= 1:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    t = torch.arange(max_turns, dtype=torch.float64)[None, :]
    big_t = num_turns.to(torch.float64)[:, None]
    if gamma == 1.0:
        weights = (big_t - t) / big_t.clamp(min=1)
    else:
        weights = (1 - gamma ** (big_t - t)) / (1 - gamma**big_t).clamp(min=1e-300)
    return torch.where(t < big_t, weights, torch.zeros_like(weights))


def dmpo_scores(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, turn_ids: Tensor, *, gamma: float
) -> Tensor:
    """S = sum_t phi(t, T) sum_{tokens of turn t} (logprobs - ref_logprobs), per sequence.

    logprobs, ref_logprobs: (B, L) float; mask: (B, L) bool (the output tokens; `ref_logprobs`
    may be NaN off it); turn_ids: (B, L) int, each output token's turn (-1 elsewhere). T is the
    number of turns the sequence has output tokens of (max turn id + 1). Returns (B,), in
    `logprobs`' dtype and differentiable through it."""
    if not logprobs.shape == ref_logprobs.shape == mask.shape == turn_ids.shape:
        raise ValueError(f"shapes differ: {logprobs.shape}, {ref_logprobs.shape}, {mask.shape}")
    log_ratio = torch.where(mask, logprobs - torch.nan_to_num(ref_logprobs), 0.0)
    turns = torch.where(mask, turn_ids, -1)
    num_turns = turns.amax(dim=1) + 1  # (B,): 0 without output tokens
    width = int(num_turns.max()) if turns.numel() else 0
    per_turn = log_ratio.new_zeros(logprobs.shape[0], max(width, 1))
    index = turns.clamp(min=0)
    per_turn = per_turn.scatter_add(1, index, log_ratio)  # off-mask entries add 0 to turn 0
    weights = dmpo_turn_weights(num_turns, per_turn.shape[1], gamma=gamma)
    return (per_turn * weights.to(per_turn.dtype)).sum(dim=1)


def dpo_pair_loss(chosen_scores: Tensor, rejected_scores: Tensor, *, beta: float) -> Tensor:
    """The pair form, -log sigmoid(beta (S_w - S_l)) ([DMPO] Eq. 13; DPO's with one turn).
    chosen_scores, rejected_scores: (P,) the two members' `dmpo_scores`. Returns (P,)."""
    return -logsigmoid(beta * (chosen_scores - rejected_scores))


def dmpo_loss(
    logprobs: Tensor,
    ref_logprobs: Tensor,
    mask: Tensor,
    turn_ids: Tensor,
    signs: Tensor,
    partner_scores: Tensor,
    *,
    beta: float,
    gamma: float,
) -> PreferenceLoss:
    """Each sequence's share of its pair's DMPO loss, computed from it alone (module docstring).

    logprobs, ref_logprobs, mask, turn_ids: (B, L) as in `dmpo_scores`; signs: (B,) +1 for a
    chosen sequence, -1 for a rejected one, 0 for none (its loss is 0); partner_scores: (B,) the
    partner's current S, a constant. Returns per-sequence losses whose sum over a pair is
    L(pair) in value and in gradient."""
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    scores = dmpo_scores(logprobs, ref_logprobs, mask, turn_ids, gamma=gamma)
    signs = signs.to(scores.dtype)
    margin = signs * (scores - partner_scores.to(scores.dtype).detach())
    member = -logsigmoid(beta * margin) * signs.abs()
    log_ratio = torch.where(mask, logprobs - torch.nan_to_num(ref_logprobs), 0.0)
    return PreferenceLoss(
        member - member.detach() / 2, scores.detach(), log_ratio.sum(dim=1).detach()
    )
