"""`loop.algo.gae`: per-token GAE and Verlog's dual-discount GAE against numbers worked out by hand
(environment tokens skipped, a truncated rollout bootstrapped from V(s_{T+1}), the token and
step discounts), the fast recursion against the slow definition on random rollouts, and the
two steps Verlog's code adds around it (the k1 KL reward, batch whitening) by hand.

Run: python -m pytest tests/loop/test_gae.py -q
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from loop.algo.gae import (
    compute_dual_discount_gae,
    compute_gae,
    gae_reference,
    kl_reward,
    whiten,
)

T, F = True, False
JUNK = 9.0  # values and rewards at environment tokens: must not leak into any advantage


def t64(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def close(actual: torch.Tensor, expected: list, tol: float = 1e-12) -> None:
    torch.testing.assert_close(actual, t64(expected), rtol=0, atol=tol)


# prompt p0 p1 | turn 0: a0 a1 | observation o0 o1 | turn 1: b0 b1
MASK = torch.tensor([[F, F, T, T, F, F, T, T]])
TURNS = torch.tensor([[-1, -1, 0, 0, -1, -1, 1, 1]])
VALUES = t64([[JUNK, JUNK, 0.2, 0.4, JUNK, JUNK, 0.5, 0.6]])


def test_dual_discount_by_hand_finished_episode() -> None:
    # r = 1 on the last token b1; gamma_step 0.9, lambda_step 0.5, gamma_token = lambda_token = 1.
    # b1: delta = 1 + 0.9 * 0 - 0.6 = 0.4                         A = 0.4
    # b0: same turn (1, 1): delta = 0.6 - 0.5 = 0.1                A = 0.1 + 0.4 = 0.5
    # a1: next is b0, another turn (0.9, 0.5), o0 o1 skipped:
    #     delta = 0.9 * 0.5 - 0.4 = 0.05                          A = 0.05 + 0.45 * 0.5 = 0.275
    #     (the paper's A_{-2,t} = g_s [l_s r + (1 - l_s) V_{-1,0}] - V_{-2,t} = 0.675 - 0.4)
    # a0: same turn: delta = 0.4 - 0.2 = 0.2                       A = 0.2 + 0.275 = 0.475
    rewards = t64([[JUNK, JUNK, 0, 0, JUNK, JUNK, 0, 1.0]])
    out = compute_dual_discount_gae(
        rewards, VALUES, MASK, TURNS, gamma_token=1.0, lambda_token=1.0, gamma_step=0.9,
        lambda_step=0.5,
    )  # fmt: skip
    close(out.advantages, [[0, 0, 0.475, 0.275, 0, 0, 0.5, 0.4]])
    close(out.returns, [[0, 0, 0.675, 0.675, 0, 0, 1.0, 1.0]])  # A + V


def test_dual_discount_truncated_rollout_bootstraps_from_the_next_state() -> None:
    # No reward yet; V(s_{T+1}) = 0.8 follows b1 across a turn boundary (gamma_step 0.9).
    # b1: delta = 0.9 * 0.8 - 0.6 = 0.12          A = 0.12
    # b0: delta = 0.6 - 0.5 = 0.1                 A = 0.1 + 0.12 = 0.22
    # a1: delta = 0.9 * 0.5 - 0.4 = 0.05          A = 0.05 + 0.45 * 0.22 = 0.149
    # a0: delta = 0.4 - 0.2 = 0.2                 A = 0.2 + 0.149 = 0.349
    rewards = torch.zeros(1, 8, dtype=torch.float64)
    out = compute_dual_discount_gae(
        rewards, VALUES, MASK, TURNS, gamma_step=0.9, lambda_step=0.5, bootstrap=t64([0.8])
    )
    close(out.advantages, [[0, 0, 0.349, 0.149, 0, 0, 0.22, 0.12]])


def test_dual_discount_defaults_are_verlogs() -> None:
    # gamma_step 0.99, lambda_step 0.95, token pair 1: a1's A = 0.99 [0.95 r + 0.05 V(b0)] - 0.4
    rewards = t64([[0, 0, 0, 0, 0, 0, 0, 1.0]])
    out = compute_dual_discount_gae(rewards, VALUES, MASK, TURNS)
    a1 = 0.99 * (0.95 * 1.0 + 0.05 * 0.5) - 0.4  # = 0.56525
    close(out.advantages, [[0, 0, a1 + 0.2, a1, 0, 0, 0.5, 0.4]])


def test_token_discount_within_a_turn() -> None:
    # One turn of three tokens, V = 0, r = 1 at the end; gamma_token 0.5, lambda_token 1:
    # A = 1, then 0 + 0.5 * 1 = 0.5, then 0.25. The step pair is never used inside a turn.
    out = compute_dual_discount_gae(
        t64([[0, 0, 1.0]]), t64([[0, 0, 0]]), torch.tensor([[T, T, T]]),
        torch.tensor([[0, 0, 0]]), gamma_token=0.5, lambda_token=1.0, gamma_step=0.1,
        lambda_step=0.1,
    )  # fmt: skip
    close(out.advantages, [[0.25, 0.5, 1.0]])


def test_gae_with_gamma_lambda_one_is_return_minus_value() -> None:
    # The LOOP paper's critic baseline: A_t = R - V(s_t), environment tokens skipped.
    mask = torch.tensor([[F, T, F, T, T, F]])
    values = t64([[JUNK, 0.3, JUNK, 0.1, 0.7, JUNK]])
    rewards = t64([[JUNK, 0, JUNK, 0, 1.0, JUNK]])
    out = compute_gae(rewards, values, mask)
    close(out.advantages, [[0, 0.7, 0, 0.9, 0.3, 0]])
    close(out.returns, [[0, 1.0, 0, 1.0, 1.0, 0]])


def test_gae_by_hand_with_discount() -> None:
    # gamma = lambda = 0.5, V = [0.2, 0.4], r = 1 at the end:
    # A_1 = 1 - 0.4 = 0.6;  delta_0 = 0.5 * 0.4 - 0.2 = 0;  A_0 = 0 + 0.25 * 0.6 = 0.15
    out = compute_gae(t64([[0, 1.0]]), t64([[0.2, 0.4]]), torch.tensor([[T, T]]), gamma=0.5,
                      lam=0.5)  # fmt: skip
    close(out.advantages, [[0.15, 0.6]])


def test_rows_are_independent_and_padding_is_zero() -> None:
    mask = torch.tensor([[T, T, F], [T, F, F]])
    out = compute_gae(t64([[0, 1.0, 0], [0.5, 0, 0]]), t64([[0.5, 0.5, 3], [0.25, 3, 3]]), mask)
    close(out.advantages, [[0.5, 0.5, 0], [0.25, 0, 0]])


def test_fast_recursion_equals_the_definition_on_random_rollouts() -> None:
    rng = random.Random(0)
    for _ in range(20):
        length = rng.randint(1, 30)
        mask = torch.tensor([rng.random() < 0.6 for _ in range(length)])
        turn, turns = 0, []
        for _ in range(length):
            turn += rng.random() < 0.2
            turns.append(turn)
        rewards = torch.randn(length, dtype=torch.float64)
        values = torch.randn(length, dtype=torch.float64)
        pairs = {k: rng.random() for k in ("gamma_token", "lambda_token", "gamma_step",
                                            "lambda_step")}  # fmt: skip
        boot = rng.random()
        out = compute_dual_discount_gae(
            rewards[None], values[None], mask[None], torch.tensor([turns]),
            bootstrap=t64([boot]), **pairs,
        )  # fmt: skip
        keep = mask.nonzero().flatten().tolist()
        expected = gae_reference(
            [float(rewards[i]) for i in keep], [float(values[i]) for i in keep],
            [turns[i] for i in keep], bootstrap=boot, **pairs,
        )  # fmt: skip
        torch.testing.assert_close(out.advantages[0, keep], t64(expected), rtol=0, atol=1e-10)
        assert bool((out.advantages[0, ~mask] == 0).all())


def test_bad_inputs_are_one_line_errors() -> None:
    m = torch.tensor([[T]])
    with pytest.raises(ValueError, match="gamma_step"):
        compute_dual_discount_gae(t64([[1.0]]), t64([[0.0]]), m, torch.tensor([[0]]),
                                  gamma_step=1.5)  # fmt: skip
    with pytest.raises(ValueError, match="bootstrap"):
        compute_gae(t64([[1.0]]), t64([[0.0]]), m, bootstrap=t64([0.0, 1.0]))
    with pytest.raises(ValueError, match="mask must be bool"):
        compute_gae(t64([[1.0]]), t64([[0.0]]), torch.tensor([[1]]))


def test_whiten_by_hand() -> None:
    # mean 2.5, unbiased variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3
    out = whiten(torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([T, T, T, T]))
    std = math.sqrt(5 / 3)
    torch.testing.assert_close(out, torch.tensor([-1.5, -0.5, 0.5, 1.5]) / std)
    # masked out: not counted, 0.0 there; mean 2, unbiased variance 2
    out = whiten(torch.tensor([[1.0, 100.0, 3.0]]), torch.tensor([[T, F, T]]))
    torch.testing.assert_close(out, torch.tensor([[-1.0, 0.0, 1.0]]) / math.sqrt(2))
    with pytest.raises(ValueError, match="at least two"):
        whiten(torch.tensor([1.0, 2.0]), torch.tensor([T, F]))


def test_kl_reward_is_minus_coef_k1_on_output_tokens() -> None:
    old = torch.tensor([[-1.0, -2.0, -9.0, -0.5]])
    ref = torch.tensor([[-1.5, -2.0, -1.0, -1.0]])
    out = kl_reward(old, ref, torch.tensor([[T, T, F, T]]), coef=0.1)
    torch.testing.assert_close(out, torch.tensor([[-0.05, 0.0, 0.0, -0.05]], dtype=torch.float64))
