"""The learner's step guards, each on a tiny policy: what must stop a step, and what must not.

Run: python -m pytest tests/loop/test_learner_guards.py
"""

from __future__ import annotations

import torch

from loop.learner.batch import Sample
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from tests.loop.synthetic import synthetic_policy


def sample(old_logprobs: torch.Tensor) -> Sample:
    tokens = torch.arange(3, 13)
    is_output = torch.zeros(10, dtype=torch.bool)
    is_output[6:] = True
    return Sample(
        tokens, is_output, torch.full((10,), float("nan")), torch.where(is_output, 0, -1),
        torch.where(is_output, 1.0, 0.0), old_logprobs=old_logprobs,
    )  # fmt: skip


def test_a_non_finite_gradient_norm_after_a_finite_loss_skips_the_step() -> None:
    policy = synthetic_policy()
    learner = Learner(
        policy, LearnerSettings(lr=1e-3, weight_decay=0.0, minibatch_size=1, kl_threshold=1e9)
    )
    first = next(p for p in policy.model.parameters() if p.requires_grad)
    first.register_hook(lambda grad: grad * float("inf"))  # the loss stays finite
    before = {k: v.clone() for k, v in policy.model.state_dict().items()}
    stats = learner.learn([sample(torch.zeros(10))], seed=0)
    assert stats.skipped_nan == 1 and stats.optimizer_steps == 0, stats
    after = policy.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # no NaN was written


def test_reinforce_measures_the_kl_to_the_old_policy_and_stops_on_it() -> None:
    policy = synthetic_policy()
    # Old log-probs of 0 (probability 1) make every ratio p < 1: k1 = -mean(sum log r) > 0.
    learner = Learner(
        policy, LearnerSettings(lr=1e-3, weight_decay=0.0, minibatch_size=1, loss="reinforce")
    )
    stats = learner.learn([sample(torch.zeros(10))], seed=0)
    assert stats.kl_k1[0] > 0 and stats.kl_k3[0] > 0, stats
    strict = Learner(
        synthetic_policy(),
        LearnerSettings(
            lr=1e-3, weight_decay=0.0, minibatch_size=1, loss="reinforce", kl_threshold=1e-6
        ),
    )
    stats = strict.learn([sample(torch.zeros(10))], seed=0)
    assert stats.skipped_high_kl == 1 and stats.optimizer_steps == 0, stats
