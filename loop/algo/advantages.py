"""Advantages over groups of rollouts of the same task: pure tensor-in, tensor-out functions.

A batch of rollouts is laid out as `G` groups (one per task) of `K` slots. `present[g, k]` is
True for a rollout that finished and has a reward; it is False for padding slots and for
rollouts that failed for an infrastructure reason (sandbox crash, generator error, ...). Such a
rollout is never scored as 0.0: it is excluded, and its group is re-baselined over the
survivors (`n` = number present). A group with fewer than `min_group_size` survivors is dropped
(no rollout of it gets a gradient). `count_exclusions` gives the numbers the trainer logs.

Where each formula comes from (loop_spec.md = ../shared/reference/loop_spec.md):
- `compute_loo_advantages`: LOOP's default (paper [P] Eq. 3; reference code
  `_compute_adv_estimates`, `baseline=leave_one_out`, loop_spec.md 2.3):
  A_i = R_i - (sum_j R_j - R_i) / (n - 1) = n / (n - 1) * (R_i - mean R). With
  `normalize_std` it divides by the population std of the group's returns floored at 1e-7
  (`adv_normalization`, the paper's "LOOP RwNorm").
- `compute_group_advantages`: GRPO (DeepSeekMath, Shao et al. 2024; MT-GRPO paper Eq. 3):
  (R_i - mean R) / (std R + eps) with the sample std; `normalize_std=False` gives the
  reference code's `leave_none_out` baseline, R_i - mean R.
- `compute_reinforce_advantages`: A = R (no baseline; MT-GRPO paper Eq. 6).
- `compute_filter_advantages`: expert iteration ([P] App. C, "EI"): A = 1 for a rollout whose
  return reaches the threshold (1.0 in the paper), else 0; with the cross-entropy update the
  kept rollouts are imitated and the rest ignored.
- `compute_turn_advantages`: turn-level credit, MT-GRPO Eq. 9 (group-normalised) and MT-RLOO
  Eq. 11 (leave-one-out), generalised from two turns to many; see its docstring.
- `filter_by_magnitude`: the reference code's `_filter_rollouts` threshold |A| >= 0.01
  (loop_spec.md 2.4), and `round_to_world_size` its rounding of the kept count to a multiple of
  the world size (next largest |A| first, else the weakest kept dropped).

Advantages come back in the floating dtype of `rewards` (float32 in the trainer; tests use
float64), and are exactly 0.0 wherever `valid` is False.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

LOO_STD_EPS = 1e-7  # the reference code floors the population std here (`adv_normalization`)
GRPO_STD_EPS = 1e-6  # added to the sample std, as verl's compute_grpo_outcome_advantage does


class Advantages(NamedTuple):
    """One advantage per rollout, and which rollouts and groups take part."""

    advantages: Tensor  # (G, K) float; 0.0 where not valid or the group was dropped
    valid: Tensor  # (G, K) bool: the rollout gets a gradient (a survivor of a kept group)
    kept_groups: Tensor  # (G,) bool: the group had >= min_group_size survivors


class TurnAdvantages(NamedTuple):
    """One advantage per turn of each rollout (the trainer broadcasts it to the turn's tokens)."""

    turn_advantages: Tensor  # (G, K, T_max) float; 0.0 at padded turns and invalid rollouts
    valid: Tensor  # (G, K) bool, as in `Advantages`
    kept_groups: Tensor  # (G,) bool, as in `Advantages`


class AdvantageCounts(NamedTuple):
    """Counts for metrics (`rollout/excluded`, `rollout/dropped_groups`, ...)."""

    n_rollouts: int  # slots that held a rollout (attempted)
    n_excluded: int  # attempted but not present: infrastructure failures
    n_dropped_groups: int  # groups left with fewer than min_group_size survivors
    n_dropped_rollouts: int  # survivors that lost their gradient because their group was dropped
    n_valid: int  # rollouts that get an advantage


def compute_loo_advantages(
    rewards: Tensor,
    present: Tensor,
    *,
    min_group_size: int = 2,
    normalize_std: bool = False,
    std_eps: float = LOO_STD_EPS,
) -> Advantages:
    """Leave-one-out advantages: A_i = R_i - mean_{j != i} R_j over the group's survivors.

    rewards: (G, K) float; values where `present` is False are ignored (NaN is fine there).
    present: (G, K) bool.
    normalize_std: divide by the population std of the group's present returns, floored at
        `std_eps` (max(std, std_eps)), as the reference code's `adv_normalization` does.
    Returns `Advantages` with (G, K) advantages. `min_group_size` must be >= 2: the baseline
    of a lone rollout is undefined.
    """
    values, valid, kept = _survivors(rewards, present, min_group_size, minimum=2)
    advantages = _relative_to_group(values, valid, leave_one_out=True)
    if normalize_std:
        std = _group_std(values, valid, sample=False)
        advantages = advantages / std.clamp(min=std_eps)
    return Advantages(torch.where(valid, advantages, 0.0), valid, kept)


def compute_group_advantages(
    rewards: Tensor,
    present: Tensor,
    *,
    min_group_size: int = 2,
    normalize_std: bool = True,
    std_eps: float = GRPO_STD_EPS,
) -> Advantages:
    """GRPO advantages: (R_i - mean R) / (std R + std_eps) over the group's survivors.

    rewards, present: (G, K), as in `compute_loo_advantages`.
    Which std: the *sample* std (Bessel's correction, divide by n - 1). DeepSeekMath writes
    only "std"; the open implementations that define GRPO in practice (TRL's GRPOTrainer,
    which the MT-GRPO code builds on, and verl's compute_grpo_outcome_advantage) call
    `torch.std`, whose default is the sample std, and add eps (1e-4 in TRL, 1e-6 in verl; we
    add 1e-6). With one survivor (min_group_size=1) the std is taken as 0, so A = 0.
    normalize_std=False: the leave-none-out baseline R_i - mean R (reference `leave_none_out`).
    """
    values, valid, kept = _survivors(rewards, present, min_group_size, minimum=1)
    advantages = _relative_to_group(values, valid, leave_one_out=False)
    if normalize_std:
        advantages = advantages / (_group_std(values, valid, sample=True) + std_eps)
    return Advantages(torch.where(valid, advantages, 0.0), valid, kept)


def compute_reinforce_advantages(
    rewards: Tensor, present: Tensor, *, min_group_size: int = 1
) -> Advantages:
    """REINFORCE without a baseline: A_i = R_i for every present rollout of a kept group.

    rewards, present: (G, K). Returns `Advantages` with (G, K) advantages.
    """
    values, valid, kept = _survivors(rewards, present, min_group_size, minimum=1)
    return Advantages(torch.where(valid, values, 0.0), valid, kept)


def compute_filter_advantages(
    rewards: Tensor, present: Tensor, *, threshold: float = 1.0, min_group_size: int = 1
) -> Advantages:
    """Expert iteration's selection: A_i = 1 where R_i >= threshold, else 0 (present rollouts).

    rewards, present: (G, K). `valid` is every present rollout of a kept group; the magnitude
    filter (|A| >= adv_threshold) then keeps exactly the rollouts at or above the threshold.
    """
    values, valid, kept = _survivors(rewards, present, min_group_size, minimum=1)
    reached = valid & (values >= threshold)
    return Advantages(reached.to(values.dtype), valid, kept)


def compute_turn_advantages(
    rewards: Tensor,
    turn_rewards: Tensor,
    present: Tensor,
    turn_mask: Tensor,
    *,
    turn_coef: float = 1.0,
    min_group_size: int = 2,
    baseline: Literal["loo", "group"] = "loo",
    normalize_std: bool = False,
    std_eps: float | None = None,
    credit_final_turn: bool = False,
) -> TurnAdvantages:
    """Turn-level credit (MT-GRPO Eq. 9 / MT-RLOO Eq. 11), generalised to many turns.

    rewards: (G, K) outcome rewards R^O.   present: (G, K) bool.
    turn_rewards: (G, K, T_max) verifiable per-turn rewards R^T (e.g. 1.0 if the turn's code ran
        without an error); ignored where `turn_mask` is False.
    turn_mask: (G, K, T_max) bool, True for the rollout's real turns.

    The paper (two turns: a tool call, then the answer) sets
        A_{i,1} = A^T_i + lambda * A^O_i,    A_{i,2} = A^O_i,
    where A^O is the group-relative advantage of the outcome reward and A^T that of the first
    turn's reward, both over the G rollouts of the question. Generalised here:
    - A^O_i: the baseline of `compute_loo_advantages` (`baseline="loo"`, MT-RLOO, LOOP's
      default) or `compute_group_advantages` (`"group"`, MT-GRPO) on `rewards`;
      `normalize_std` and `std_eps` (default: that function's) as there.
    - Every turn but the last is a "tool turn" (the paper's turn 1): A_{i,k} = A^T_{i,k} +
      turn_coef * A^O_i. `turn_coef` is the paper's lambda ("turn-level advantage
      coefficient"; it scales the outcome term).
    - The last turn (the paper's answer turn) gets A^O_i alone; its own turn reward is ignored,
      as the paper's answer turn has none. `credit_final_turn=True` treats it as a tool turn.
    - A^T_{i,k} compares turn k of rollout i with turn k of the group's other rollouts (the
      paper compares first turns across the group): same baseline as A^O, over the valid
      rollouts whose turn k is a tool turn. Fewer than 2 such turns: A^T_{i,k} = 0.
    A single-turn rollout therefore gets A^O, i.e. the outcome-only (GRPO-OR) advantage.
    As in the paper, a turn is credited with its own turn reward only: no sum of later turns'
    rewards (no return-to-go, no discount); later consequences reach it through A^O.
    Returns `TurnAdvantages`; groups are kept and dropped on the outcome rewards as in
    `compute_loo_advantages`.
    """
    if turn_rewards.dim() != 3 or turn_rewards.shape[:2] != rewards.shape:
        raise ValueError(f"turn_rewards {tuple(turn_rewards.shape)} vs rewards {rewards.shape}")
    if turn_mask.shape != turn_rewards.shape or turn_mask.dtype != torch.bool:
        raise ValueError(f"turn_mask must be bool {tuple(turn_rewards.shape)}: {turn_mask.shape}")
    if baseline == "loo":
        eps = LOO_STD_EPS if std_eps is None else std_eps
        outcome = compute_loo_advantages(
            rewards,
            present,
            min_group_size=min_group_size,
            normalize_std=normalize_std,
            std_eps=eps,
        )
    elif baseline == "group":
        eps = GRPO_STD_EPS if std_eps is None else std_eps
        outcome = compute_group_advantages(
            rewards,
            present,
            min_group_size=min_group_size,
            normalize_std=normalize_std,
            std_eps=eps,
        )
    else:
        raise ValueError(f"baseline must be 'loo' or 'group', got {baseline!r}")
    real = turn_mask & outcome.valid[:, :, None]
    positions = torch.arange(turn_mask.shape[2], device=turn_mask.device)
    last = torch.where(turn_mask, positions, -1).amax(dim=2, keepdim=True)  # (G, K, 1)
    final = real & (positions == last)
    tool = real if credit_final_turn else real & ~final
    turn_values = _as_float(turn_rewards).to(outcome.advantages.dtype)
    # Turn k of rollout i against turn k of the group's other rollouts: the helpers reduce over
    # dim 1 (the K slots), so on (G, K, T) each turn position gets its own baseline.
    turn_adv = _relative_to_group(turn_values, tool, leave_one_out=baseline == "loo")
    if normalize_std:
        std = _group_std(turn_values, tool, sample=baseline == "group")
        turn_adv = turn_adv / (std.clamp(min=eps) if baseline == "loo" else std + eps)
    enough = tool.sum(dim=1, keepdim=True) >= 2
    turn_adv = torch.where(tool & enough, turn_adv, 0.0)
    outcome_adv = outcome.advantages[:, :, None]
    combined = torch.where(tool, turn_adv + turn_coef * outcome_adv, outcome_adv)
    combined = torch.where(real, combined, 0.0)
    return TurnAdvantages(combined, outcome.valid, outcome.kept_groups)


def filter_by_magnitude(advantages: Tensor, valid: Tensor, threshold: float) -> Tensor:
    """Which rollouts to train on: keep = valid & |A| >= threshold (reference, 0.01).

    advantages: (G, K), or (G, K, T_max) per-turn advantages, where a rollout is kept if any of
        its turns clears the threshold (padded turns hold 0.0).
    valid: (G, K) bool.  Returns (G, K) bool. A group whose rewards are all equal has A = 0
    everywhere and is dropped entirely for any threshold > 0.
    """
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0, got {threshold}")
    magnitude = advantages.abs()
    if magnitude.dim() == 3:
        magnitude = magnitude.amax(dim=2)
    if magnitude.shape != valid.shape:
        raise ValueError(f"advantages {tuple(advantages.shape)} vs valid {tuple(valid.shape)}")
    return valid & (magnitude >= threshold)


def round_to_world_size(
    keep: list[bool], magnitude: list[float], present: list[bool], world: int
) -> list[bool]:
    """The kept flags with their count rounded up to a multiple of `world` (the learner
    processes, which take equal shards), as the reference code does after its filter.

    keep, magnitude (max |A| over the rollout's turns), present: one per rollout. Rollouts not
    kept but present are added largest |A| first (the earlier one first on a tie); when none is
    left, the weakest kept are dropped (the earlier one first on a tie) until the count divides.
    Returns a new list; `keep` itself when `world` is 1.
    """
    keep = list(keep)
    if world <= 1:
        return keep
    spare = sorted(
        (i for i, k in enumerate(keep) if not k and present[i]), key=lambda i: -magnitude[i]
    )
    while sum(keep) % world and spare:
        keep[spare.pop(0)] = True
    while sum(keep) % world:  # not enough rollouts to top up: drop the weakest kept
        weakest = min((i for i, k in enumerate(keep) if k), key=lambda i: magnitude[i])
        keep[weakest] = False
    return keep


def count_exclusions(
    present: Tensor, kept_groups: Tensor, attempted: Tensor | None = None
) -> AdvantageCounts:
    """Counts of excluded rollouts and dropped groups, for metrics.

    present: (G, K) bool as given to the advantage functions.
    kept_groups: (G,) bool from their result.
    attempted: (G, K) bool, True for slots that held a rollout (False for padding); None
        means every slot held one.
    """
    if attempted is None:
        attempted = torch.ones_like(present)
    if bool((present & ~attempted).any()):
        raise ValueError("a slot is present but was not attempted")
    dropped = present & ~kept_groups[:, None]
    return AdvantageCounts(
        n_rollouts=int(attempted.sum()),
        n_excluded=int((attempted & ~present).sum()),
        n_dropped_groups=int((~kept_groups).sum()),
        n_dropped_rollouts=int(dropped.sum()),
        n_valid=int((present & kept_groups[:, None]).sum()),
    )


# ----------------------------------------------------------------------------- helpers


def _check_group_inputs(
    rewards: Tensor, present: Tensor, min_group_size: int, minimum: int
) -> None:
    if rewards.dim() != 2 or present.shape != rewards.shape:
        raise ValueError(f"rewards and present must be (G, K): {rewards.shape}, {present.shape}")
    if present.dtype != torch.bool:
        raise ValueError(f"present must be bool, got {present.dtype}")
    if min_group_size < minimum:
        raise ValueError(f"min_group_size must be >= {minimum}, got {min_group_size}")


def _survivors(
    rewards: Tensor, present: Tensor, min_group_size: int, minimum: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Checked float rewards (G, K), valid rollouts (G, K) and kept groups (G,)."""
    _check_group_inputs(rewards, present, min_group_size, minimum)
    kept = present.sum(dim=1) >= min_group_size
    return _as_float(rewards), present & kept[:, None], kept


def _as_float(values: Tensor) -> Tensor:
    return values if values.is_floating_point() else values.to(torch.float32)


def _relative_to_group(values: Tensor, include: Tensor, *, leave_one_out: bool) -> Tensor:
    """values - baseline, the baseline over the included entries along dim 1 (the K slots).

    values, include: (G, K, ...). Leave-one-out baseline: (sum - v_i) / (n - 1); otherwise
    the mean. Entries that are not included, or whose baseline is undefined (n - 1 = 0 for
    leave-one-out), come back as 0.0.
    """
    zeroed = _shift_to_group_max(values, include)
    n = include.sum(dim=1, keepdim=True).to(values.dtype)
    total = zeroed.sum(dim=1, keepdim=True)
    if leave_one_out:
        baseline = (total - zeroed) / (n - 1).clamp(min=1)
        defined = include & (n >= 2)
    else:
        baseline = total / n.clamp(min=1)
        defined = include
    return torch.where(defined, zeroed - baseline, 0.0)


def _group_std(values: Tensor, include: Tensor, *, sample: bool) -> Tensor:
    """Std of the included entries along dim 1, keepdim; population (/n) or sample (/(n-1)).

    With a single entry (or none) the std is 0.0.
    """
    zeroed = _shift_to_group_max(values, include)
    n = include.sum(dim=1, keepdim=True).to(values.dtype)
    mean = zeroed.sum(dim=1, keepdim=True) / n.clamp(min=1)
    squares = torch.where(include, (zeroed - mean) ** 2, 0.0).sum(dim=1, keepdim=True)
    return (squares / ((n - 1) if sample else n).clamp(min=1)).sqrt()


def _shift_to_group_max(values: Tensor, include: Tensor) -> Tensor:
    """values minus the largest included value of their group (dim 1); 0.0 where not included.

    Baselines and stds do not change under a shift, but sums of shifted values are exact for a
    group of equal rewards (all 0.0): unshifted, (sum - R_i) / (n - 1) can miss R_i by ~1e-17,
    which RwNorm's 1e-7 std floor would blow up to ~1e-10 instead of an exact 0.
    """
    top = torch.where(include, values, -math.inf).amax(dim=1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    return torch.where(include, values - top, 0.0)
