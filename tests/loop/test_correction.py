"""The decoupled loss's behaviour weights (`loop.algo.correction`) and the weighted clipped
surrogate, against numbers worked out by hand (truncated, masked, unknown sampler log-probs,
gradients through autograd); their `is/*` metrics; `none` equal to the unweighted loss to the
last bit; the learner's metrics on a tiny policy.

Run: python -m pytest tests/loop/test_correction.py -q
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from loop.algo.correction import behaviour_weights, split_mismatch, weight_stats
from loop.algo.losses import clipped_surrogate_loss
from loop.learner.batch import Sample
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from loop.learner.stats import importance_metrics, token_weights
from loop.model.checkpoint import save_weights
from loop.model.policy import LoraSettings, policy_from_model
from tests.loop.conftest import tiny_llama, tiny_tokenizer
from tests.loop.synthetic import synthetic_policy

T, F = True, False
NAN = math.nan
LN = math.log

# One sequence: a prompt position, then four output tokens, A = 1, eps = 0.1 (band [1/1.1, 1.1]).
#   token  pi_theta  pi_prox  mu     r = theta/prox      rho = prox/mu
#   1      0.5       0.5      0.2    1    (o = 1)        2.5  (over the cap 2 and the band)
#   2      0.42      0.4      0.5    1.05 (o = 1.05)     0.8
#   3      0.3       0.3      NaN    1    (o = 1)        unknown: w = 1
#   4      0.6       0.5      0.5    1.2  (clipped: 1.1) 1
MASK = torch.tensor([[F, T, T, T, T]])
THETA = [LN(0.9), LN(0.5), LN(0.42), LN(0.3), LN(0.6)]
PROX = torch.tensor([[NAN, LN(0.5), LN(0.4), LN(0.3), LN(0.5)]], dtype=torch.float64)
MU = torch.tensor([[NAN, LN(0.2), LN(0.5), NAN, LN(0.5)]], dtype=torch.float64)
ADV = torch.tensor([1.0], dtype=torch.float64)


def weights_of(correction: str) -> torch.Tensor:
    return behaviour_weights(PROX, MU, MASK, correction=correction).weights  # type: ignore[arg-type]


def loss_and_grad(weights: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    theta = torch.tensor([THETA], dtype=torch.float64, requires_grad=True)
    out = clipped_surrogate_loss(theta, PROX, ADV, MASK, clip_eps=0.1, weights=weights)
    out.loss.sum().backward()
    assert theta.grad is not None
    return out.loss.detach(), theta.grad


def test_the_behaviour_weights_by_hand() -> None:
    truncate = behaviour_weights(PROX, MU, MASK, correction="truncate", cap=2.0)
    assert torch.allclose(truncate.ratio, torch.tensor([[1, 2.5, 0.8, 1, 1]], dtype=torch.float64))
    assert torch.allclose(truncate.weights, torch.tensor([[0, 2, 0.8, 1, 1]], dtype=torch.float64))
    assert truncate.corrected.tolist() == [[F, T, F, F, F]]
    assert truncate.unknown.tolist() == [[F, F, F, T, F]]
    masked = behaviour_weights(PROX, MU, MASK, correction="mask", band=(0.5, 2.0))
    assert torch.allclose(masked.weights, torch.tensor([[0, 0, 0.8, 1, 1]], dtype=torch.float64))
    assert masked.corrected.tolist() == [[F, T, F, F, F]]
    none = behaviour_weights(PROX, MU, MASK, correction="none")
    assert none.weights.tolist() == [[0, 1, 1, 1, 1]] and not none.corrected.any()
    # a wider cap or band leaves token 1 alone
    assert float(weights_of_cap(3.0)[0, 1]) == pytest.approx(2.5)


def weights_of_cap(cap: float) -> torch.Tensor:
    return behaviour_weights(PROX, MU, MASK, correction="truncate", cap=cap).weights


def test_the_truncated_loss_and_its_gradient_by_hand() -> None:
    # loss = -(w1*1 + w2*1.05 + w3*1 + w4*1.1)/4; d/dlog pi_theta_t = -w_t r_t A / 4 unless clipped
    loss, grad = loss_and_grad(weights_of("truncate"))
    assert float(loss[0]) == pytest.approx(-(2 * 1 + 0.8 * 1.05 + 1 + 1.1) / 4)
    expected = [0, -2 * 1 / 4, -0.8 * 1.05 / 4, -1 / 4, 0]
    assert grad[0].tolist() == pytest.approx(expected)


def test_the_untruncated_loss_and_its_gradient_by_hand() -> None:
    loss, grad = loss_and_grad(weights_of_cap(3.0))  # w1 = 2.5, under the cap
    assert float(loss[0]) == pytest.approx(-(2.5 + 0.8 * 1.05 + 1 + 1.1) / 4)
    assert grad[0].tolist() == pytest.approx([0, -2.5 / 4, -0.8 * 1.05 / 4, -1 / 4, 0])


def test_the_masked_loss_and_its_gradient_by_hand() -> None:
    # token 1 leaves the band: no objective, no gradient, still in the denominator 4
    loss, grad = loss_and_grad(weights_of("mask"))
    assert float(loss[0]) == pytest.approx(-(0.8 * 1.05 + 1 + 1.1) / 4)
    assert grad[0].tolist() == pytest.approx([0, 0, -0.8 * 1.05 / 4, -1 / 4, 0])


def test_none_is_the_unweighted_loss_to_the_last_bit() -> None:
    plain_loss, plain_grad = loss_and_grad(None)
    assert float(plain_loss[0]) == pytest.approx(-(1 + 1.05 + 1 + 1.1) / 4)
    loss, grad = loss_and_grad(weights_of("none"))
    assert torch.equal(loss, plain_loss) and torch.equal(grad, plain_grad)


def test_weights_need_the_token_level() -> None:
    theta = torch.tensor([THETA], dtype=torch.float64)
    turn_ids = torch.tensor([[-1, 0, 0, 0, 0]])
    with pytest.raises(ValueError, match="level 'token'"):
        clipped_surrogate_loss(
            theta, PROX, ADV, MASK, level="turn", turn_ids=turn_ids, weights=weights_of("none")
        )


def test_the_metrics_by_hand() -> None:
    truncate = behaviour_weights(PROX, MU, MASK, correction="truncate", cap=2.0)
    on = MASK[0]
    stats = weight_stats(*(x[0][on] for x in truncate))
    assert (stats.tokens, stats.unknown, stats.corrected_frac) == (4, 1, 0.25)
    assert stats.w_mean == pytest.approx((2.5 + 0.8 + 1 + 1) / 4)
    assert stats.w_max == pytest.approx(2.5)
    # sorted 0.8, 1, 1, 2.5: the 0.99 quantile sits at 0.99 * 3 = 2.97, between 1 and 2.5
    assert stats.w_p99 == pytest.approx(1 + 0.97 * 1.5)
    # applied w = 2, 0.8, 1, 1: (sum w)^2 / (n sum w^2)
    assert stats.ess == pytest.approx(4.8**2 / (4 * (4 + 0.64 + 1 + 1)))
    # k3 = rho - 1 - log rho over the three tokens with a known mu (the third is 0)
    k3 = (2.5 - 1 - LN(2.5)) + (0.8 - 1 - LN(0.8)) + 0
    assert stats.mismatch_k3 == pytest.approx(k3 / 3)
    metrics = importance_metrics(stats, "truncate")
    assert metrics["is/truncated_frac"] == 0.25 and "is/masked_frac" not in metrics
    assert importance_metrics(stats, "mask")["is/masked_frac"] == 0.25
    assert not any(k.endswith("_frac") for k in importance_metrics(stats, "none"))


def test_no_tokens_give_neutral_metrics() -> None:
    empty, flags = torch.empty(0), torch.empty(0, dtype=torch.bool)
    stats = weight_stats(empty, empty, flags, flags)
    assert (stats.tokens, stats.w_mean, stats.ess, stats.mismatch_k3) == (0, 1, 1, 0)


def test_token_weights_gather_every_samples_output_tokens() -> None:
    def make(prox: list[float], mu: list[float]) -> Sample:
        n = len(prox)
        is_output = torch.tensor([F] + [T] * (n - 1))
        return Sample(
            torch.arange(n), is_output, torch.tensor(mu), torch.where(is_output, 0, -1),
            torch.zeros(n), old_logprobs=torch.tensor(prox),
        )  # fmt: skip

    samples = [make([NAN, LN(0.5)], [NAN, LN(0.2)]), make([NAN, LN(0.4), 0.0], [NAN, LN(0.5), NAN])]
    ratio, weights, corrected, unknown = token_weights(
        samples, correction="mask", cap=2.0, band=(0.5, 2.0)
    )
    assert ratio.tolist() == pytest.approx([2.5, 0.8, 1.0])
    assert weights.tolist() == pytest.approx([0.0, 0.8, 1.0])
    assert corrected.tolist() == [T, F, F] and unknown.tolist() == [F, F, T]


def test_the_learner_reports_is_metrics_and_in_sync_the_weights_change_nothing() -> None:
    def sample() -> Sample:
        is_output = torch.arange(10) >= 6
        return Sample(
            torch.arange(3, 13), is_output, torch.full((10,), NAN), torch.where(is_output, 0, -1),
            torch.where(is_output, 1.0, 0.0),
        )  # fmt: skip

    losses = {}
    for correction in ("none", "truncate"):
        settings = LearnerSettings(
            lr=1e-3, weight_decay=0.0, minibatch_size=1, is_correction=correction
        )
        learner = Learner(synthetic_policy(), settings)
        samples = [sample()]
        learner.recompute_old_logprobs(samples)
        assert samples[0].old_logprobs is not None
        samples[0].sampler_logprobs = torch.where(
            samples[0].is_output, samples[0].old_logprobs, NAN
        )  # a synchronous sampler: mu = pi_prox, w = 1 exactly
        metrics = learner.learn(samples, seed=0).metrics()
        losses[correction] = metrics["loss/policy"]
        assert metrics["is/tokens"] == 4 and metrics["is/unknown_tokens"] == 0
        assert metrics["is/w_mean"] == 1 and metrics["is/ess"] == 1
        assert metrics["is/mismatch_k3"] == 0
    assert losses["truncate"] == losses["none"]
    assert metrics["is/truncated_frac"] == 0


def test_the_mismatch_splits_at_the_sampled_weights_by_hand() -> None:
    # four tokens: mu, pi_v (the version sampled), pi_prox (now); the third has no mu
    mu = torch.tensor([LN(0.2), LN(0.5), NAN, LN(0.5)])
    pi_v = torch.tensor([LN(0.4), LN(0.5), LN(0.3), LN(0.25)])
    prox = torch.tensor([LN(0.4), LN(0.25), LN(0.9), LN(0.25)])
    mask = torch.tensor([T, T, T, T])

    def k3(rho: float) -> float:
        return rho - 1 - math.log(rho)

    split = split_mismatch(mu, pi_v, prox, mask)
    assert split.tokens == 3
    assert split.engine_k3 == pytest.approx((k3(2.0) + k3(1.0) + k3(0.5)) / 3)
    assert split.staleness_k3 == pytest.approx((k3(1.0) + k3(0.5) + k3(1.0)) / 3)
    # the current version's rollouts: pi_v = pi_prox, the whole mismatch is the engine's
    same = split_mismatch(mu, prox, prox, mask)
    assert same.staleness_k3 == 0 and same.engine_k3 > 0
    assert split_mismatch(mu, pi_v, prox, torch.zeros(4, dtype=torch.bool)).tokens == 0


def test_log_probs_under_an_older_adapter_leave_the_current_weights_bit_for_bit(
    tmp_path: Path,
) -> None:
    policy = policy_from_model(
        tiny_llama(), tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(rank=4, alpha=8)
    )
    learner = Learner(policy, LearnerSettings(lr=1e-3, weight_decay=0.0, minibatch_size=1))
    is_output = torch.arange(10) >= 6
    sample = Sample(
        torch.arange(3, 13), is_output, torch.full((10,), NAN), torch.where(is_output, 0, -1),
        torch.where(is_output, 1.0, 0.0),
    )  # fmt: skip
    with torch.no_grad():  # version v: LoRA B factors that count
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(1))
    save_weights(policy.model, tmp_path / "v1")
    learner.recompute_old_logprobs([sample])
    at_v = sample.old_logprobs
    with torch.no_grad():  # the learner moves on: version k
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.add_(1.0)
    now = {n: p.detach().clone() for n, p in policy.model.named_parameters()}
    learner.recompute_old_logprobs([sample])
    assert at_v is not None and sample.old_logprobs is not None
    assert not torch.equal(at_v, sample.old_logprobs)

    (under_v,) = learner.logprobs_with_adapter(tmp_path / "v1", [sample])
    assert torch.equal(under_v, at_v)
    after = dict(policy.model.named_parameters())
    assert all(torch.equal(after[n], now[n]) for n in now)  # the current weights, exactly
    assert policy.model.training  # the mode restored as well
