"""`loop.algo.advantages`: every advantage function against numbers worked out by hand, the edge
cases (equal rewards, infrastructure failures, a lone survivor, padding, K = 2), and the vectorised
functions against slow per-group loops.

Run: python -m pytest tests/loop/test_advantages.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from loop.algo.advantages import (
    compute_filter_advantages,
    compute_group_advantages,
    compute_loo_advantages,
    compute_reinforce_advantages,
    compute_turn_advantages,
    count_exclusions,
    filter_by_magnitude,
    round_to_world_size,
)

T, F = True, False
NAN = math.nan


def t64(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def mask(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def close(actual: torch.Tensor, expected: list, tol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, t64(expected), rtol=0, atol=tol)


# ---------------------------------------------------------------------- leave-one-out (LOOP)


def test_loo_by_hand() -> None:
    # R = [1, 0, 0.5, 0.5], n = 4, sum = 2.
    # b_0 = (2 - 1) / 3 = 1/3     A_0 = 1 - 1/3   =  2/3
    # b_1 = (2 - 0) / 3 = 2/3     A_1 = 0 - 2/3   = -2/3
    # b_2 = (2 - .5) / 3 = 1/2    A_2 = .5 - .5   =  0      (and A_3 the same)
    out = compute_loo_advantages(t64([[1.0, 0.0, 0.5, 0.5]]), mask([[T, T, T, T]]))
    close(out.advantages, [[2 / 3, -2 / 3, 0.0, 0.0]])
    assert out.valid.tolist() == [[T, T, T, T]] and out.kept_groups.tolist() == [T]
    assert out.advantages.dtype == torch.float64


def test_loo_rebaselines_over_survivors_of_an_infra_failure() -> None:
    # Slot 3 failed (sandbox crash): its reward (NaN here) is ignored and n = 3, sum = 1.5.
    # A_0 = 1 - (1.5 - 1) / 2 = 0.75;  A_1 = 0 - 1.5 / 2 = -0.75;  A_2 = 0.5 - 1 / 2 = 0.
    out = compute_loo_advantages(t64([[1.0, 0.0, 0.5, NAN]]), mask([[T, T, T, F]]))
    close(out.advantages, [[0.75, -0.75, 0.0, 0.0]])
    assert out.valid.tolist() == [[T, T, T, F]]
    assert not torch.isnan(out.advantages).any()


def test_loo_drops_a_group_left_with_one_survivor() -> None:
    rewards = t64([[0.7, NAN, NAN], [1.0, 0.0, NAN]])
    present = mask([[T, F, F], [T, T, F]])
    out = compute_loo_advantages(rewards, present)
    # group 0: one survivor -> dropped, all zeros; group 1: K = 2 effectively: A = [1, -1].
    close(out.advantages, [[0.0, 0.0, 0.0], [1.0, -1.0, 0.0]])
    assert out.kept_groups.tolist() == [F, T]
    assert out.valid.tolist() == [[F, F, F], [T, T, F]]


def test_loo_with_padding_slots() -> None:
    # Group 0 has K = 3 rollouts, group 1 only 2 (slot 2 is padding, filled with 0.0).
    # group 0: sum 2, n 3: A = [1 - 1/2, 0 - 2/2, 1 - 1/2] = [0.5, -1, 0.5]
    # group 1: n 2: A = [1 - 0, 0 - 1] = [1, -1]
    out = compute_loo_advantages(
        t64([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]]), mask([[T, T, T], [T, T, F]])
    )
    close(out.advantages, [[0.5, -1.0, 0.5], [1.0, -1.0, 0.0]])


def test_loo_k2_and_all_equal_rewards() -> None:
    out = compute_loo_advantages(t64([[1.0, 0.0], [0.3, 0.3]]), mask([[T, T], [T, T]]))
    close(out.advantages, [[1.0, -1.0], [0.0, 0.0]])
    # The equal group is kept (it has survivors) but every |A| = 0: the filter drops it.
    assert out.kept_groups.tolist() == [T, T]
    assert filter_by_magnitude(out.advantages, out.valid, 0.01).tolist() == [[T, T], [F, F]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equal_rewards_give_exactly_zero(dtype: torch.dtype) -> None:
    # (sum - R_i) / (n - 1) in floating point can miss R_i by one rounding step (~1e-17), and
    # RwNorm's 1e-7 std floor would turn that into ~1e-10; the shift to the group max makes
    # it an exact 0 for every function.
    rewards = torch.tensor([[0.1] * 5, [0.7] * 5, [1 / 3] * 5, [0.2] * 5], dtype=dtype)
    present = torch.ones(4, 5, dtype=torch.bool)
    for out in (
        compute_loo_advantages(rewards, present),
        compute_loo_advantages(rewards, present, normalize_std=True),
        compute_group_advantages(rewards, present),
        compute_group_advantages(rewards, present, normalize_std=False),
    ):
        assert (out.advantages == 0).all(), out.advantages


def test_loo_normalize_std_by_hand() -> None:
    # R = [1, 0, .5, .5]: mean .5, population var = (.25 + .25 + 0 + 0) / 4 = 1/8,
    # std = sqrt(1/8) = 0.353553...; A = [2/3, -2/3, 0, 0] / std = [±(2/3) sqrt(8), 0, 0]
    # = [±1.885618..., 0, 0].  An all-equal group: 0 / max(0, 1e-7) = 0.
    out = compute_loo_advantages(
        t64([[1.0, 0.0, 0.5, 0.5], [0.2, 0.2, 0.2, 0.2]]), mask([[T] * 4] * 2), normalize_std=True
    )
    a = 2 / 3 * math.sqrt(8)
    close(out.advantages, [[a, -a, 0.0, 0.0], [0.0] * 4])
    assert abs(a - 1.8856180831641267) < 1e-12


def test_loo_equals_n_over_n_minus_1_times_centered_reward() -> None:
    # A_i = R_i - (S - R_i)/(n - 1) = (n R_i - S)/(n - 1) = n/(n - 1) (R_i - S/n).
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(50, 6, generator=generator, dtype=torch.float64)
    present = torch.rand(50, 6, generator=generator) > 0.3
    out = compute_loo_advantages(rewards, present)
    for g in range(50):
        n = int(present[g].sum())
        if n < 2:
            assert not out.kept_groups[g] and (out.advantages[g] == 0).all()
            continue
        r = rewards[g][present[g]]
        expected = n / (n - 1) * (r - r.mean())
        torch.testing.assert_close(out.advantages[g][present[g]], expected)


def slow_loo(rewards: list, present: list, normalize_std: bool) -> list:
    """Per-group loops, written straight from the formula: the reference for the vectorised one."""
    result = []
    for row, here in zip(rewards, present, strict=True):
        kept = [r for r, p in zip(row, here, strict=True) if p]
        out = [0.0] * len(row)
        if len(kept) >= 2:
            mean = sum(kept) / len(kept)
            std = math.sqrt(sum((r - mean) ** 2 for r in kept) / len(kept))
            for k, (r, p) in enumerate(zip(row, here, strict=True)):
                if p:
                    others = (sum(kept) - r) / (len(kept) - 1)
                    out[k] = (r - others) / (max(std, 1e-7) if normalize_std else 1.0)
        result.append(out)
    return result


@pytest.mark.parametrize("normalize_std", [False, True])
def test_loo_agrees_with_slow_reference(normalize_std: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    rewards = torch.rand(40, 5, generator=generator, dtype=torch.float64).round(decimals=1)
    present = torch.rand(40, 5, generator=generator) > 0.25
    out = compute_loo_advantages(rewards, present, normalize_std=normalize_std)
    expected = slow_loo(rewards.tolist(), present.tolist(), normalize_std)
    close(out.advantages, expected, tol=1e-9)


def test_loo_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="min_group_size"):
        compute_loo_advantages(t64([[1.0, 0.0]]), mask([[T, T]]), min_group_size=1)
    with pytest.raises(ValueError, match="bool"):
        compute_loo_advantages(t64([[1.0, 0.0]]), t64([[1.0, 1.0]]))
    with pytest.raises(ValueError, match="G, K"):
        compute_loo_advantages(t64([1.0, 0.0]), mask([T, T]))


def test_integer_rewards_give_float32() -> None:
    out = compute_loo_advantages(torch.tensor([[1, 0]]), mask([[T, T]]))
    assert out.advantages.dtype == torch.float32
    assert out.advantages.tolist() == [[1.0, -1.0]]


# ---------------------------------------------------------------------------------- GRPO


def test_grpo_by_hand_uses_the_sample_std() -> None:
    # R = [1, 0, .5, .5]: mean .5; sample var = (.25 + .25) / (4 - 1) = 1/6, std = 0.408248...
    # A = (R - .5) / (std + 1e-6) = [±.5 / (0.4082483 + 1e-6), 0, 0] = [±1.2247418..., 0, 0]
    out = compute_group_advantages(t64([[1.0, 0.0, 0.5, 0.5]]), mask([[T, T, T, T]]))
    a = 0.5 / (math.sqrt(1 / 6) + 1e-6)
    close(out.advantages, [[a, -a, 0.0, 0.0]])
    assert abs(a - 1.2247418) < 1e-7


def test_grpo_infra_failure_all_equal_and_leave_none_out() -> None:
    rewards = t64([[1.0, 0.0, 0.5, NAN], [0.4, 0.4, 0.4, 0.4]])
    present = mask([[T, T, T, F], [T, T, T, T]])
    # group 0 over 3 survivors: mean .5, sample var = (.25 + .25 + 0) / 2 = .25, std .5
    #   A = [.5, -.5, 0] / (.5 + 1e-6);  group 1: 0 / (0 + 1e-6) = 0.
    out = compute_group_advantages(rewards, present)
    a = 0.5 / (0.5 + 1e-6)
    close(out.advantages, [[a, -a, 0.0, 0.0], [0.0] * 4])
    # normalize_std=False: leave-none-out, R - mean = [.5, -.5, 0] (cf. LOO's n/(n-1) = 1.5x).
    plain = compute_group_advantages(rewards, present, normalize_std=False)
    close(plain.advantages, [[0.5, -0.5, 0.0, 0.0], [0.0] * 4])


def test_grpo_lone_survivor_dropped_by_default_and_zero_when_kept() -> None:
    rewards, present = t64([[0.9, NAN]]), mask([[T, F]])
    dropped = compute_group_advantages(rewards, present)
    assert dropped.kept_groups.tolist() == [F] and dropped.valid.tolist() == [[F, F]]
    kept = compute_group_advantages(rewards, present, min_group_size=1)
    # n = 1: R - mean = 0 and the std is taken as 0: 0 / 1e-6 = 0, no NaN.
    assert kept.valid.tolist() == [[T, F]]
    close(kept.advantages, [[0.0, 0.0]])


# ----------------------------------------------------------------------------- REINFORCE


def test_reinforce_is_the_reward() -> None:
    rewards = t64([[1.0, 0.0, 0.5, NAN], [0.3, NAN, NAN, NAN]])
    out = compute_reinforce_advantages(rewards, mask([[T, T, T, F], [T, F, F, F]]))
    close(out.advantages, [[1.0, 0.0, 0.5, 0.0], [0.3, 0.0, 0.0, 0.0]])
    assert out.kept_groups.tolist() == [T, T]  # min_group_size=1: a lone rollout still counts
    strict = compute_reinforce_advantages(t64([[0.3, NAN]]), mask([[T, F]]), min_group_size=2)
    close(strict.advantages, [[0.0, 0.0]])


def test_filter_keeps_exactly_the_rollouts_at_the_threshold() -> None:
    # Expert iteration: A = 1 where R >= 1.0 (an infrastructure failure is never kept).
    rewards = t64([[1.0, 0.5, 1.0, NAN], [0.0, 0.99, 1.0, 1.0]])
    present = mask([[T, T, T, F], [T, T, F, T]])
    out = compute_filter_advantages(rewards, present, threshold=1.0)
    close(out.advantages, [[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    assert out.valid.tolist() == present.tolist()
    kept = filter_by_magnitude(out.advantages, out.valid, threshold=0.01)
    assert kept.tolist() == [[T, F, T, F], [F, F, F, T]]
    lower = compute_filter_advantages(rewards, present, threshold=0.5)
    close(lower.advantages, [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0]])


# ---------------------------------------------------------------------- turn-level (MT-*)


def test_turn_advantages_loo_by_hand() -> None:
    # One group, K = 3, up to 3 turns. Outcome R^O = [1, 0, .5]: LOO A^O = [.75, -.75, 0]
    #   (sum 1.5: 1 - .5/2, 0 - 1.5/2, .5 - 1/2).
    # Turn rewards (F = final turn, its reward ignored; - = no such turn):
    #   rollout 0: [1, 0, 1F]   rollout 1: [0, 1F, -]   rollout 2: [1, 1, 0F]
    # Tool turns at position 0: rollouts 0, 1, 2 with [1, 0, 1]:
    #   A^T = [1 - (0+1)/2, 0 - (1+1)/2, 1 - (1+0)/2] = [.5, -1, .5]
    # Tool turns at position 1: rollouts 0 and 2 (rollout 1's turn 1 is final) with [0, 1]:
    #   A^T = [0 - 1, 1 - 0] = [-1, 1]
    # lambda = 0.5: tool turn A^T + .5 A^O; final turn A^O.
    #   rollout 0: [.5 + .375, -1 + .375, .75]       = [.875, -.625, .75]
    #   rollout 1: [-1 - .375, -.75, 0 (no turn)]    = [-1.375, -.75, 0]
    #   rollout 2: [.5 + 0, 1 + 0, 0]                = [.5, 1, 0]
    rewards = t64([[1.0, 0.0, 0.5]])
    turn_rewards = t64([[[1.0, 0.0, 1.0], [0.0, 1.0, NAN], [1.0, 1.0, 0.0]]])
    turn_mask = mask([[[T, T, T], [T, T, F], [T, T, T]]])
    out = compute_turn_advantages(
        rewards, turn_rewards, mask([[T, T, T]]), turn_mask, turn_coef=0.5
    )
    close(out.turn_advantages, [[[0.875, -0.625, 0.75], [-1.375, -0.75, 0.0], [0.5, 1.0, 0.0]]])
    assert out.valid.tolist() == [[T, T, T]] and out.kept_groups.tolist() == [T]


def test_turn_advantages_credit_final_turn_by_hand() -> None:
    # Same group; now final turns are tool turns too. lambda = 1.
    # position 0: [1, 0, 1] -> [.5, -1, .5];  position 1: [0, 1, 1] -> [0 - 1, 1 - .5, 1 - .5]
    #   = [-1, .5, .5];  position 2: rollouts 0, 2 with [1, 0] -> [1, -1].
    # + A^O = [.75, -.75, 0]:
    #   rollout 0: [1.25, -.25, 1.75]; rollout 1: [-1.75, -.25, 0]; rollout 2: [.5, .5, -1]
    rewards = t64([[1.0, 0.0, 0.5]])
    turn_rewards = t64([[[1.0, 0.0, 1.0], [0.0, 1.0, NAN], [1.0, 1.0, 0.0]]])
    turn_mask = mask([[[T, T, T], [T, T, F], [T, T, T]]])
    out = compute_turn_advantages(
        rewards, turn_rewards, mask([[T, T, T]]), turn_mask, credit_final_turn=True
    )
    close(out.turn_advantages, [[[1.25, -0.25, 1.75], [-1.75, -0.25, 0.0], [0.5, 0.5, -1.0]]])


def test_turn_advantages_mt_grpo_two_turns_by_hand() -> None:
    # The paper's setting: 2 turns, group-normalised (sample std), lambda = 1.
    # R^O = [1, 0, 1, 0]: mean .5, sample std = sqrt(4 * .25 / 3) = sqrt(1/3) = .57735
    #   A^O = ±.5 / .57735 = ±.866025 -> [+, -, +, -]
    # R^T (turn 1) = [1, 1, 0, 0]: A^T = [+, +, -, -] .866025
    # turn 1: A^T + A^O = [1.732051, 0, 0, -1.732051];  turn 2: A^O.
    s = 0.5 / math.sqrt(1 / 3)
    rewards = t64([[1.0, 0.0, 1.0, 0.0]])
    turn_rewards = t64([[[1.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0.0, 0.0]]])
    out = compute_turn_advantages(
        rewards,
        turn_rewards,
        mask([[T] * 4]),
        mask([[[T, T]] * 4]),
        baseline="group",
        normalize_std=True,
        std_eps=0.0,
    )
    close(out.turn_advantages, [[[2 * s, s], [0.0, -s], [0.0, s], [-2 * s, -s]]], tol=1e-12)
    assert abs(2 * s - 1.7320508075688772) < 1e-12


def test_turn_advantages_single_turn_rollouts_are_outcome_only() -> None:
    generator = torch.Generator().manual_seed(2)
    rewards = torch.rand(6, 4, generator=generator, dtype=torch.float64)
    present = torch.rand(6, 4, generator=generator) > 0.2
    turn_rewards = torch.rand(6, 4, 1, generator=generator, dtype=torch.float64)
    out = compute_turn_advantages(rewards, turn_rewards, present, present[:, :, None])
    expected = compute_loo_advantages(rewards, present)
    torch.testing.assert_close(out.turn_advantages[:, :, 0], expected.advantages)
    assert torch.equal(out.valid, expected.valid)


def test_turn_advantages_exclude_failures_and_dropped_groups() -> None:
    # Group 0: rollout 2 failed (not present): turn baselines and A^O over rollouts 0, 1 only.
    #   A^O = [1 - 0, 0 - 1] = [1, -1]; position 0 tool turns [1, 0] -> [1, -1].
    #   lambda 1: rollout 0 [1 + 1, 1], rollout 1 [-1 - 1, -1], rollout 2 zeros.
    # Group 1: one survivor -> dropped, all zeros.
    rewards = t64([[1.0, 0.0, NAN], [1.0, NAN, NAN]])
    present = mask([[T, T, F], [T, F, F]])
    turn_rewards = t64([[[1.0, 1.0], [0.0, 1.0], [1.0, 1.0]], [[1.0, 1.0]] * 3])
    turn_mask = mask([[[T, T], [T, T], [T, T]], [[T, T], [F, F], [F, F]]])
    out = compute_turn_advantages(rewards, turn_rewards, present, turn_mask)
    close(out.turn_advantages, [[[2.0, 1.0], [-2.0, -1.0], [0.0, 0.0]], [[0.0, 0.0]] * 3])
    assert out.kept_groups.tolist() == [T, F]


def test_turn_advantages_reject_bad_shapes() -> None:
    with pytest.raises(ValueError, match="turn_rewards"):
        compute_turn_advantages(
            t64([[1.0, 0.0]]), t64([[1.0, 0.0]]), mask([[T, T]]), mask([[T, T]])
        )
    with pytest.raises(ValueError, match="baseline"):
        compute_turn_advantages(
            t64([[1.0, 0.0]]), t64([[[1.0], [0.0]]]), mask([[T, T]]), mask([[[T], [T]]]),
            baseline="median",  # type: ignore[arg-type]
        )  # fmt: skip


# ------------------------------------------------------------------- filter and counting


def test_filter_by_magnitude_by_hand() -> None:
    advantages = t64([[0.5, -0.005, 0.01, 0.0], [-0.02, 0.0, 0.0, 0.0]])
    valid = mask([[T, T, T, F], [T, T, F, F]])
    # |A| >= .01 and valid: .5 yes, .005 no, .01 yes (boundary kept), slot 3 invalid; -.02 yes.
    keep = filter_by_magnitude(advantages, valid, 0.01)
    assert keep.tolist() == [[T, F, T, F], [T, F, F, F]]
    # threshold 0 keeps every valid rollout, even A = 0 (as the reference's >= does).
    assert filter_by_magnitude(advantages, valid, 0.0).tolist() == valid.tolist()


def test_filter_by_magnitude_per_turn() -> None:
    # A rollout is kept if any turn clears the threshold: rollout 0 by its turn 1.
    turn_adv = t64([[[0.0, -0.3], [0.001, 0.0]]])
    keep = filter_by_magnitude(turn_adv, mask([[T, T]]), 0.01)
    assert keep.tolist() == [[T, F]]
    with pytest.raises(ValueError, match="threshold"):
        filter_by_magnitude(turn_adv, mask([[T, T]]), -1.0)


def test_round_to_world_size_tops_up_by_magnitude_by_hand() -> None:
    # 5 rollouts: kept 0 and 3 (|A| .5, .2); 1 (|A| .3) and 4 (|A| .3) spare, 2 not present.
    keep, magnitude, present = [T, F, F, T, F], [0.5, 0.3, 0.9, 0.2, 0.3], [T, T, F, T, T]
    # world 3: 2 kept -> 3, the largest spare |A|; 1 and 4 tie at .3, the earlier one wins.
    assert round_to_world_size(keep, magnitude, present, 3) == [T, T, F, T, F]
    # world 4: both spares added (2 -> 4); rollout 2 is never added, it has no reward.
    assert round_to_world_size(keep, magnitude, present, 4) == [T, T, F, T, T]
    # world 2 and 1: already a multiple, unchanged; the input is never modified.
    assert round_to_world_size(keep, magnitude, present, 2) == keep
    assert round_to_world_size(keep, magnitude, present, 1) == keep
    assert keep == [T, F, F, T, F]


def test_round_to_world_size_drops_the_weakest_when_nothing_is_spare() -> None:
    # world 4: 3 kept, 1 spare -> 4 would do; world 5: 4 at most, so down to a multiple of 5: 0.
    keep, magnitude, present = [T, T, F, T], [0.4, 0.1, 0.2, 0.4], [T, T, T, T]
    assert round_to_world_size(keep, magnitude, present, 4) == [T, T, T, T]
    assert round_to_world_size(keep, magnitude, present, 5) == [F, F, F, F]
    # world 3, no spare present: 4 kept -> 3, dropping the weakest (|A| .1, rollout 1), then
    # on a tie (.4, .4) the earlier one is the weakest.
    keep, magnitude, present = [T, T, T, T, F], [0.4, 0.1, 0.5, 0.4, 0.9], [T, T, T, T, F]
    assert round_to_world_size(keep, magnitude, present, 3) == [T, F, T, T, F]
    assert round_to_world_size([T, F, T, T], [0.4, 0.1, 0.5, 0.4], [T, F, T, T], 2) == [
        F, F, T, T,
    ]  # fmt: skip


def test_count_exclusions_by_hand() -> None:
    # 3 groups of K = 3; group 2 has a padding slot (not attempted).
    # group 0: all present, kept.  group 1: 1 failure, 2 survivors, kept.
    # group 2: 1 failure of 2 attempted -> 1 survivor -> dropped.
    rewards = t64([[1.0, 0.0, 1.0], [1.0, NAN, 0.0], [1.0, NAN, 0.0]])
    present = mask([[T, T, T], [T, F, T], [T, F, F]])
    attempted = mask([[T, T, T], [T, T, T], [T, T, F]])
    out = compute_loo_advantages(rewards, present)
    counts = count_exclusions(present, out.kept_groups, attempted)
    # attempted 8; excluded: (1,1) and (2,1) = 2; dropped groups 1; dropped survivors 1 (2,0);
    # valid 3 + 2 = 5.
    assert counts == (8, 2, 1, 1, 5)
    assert count_exclusions(present, out.kept_groups).n_excluded == 3  # padding counted as failure
    with pytest.raises(ValueError, match="attempted"):
        count_exclusions(present, out.kept_groups, mask([[F, T, T], [T, T, T], [T, T, T]]))
