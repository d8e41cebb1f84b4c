"""`loop.algo.losses`: the clipped surrogate at the token, turn and trajectory levels, REINFORCE and
the KL estimates, against numbers worked out by hand; gradients checked with autograd; the
vectorised per-turn loss against a slow loop; no NaN for padding or empty sequences.

Run: python -m pytest tests/loop/test_losses.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from loop.algo.losses import (
    clip_value,
    clipped_objective,
    clipped_surrogate_loss,
    clipped_value_loss,
    cross_entropy_loss,
    kl_estimates,
    kl_penalty,
    reinforce_loss,
    token_kl_estimates,
)

T, F = True, False
NAN = math.nan
LN = math.log


def t64(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def mask(rows: list) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.bool)


def close(actual: torch.Tensor, expected: list | float, tol: float = 1e-9) -> None:
    torch.testing.assert_close(actual.detach(), t64(expected), rtol=0, atol=tol)


def with_log_ratios(log_ratios: list, old: list | None = None):
    """(logprobs leaf with grad, old_logprobs) whose difference is `log_ratios` (one row)."""
    old_t = t64([old if old is not None else [-1.0] * len(log_ratios)])
    new = (old_t + t64([log_ratios])).requires_grad_(True)
    return new, old_t


# ------------------------------------------------------------------------- clip function


def test_clip_value_by_hand() -> None:
    a = t64([2.0, -2.0, 0.0])
    # reciprocal: 2 * 1.1 = 2.2;  -2 / 1.1 = -1.818181...;  0
    close(clip_value(a, clip_eps=0.1), [2.2, -2 / 1.1, 0.0])
    # symmetric: A + .1|A| = 2.2;  -2 + .2 = -1.8;  0
    close(clip_value(a, clip_eps=0.1, lower="symmetric"), [2.2, -1.8, 0.0])
    with pytest.raises(ValueError, match="clip_eps"):
        clip_value(a, clip_eps=0.0)
    with pytest.raises(ValueError, match="lower"):
        clip_value(a, clip_eps=0.1, lower="upper")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lower", "eps", "low", "high"),
    [
        ("reciprocal", 0.1, 1 / 1.1, 1.1),
        ("reciprocal", 3.0, 1 / 4.0, 4.0),  # eps > 1 stays a valid band in this form
        ("symmetric", 0.2, 0.8, 1.2),
    ],
)
def test_min_form_equals_clamped_ratio_form(
    lower: str, eps: float, low: float, high: float
) -> None:
    # o = min(r A, g(A)) == min(r A, clamp(r, low, high) A), the identity the reference asserts.
    generator = torch.Generator().manual_seed(0)
    ratio = torch.exp(torch.randn(10_000, generator=generator, dtype=torch.float64) * 0.5)
    adv = torch.randn(10_000, generator=generator, dtype=torch.float64)
    objective, _ = clipped_objective(ratio, adv, clip_eps=eps, lower=lower)  # type: ignore[arg-type]
    expected = torch.minimum(ratio * adv, ratio.clamp(low, high) * adv)
    torch.testing.assert_close(objective, expected, rtol=0, atol=1e-12)


def test_band_edges_differ_between_the_two_lower_bounds() -> None:
    # r = .905, A = -1: reciprocal band starts at 1/1.1 = .90909 > .905, so r is below it:
    # g = -.90909 < r A = -.905 -> clipped, o = -.90909. Symmetric band starts at .9 < .905:
    # g = -.9 > -.905 -> not clipped, o = -.905.
    ratio, adv = t64([0.905]), t64([-1.0])
    o_rec, c_rec = clipped_objective(ratio, adv, clip_eps=0.1, lower="reciprocal")
    o_sym, c_sym = clipped_objective(ratio, adv, clip_eps=0.1, lower="symmetric")
    close(o_rec, [-1 / 1.1])
    close(o_sym, [-0.905])
    assert c_rec.tolist() == [True] and c_sym.tolist() == [False]


# --------------------------------------------------------------------------- token level


def test_ratio_one_gives_minus_mean_advantage_at_every_level() -> None:
    # logprobs == old: every ratio is 1, o = A, loss = -A (token mean of a constant, a single
    # unit, or the mean over turns). Per-token advantages [1, 2, 3] on 3 tokens: -2.
    old = t64([[-1.0, -2.0, -0.5, -3.0], [-0.1, -0.2, -0.3, -0.4]])
    new = old.clone().requires_grad_(True)
    m = mask([[F, T, T, F], [T, T, T, F]])
    turn_ids = torch.tensor([[-1, 0, 1, -1], [0, 0, 1, -1]])
    for level in ("token", "turn", "trajectory"):
        out = clipped_surrogate_loss(new, old, t64([0.5, -2.0]), m, level=level, turn_ids=turn_ids)
        close(out.loss, [-0.5, 2.0])
        close(out.ratio_mean, [1.0, 1.0])
        close(out.clipped, [0.0, 0.0])
    per_token = t64([[0.0, 1.0, 2.0, 0.0], [1.0, 2.0, 3.0, 0.0]])
    close(clipped_surrogate_loss(new, old, per_token, m).loss, [-1.5, -2.0])


def test_token_level_by_hand_positive_advantage() -> None:
    # log r = [ln 1.2, ln .8, ln 1.05], A = +1, eps .1: g = 1.1.
    # o = [min(1.2, 1.1) = 1.1 (clipped), .8, 1.05]; loss = -(1.1 + .8 + 1.05) / 3 = -.983333
    # d loss / d log p_t = -(1/3) A r_t where unclipped, 0 where clipped: [0, -.8/3, -1.05/3].
    new, old = with_log_ratios([LN(1.2), LN(0.8), LN(1.05)])
    out = clipped_surrogate_loss(new, old, t64([1.0]), mask([[T, T, T]]))
    close(out.loss, [-2.95 / 3])
    close(out.clipped, [1 / 3])
    close(out.ratio_mean, [(1.2 + 0.8 + 1.05) / 3])
    close(out.log_ratio_sum, [LN(1.2 * 0.8 * 1.05)])
    out.loss.sum().backward()
    assert new.grad is not None
    close(new.grad, [[0.0, -0.8 / 3, -1.05 / 3]])


@pytest.mark.parametrize(
    ("lower", "expected_loss", "expected_grad"),
    [
        # reciprocal: g = -1/1.1 = -.909091; rA = [-1.2, -.8, -1.05]
        #   o = [-1.2, -.909091 (clipped: -.8 > g), -1.05]; loss = (1.2 + .909091 + 1.05)/3
        #   = 1.053030; grad = -(1/3) A r = [1.2/3, 0, 1.05/3]
        ("reciprocal", (1.2 + 1 / 1.1 + 1.05) / 3, [0.4, 0.0, 0.35]),
        # symmetric: g = -.9; o = [-1.2, -.9 (clipped), -1.05]; loss = 3.15/3 = 1.05
        ("symmetric", 1.05, [0.4, 0.0, 0.35]),
    ],
)
def test_token_level_by_hand_negative_advantage(
    lower: str, expected_loss: float, expected_grad: list
) -> None:
    new, old = with_log_ratios([LN(1.2), LN(0.8), LN(1.05)])
    out = clipped_surrogate_loss(new, old, t64([-1.0]), mask([[T, T, T]]), lower=lower)  # type: ignore[arg-type]
    close(out.loss, [expected_loss])
    close(out.clipped, [1 / 3])
    out.loss.sum().backward()
    assert new.grad is not None
    close(new.grad, [expected_grad])


def test_gradient_is_zero_exactly_where_clipped() -> None:
    # Four tokens, A = +1 then A = -1 on the same ratios [1.3, 1.0, .7, 1.05], eps .2 reciprocal
    # (band [.8333, 1.2]). A > 0 clips r > 1.2 -> token 0; A < 0 clips r < .8333 -> token 2.
    for adv, clipped_token in ((1.0, 0), (-1.0, 2)):
        new, old = with_log_ratios([LN(1.3), 0.0, LN(0.7), LN(1.05)])
        out = clipped_surrogate_loss(new, old, t64([adv]), mask([[T] * 4]), clip_eps=0.2)
        out.loss.sum().backward()
        assert new.grad is not None
        grad = new.grad[0].tolist()
        assert grad[clipped_token] == 0.0
        assert all(g != 0.0 for i, g in enumerate(grad) if i != clipped_token)
        close(out.clipped, [0.25])


def test_gradient_at_ratio_one_equals_reinforce() -> None:
    # At logprobs == old the PPO gradient is -(1/n) sum_t A_t grad log p_t, REINFORCE's.
    generator = torch.Generator().manual_seed(3)
    old = torch.randn(3, 7, generator=generator, dtype=torch.float64) - 2
    m = torch.rand(3, 7, generator=generator) > 0.3
    adv = torch.randn(3, 7, generator=generator, dtype=torch.float64)
    a = old.clone().requires_grad_(True)
    b = old.clone().requires_grad_(True)
    clipped_surrogate_loss(a, old, adv, m).loss.sum().backward()
    reinforce_loss(b, adv, m).loss.sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


# ---------------------------------------------------------------------------- turn level

# One sequence: [prompt, t0, t0, obs, t1, pad]; log-ratios of the output tokens:
# turn 0: [.1, -.05] (sum .05, r0 = e^.05 = 1.0512711), turn 1: [.2] (r1 = e^.2 = 1.2214028).
TWO_TURN_MASK = [[F, T, T, F, T, F]]
TWO_TURN_IDS = [[-1, 0, 0, -1, 1, -1]]
TWO_TURN_LOG_RATIOS = [0.0, 0.1, -0.05, 0.0, 0.2, 0.0]
R0, R1 = math.exp(0.05), math.exp(0.2)


def two_turn(adv: torch.Tensor, level: str, **kwargs):
    new, old = with_log_ratios(TWO_TURN_LOG_RATIOS)
    old[0, 0] = NAN  # the reference stores NaN off the mask; it must not leak
    old[0, 3] = NAN
    out = clipped_surrogate_loss(
        new, old, adv, mask(TWO_TURN_MASK), level=level, turn_ids=torch.tensor(TWO_TURN_IDS),
        **kwargs,
    )  # fmt: skip
    out.loss.sum().backward()
    assert new.grad is not None
    return out, new.grad


def test_turn_level_by_hand() -> None:
    # A = +1, eps .1: o0 = min(1.0512711, 1.1) = 1.0512711; o1 = min(1.2214028, 1.1) = 1.1
    # (clipped). loss = -(1.0512711 + 1.1) / 2 = -1.0756355; clipped 1/2 of the turns;
    # ratio_mean = (1.0512711 + 1.2214028) / 2 = 1.1363370.
    # Gradient: each token of turn 0 gets -(1/2) A r0 = -.5256355 (d r0 / d log p_t = r0);
    # turn 1 is clipped: 0; non-output tokens: 0.
    out, grad = two_turn(t64([1.0]), "turn")
    close(out.loss, [-(R0 + 1.1) / 2])
    assert abs(out.loss.item() + 1.0756355) < 1e-7
    close(out.clipped, [0.5])
    close(out.ratio_mean, [(R0 + R1) / 2])
    close(out.log_ratio_sum, [0.25])
    close(grad, [[0.0, -R0 / 2, -R0 / 2, 0.0, 0.0, 0.0]])


def test_turn_level_with_per_turn_advantages_by_hand() -> None:
    # MT-GRPO style: turn 0 carries A = 2, turn 1 A = -1 (broadcast to their tokens).
    # o0 = min(2 * 1.0512711, 2.2) = 2.1025422; o1 = min(-1.2214028, -1/1.1) = -1.2214028.
    # loss = -(2.1025422 - 1.2214028) / 2 = -.4405697; nothing clipped.
    # grad: turn 0 tokens -(1/2)(2)(r0) = -r0; turn 1 token -(1/2)(-1)(r1) = r1/2.
    adv = t64([[0.0, 2.0, 2.0, 0.0, -1.0, 0.0]])
    out, grad = two_turn(adv, "turn")
    close(out.loss, [-(2 * R0 - R1) / 2])
    close(out.clipped, [0.0])
    close(grad, [[0.0, -R0, -R0, 0.0, R1 / 2, 0.0]])


def test_trajectory_level_by_hand() -> None:
    # r = exp(.1 - .05 + .2) = e^.25 = 1.2840254.
    # A = +1: o = min(1.284, 1.1) = 1.1, clipped, loss -1.1, no gradient.
    out, grad = two_turn(t64([1.0]), "trajectory")
    close(out.loss, [-1.1])
    close(out.clipped, [1.0])
    close(out.ratio_mean, [math.exp(0.25)])
    assert (grad == 0).all()
    # A = -1: o = min(-1.284, -.909) = -1.2840254, loss 1.2840254; not clipped; no token
    # mean: every output token gets d loss / d log p_t = -A r = 1.2840254.
    out, grad = two_turn(t64([-1.0]), "trajectory")
    r = math.exp(0.25)
    close(out.loss, [r])
    close(out.clipped, [0.0])
    close(grad, [[0.0, r, r, 0.0, r, 0.0]])


def test_token_level_on_the_two_turn_sequence_pools_turns() -> None:
    # Token level, A = +1: o = [min(e^.1 = 1.1051709, 1.1) = 1.1 (clipped), e^-.05 = .9512294,
    # min(1.2214, 1.1) = 1.1 (clipped)]; loss = -(1.1 + .9512294 + 1.1) / 3 = -1.0504098.
    out, _ = two_turn(t64([1.0]), "token")
    close(out.loss, [-(2.2 + math.exp(-0.05)) / 3])
    close(out.clipped, [2 / 3])


def slow_turn_loss(new, old, adv, m, turn_ids, eps):
    """Loops over sequences and turns, straight from the definition (reciprocal band)."""
    losses = []
    for b in range(new.shape[0]):
        objectives = []
        for k in sorted({int(i) for i in turn_ids[b][m[b]]}):
            tokens = [t for t in range(new.shape[1]) if m[b, t] and turn_ids[b, t] == k]
            ratio = torch.exp(sum(new[b, t] - old[b, t] for t in tokens))
            a = sum(float(adv[b, t]) for t in tokens) / len(tokens)
            clamped = ratio.clamp(1 / (1 + eps), 1 + eps)
            objectives.append(torch.minimum(ratio * a, clamped * a))
        losses.append(-sum(objectives) / len(objectives) if objectives else new.new_zeros(()))
    return torch.stack(losses)


def test_turn_level_agrees_with_slow_loop() -> None:
    generator = torch.Generator().manual_seed(4)
    batch, length = 5, 12
    old = torch.randn(batch, length, generator=generator, dtype=torch.float64) - 2
    new = old + 0.3 * torch.randn(batch, length, generator=generator, dtype=torch.float64)
    m = torch.rand(batch, length, generator=generator) > 0.4
    m[4] = False  # a sequence with no output tokens
    turn_ids = torch.where(m, torch.arange(length) // 4, -1)  # 3 turns of up to 4 tokens
    adv = torch.randn(batch, length, generator=generator, dtype=torch.float64)
    a = new.clone().requires_grad_(True)
    b = new.clone().requires_grad_(True)
    fast = clipped_surrogate_loss(a, old, adv, m, level="turn", turn_ids=turn_ids, clip_eps=0.2)
    slow = slow_turn_loss(b, old, adv, m, turn_ids, 0.2)
    torch.testing.assert_close(fast.loss, slow)
    fast.loss.sum().backward()
    slow.sum().backward()
    assert a.grad is not None and b.grad is not None
    torch.testing.assert_close(a.grad, b.grad)


def test_turn_level_needs_turn_ids() -> None:
    new, old = with_log_ratios([0.0, 0.0])
    with pytest.raises(ValueError, match="turn_ids"):
        clipped_surrogate_loss(new, old, t64([1.0]), mask([[T, T]]), level="turn")
    with pytest.raises(ValueError, match="no turn"):
        clipped_surrogate_loss(
            new, old, t64([1.0]), mask([[T, T]]), level="turn", turn_ids=torch.tensor([[0, -1]])
        )
    with pytest.raises(ValueError, match="level"):
        clipped_surrogate_loss(new, old, t64([1.0]), mask([[T, T]]), level="word")  # type: ignore[arg-type]


# ----------------------------------------------------------------- numerical safety


@pytest.mark.parametrize("level", ["token", "turn", "trajectory"])
def test_sequence_without_output_tokens_gives_zero_not_nan(level: str) -> None:
    old = t64([[NAN, NAN, NAN], [-1.0, -1.0, -1.0]])
    new = t64([[-1.0, -2.0, -3.0], [-0.9, -1.2, -1.0]]).requires_grad_(True)
    m = mask([[F, F, F], [T, T, F]])
    adv = t64([[NAN, NAN, NAN], [1.0, 1.0, NAN]])  # garbage off the mask must not matter
    turn_ids = torch.tensor([[-1, -1, -1], [0, 1, -1]])
    out = clipped_surrogate_loss(new, old, adv, m, level=level, turn_ids=turn_ids)  # type: ignore[arg-type]
    assert out.loss[0].item() == 0.0 and out.clipped[0].item() == 0.0
    assert out.ratio_mean[0].item() == 1.0 and out.log_ratio_sum[0].item() == 0.0
    for field in out:
        assert torch.isfinite(field).all(), field
    out.loss.sum().backward()
    assert new.grad is not None and torch.isfinite(new.grad).all()
    assert (new.grad[0] == 0).all()


@pytest.mark.parametrize("adv", [1.0, -1.0])
def test_huge_summed_log_ratio_stays_finite(adv: float) -> None:
    # 100 tokens of log-ratio 10: the trajectory sum is 1000 (exp overflows even float64).
    # Clamped to 20: finite loss, finite (zero) gradient; log_ratio_sum keeps the true 1000.
    new, old = with_log_ratios([10.0] * 100)
    out = clipped_surrogate_loss(new, old, t64([adv]), mask([[T] * 100]), level="trajectory")
    assert torch.isfinite(out.loss).all()
    close(out.log_ratio_sum, [1000.0], tol=1e-9)
    out.loss.sum().backward()
    assert new.grad is not None and torch.isfinite(new.grad).all()
    # A > 0: clipped at g = 1.1; A < 0: saturated at -e^20 (the gradient would be ~e^1000).
    close(out.loss, [-1.1 if adv > 0 else math.exp(20.0)], tol=1e-6)


def test_float32_inputs_stay_float32() -> None:
    new = torch.zeros(2, 3, requires_grad=True)
    out = clipped_surrogate_loss(new, torch.zeros(2, 3), torch.ones(2), torch.ones(2, 3).bool())
    assert all(field.dtype == torch.float32 for field in out)


# --------------------------------------------------------------------------- REINFORCE


def test_reinforce_by_hand() -> None:
    # log p on output tokens [-1, -2, -.5] (token 2 is not output).
    lp = t64([[-1.0, -2.0, -9.0, -0.5]])
    m = mask([[T, T, F, T]])
    # Scalar A = 2, both levels: -mean(2 * [-1, -2, -.5]) = -(2 * -3.5) / 3 = 7/3.
    for level in ("token", "trajectory"):
        new = lp.clone().requires_grad_(True)
        out = reinforce_loss(new, t64([2.0]), m, level=level)  # type: ignore[arg-type]
        close(out.loss, [7 / 3])
        out.loss.sum().backward()
        assert new.grad is not None
        close(new.grad, [[-2 / 3, -2 / 3, 0.0, -2 / 3]])  # d/d log p_t = -A / n
    # Per-token A [1, 2, -, 3]:
    #   token:      -(1*-1 + 2*-2 + 3*-.5) / 3 = 6.5/3 = 2.166667; grad -A_t / 3
    #   trajectory: -mean(A) * mean(log p) = -(6/3) * (-3.5/3) = 7/3; grad -2/3 each
    per_token = t64([[1.0, 2.0, NAN, 3.0]])
    new = lp.clone().requires_grad_(True)
    out = reinforce_loss(new, per_token, m, level="token")
    close(out.loss, [6.5 / 3])
    out.loss.sum().backward()
    assert new.grad is not None
    close(new.grad, [[-1 / 3, -2 / 3, 0.0, -1.0]])
    close(reinforce_loss(lp, per_token, m, level="trajectory").loss, [7 / 3])


def test_reinforce_diagnostics_and_empty_sequence() -> None:
    lp = t64([[-1.0, -2.0], [-1.0, -1.0]])
    old = t64([[-1.1, -1.8], [NAN, NAN]])
    m = mask([[T, T], [F, F]])
    out = reinforce_loss(lp, t64([1.0, 1.0]), m, old_logprobs=old)
    # row 0: log ratios [.1, -.2]: sum -.1, ratio mean (e^.1 + e^-.2)/2; row 1: nothing.
    close(out.loss, [1.5, 0.0])
    close(out.log_ratio_sum, [-0.1, 0.0])
    close(out.ratio_mean, [(math.exp(0.1) + math.exp(-0.2)) / 2, 1.0])
    close(out.clipped, [0.0, 0.0])
    bare = reinforce_loss(lp, t64([1.0, 1.0]), m)
    close(bare.ratio_mean, [1.0, 1.0])
    close(bare.log_ratio_sum, [0.0, 0.0])


# ---------------------------------------------------------------------------------- KL


def test_kl_estimates_by_hand() -> None:
    # lr = [.1, -.2, .3]:  k1 = -(.1 - .2 + .3) / 3 = -.0666667
    # k3 terms e^lr - 1 - lr: e^.1 - 1.1 = .0051709, e^-.2 - .8 = .0187308,
    #   e^.3 - 1.3 = .0498588; mean = .0737605 / 3 = .0245868
    out = kl_estimates(t64([0.1, -0.2, 0.3]))
    assert abs(out.k1.item() + 0.2 / 3) < 1e-12
    assert abs(out.k3.item() - 0.0245868) < 1e-7
    assert out.k3.item() == pytest.approx(
        (math.exp(0.1) - 1.1 + math.exp(-0.2) - 0.8 + math.exp(0.3) - 1.3) / 3, abs=1e-15
    )
    assert out.k1.shape == () and out.k3.shape == ()


def test_kl_estimates_edge_cases() -> None:
    empty = kl_estimates(t64([]))
    assert empty.k1.item() == 0.0 and empty.k3.item() == 0.0
    assert kl_estimates(torch.zeros(4)).k3.item() == 0.0  # pi_theta == pi_old
    assert kl_estimates(t64([-5.0])).k3.item() > 0  # k3 is never negative
    with pytest.raises(ValueError, match="B,"):
        kl_estimates(t64([[0.1]]))


def test_token_kl_estimates_by_hand() -> None:
    # Output tokens' log ratios: row 0 [.1, -.2], row 1 [.3] (pooled over the batch, n = 3):
    # the same three numbers as test_kl_estimates_by_hand.
    new = t64([[0.1, -0.2, 5.0], [0.3, 7.0, 7.0]])
    old = t64([[0.0, 0.0, NAN], [0.0, NAN, NAN]])
    out = token_kl_estimates(new, old, mask([[T, T, F], [T, F, F]]))
    assert abs(out.k1.item() + 0.2 / 3) < 1e-12
    assert abs(out.k3.item() - 0.0245868) < 1e-7


def test_cross_entropy_by_hand() -> None:
    # log p on output tokens [-1, -2, -.5] (token 2 is not output): loss 3.5 / 3, each output
    # token's gradient -1/3, the masked one none; an empty sequence gives 0.
    lp = t64([[-1.0, -2.0, -9.0, -0.5], [-3.0, -3.0, -3.0, -3.0]])
    m = mask([[T, T, F, T], [F, F, F, F]])
    new = lp.clone().requires_grad_(True)
    out = cross_entropy_loss(new, m)
    close(out.loss, [3.5 / 3, 0.0])
    out.loss.sum().backward()
    assert new.grad is not None
    close(new.grad, [[-1 / 3, -1 / 3, 0.0, -1 / 3], [0.0, 0.0, 0.0, 0.0]])
    close(out.clipped, [0.0, 0.0])
    close(out.log_ratio_sum, [0.0, 0.0])
    # With old log-probs (expert iteration) the KL diagnostics are filled in.
    old = t64([[-1.5, -2.0, NAN, -0.5], [NAN, NAN, NAN, NAN]])
    close(cross_entropy_loss(lp, m, old_logprobs=old).log_ratio_sum, [0.5, 0.0])


# ------------------------------------------------------------------- value loss and KL penalty


def test_clipped_value_loss_by_hand() -> None:
    # Output tokens 1 and 2 (token 0 is a prompt token holding junk), clip 0.2:
    # tok 1: V 0.4, old 0.3, R 1: (0.4-1)^2 = 0.36; V_clip = 0.4 (inside the band): 0.36
    # tok 2: V 0.9, old 0.3, R 1: (0.9-1)^2 = 0.01; V_clip = 0.3 + 0.2 = 0.5: 0.25 (clipped)
    # loss = 1/2 (0.36 + 0.25) / 2 = 0.1525; clipfrac 1/2; error (0.36 + 0.01) / 2 = 0.185
    values = torch.tensor([[7.0, 0.4, 0.9]], requires_grad=True)
    old = torch.tensor([[7.0, 0.3, 0.3]])
    returns = torch.tensor([[7.0, 1.0, 1.0]])
    mask = torch.tensor([[False, True, True]])
    out = clipped_value_loss(values, old, returns, mask, clip_eps=0.2)
    torch.testing.assert_close(out.loss, torch.tensor([0.1525]))
    torch.testing.assert_close(out.clipped, torch.tensor([0.5]))
    torch.testing.assert_close(out.error, torch.tensor([0.185]))
    out.loss.sum().backward()
    # d/dV of 1/2 (V - R)^2 / 2 at tok 1 = (0.4 - 1) / 2 = -0.3; tok 2 clipped: no gradient
    assert values.grad is not None
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -0.3, 0.0]]))


def test_clipped_value_loss_weights_and_no_clip_by_hand() -> None:
    values = torch.tensor([[0.4, 0.9]])
    old, returns = torch.tensor([[0.3, 0.3]]), torch.tensor([[1.0, 1.0]])
    mask = torch.tensor([[True, True]])
    # First token of the turn weighs 3: loss = 1/2 (3 * 0.36 + 0.25) / 4 = 0.16625,
    # clipfrac 1/4, error (3 * 0.36 + 0.01) / 4 = 0.2725
    out = clipped_value_loss(values, old, returns, mask, weights=torch.tensor([[3.0, 1.0]]))
    torch.testing.assert_close(out.loss, torch.tensor([0.16625]))
    torch.testing.assert_close(out.clipped, torch.tensor([0.25]))
    torch.testing.assert_close(out.error, torch.tensor([0.2725]))
    # No clipping: 1/2 (0.36 + 0.01) / 2 = 0.0925
    out = clipped_value_loss(values, old, returns, mask, clip_eps=None)
    torch.testing.assert_close(out.loss, torch.tensor([0.0925]))
    empty = clipped_value_loss(values, old, returns, torch.zeros(1, 2, dtype=torch.bool))
    torch.testing.assert_close(empty.loss, torch.tensor([0.0]))


def test_kl_penalty_k3_by_hand() -> None:
    # tok 0: ref = logp: 0.  tok 1: ref - logp = 1: e^1 - 1 - 1 = e - 2.  tok 2 off the mask.
    logprobs = torch.tensor([[-1.0, -2.0, -5.0]], requires_grad=True)
    ref = torch.tensor([[-1.0, -1.0, float("nan")]])
    mask = torch.tensor([[True, True, False]])
    kl = kl_penalty(logprobs, ref, mask)
    torch.testing.assert_close(kl, torch.tensor([(math.e - 2) / 2]))
    kl.sum().backward()
    # d/dlogp (e^(ref - logp) - (ref - logp) - 1) = 1 - e^(ref - logp): 0 and (1 - e), over 2
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, (1 - math.e) / 2, 0.0]]))
    same = kl_penalty(ref.nan_to_num(), ref.nan_to_num(), torch.ones(1, 3, dtype=torch.bool))
    torch.testing.assert_close(same, torch.tensor([0.0]))
