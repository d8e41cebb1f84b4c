"""DMPO: its pairs, its loss worked out by hand, its config rules, and learning on the word task.

    python -m pytest tests/loop/test_preference.py -q        (about half a minute on 2 cores)

The loss tests use numbers computed by hand from [DMPO] Eq. 13 (loop/algo/preference.py); the
per-sequence form the learner uses is checked against the pair form, value and gradient. The
learning test runs the real `train()` on the synthetic word task (tests/loop/synthetic.py).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from loop.algo.preference import (
    dmpo_loss,
    dmpo_scores,
    dmpo_turn_weights,
    dpo_pair_loss,
    preference_signs,
)
from loop.config import ConfigError, load_config
from tests.loop.synthetic import MultiTurnWordSuite, run_synthetic

ROOT = Path(__file__).resolve().parents[2]


def test_pairs_are_consecutive_rollouts_whose_returns_differ_by_more_than_the_margin() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.5, 0.6, 0.3], [0.2, 0.9, 0.4, 0.4, 0.0]])
    present = torch.ones(2, 5, dtype=torch.bool)
    present[1, 1] = False  # an infrastructure failure: its pair is no pair
    out = preference_signs(rewards, present, margin=0.05)
    assert out.signs.tolist() == [[1, -1, -1, 1, 0], [0, 0, 0, 0, 0]]
    assert out.valid.tolist() == [[True, True, True, True, False], [False] * 5]
    assert out.kept_groups.tolist() == [True, False]
    # the gap of 0.1 is not more than 0.15; a tie (0.4, 0.4) is never a pair
    assert preference_signs(rewards, present, margin=0.15).signs[0].tolist() == [1, -1, 0, 0, 0]
    assert preference_signs(rewards, present, margin=0.0).signs[1].tolist() == [0, 0, 0, 0, 0]


def test_turn_weights_by_hand() -> None:
    # phi(t, T) = (1 - g^(T-t)) / (1 - g^T); T = 3, g = 0.5: 1, 0.75/0.875, 0.5/0.875
    weights = dmpo_turn_weights(torch.tensor([3, 1]), 3, gamma=0.5)
    expected = [[1.0, 0.75 / 0.875, 0.5 / 0.875], [1.0, 0.0, 0.0]]
    assert torch.allclose(weights, torch.tensor(expected, dtype=torch.float64))
    # gamma = 1 is the limit (T - t) / T
    weights = dmpo_turn_weights(torch.tensor([2]), 2, gamma=1.0)
    assert weights.tolist() == [[1.0, 0.5]]


def two_turn_sequence() -> tuple[torch.Tensor, ...]:
    """One sequence: a prompt token, turn 0 (two tokens, log-ratios 0.2 and 0.1), an
    observation token, turn 1 (one token, log-ratio -0.4)."""
    mask = torch.tensor([[False, True, True, False, True]])
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1]])
    ref = torch.tensor([[math.nan, -1.0, -2.0, math.nan, -0.5]])  # NaN off the mask
    logprobs = torch.tensor([[-9.0, -0.8, -1.9, -7.0, -0.9]], dtype=torch.float64)
    return logprobs, ref.double(), mask, turn_ids


def test_scores_sum_each_turns_log_ratio_with_its_weight() -> None:
    logprobs, ref, mask, turn_ids = two_turn_sequence()
    # T = 2, g = 0.5: phi = 1, (1 - 0.5) / (1 - 0.25) = 2/3; S = 0.3 + 2/3 * (-0.4)
    score = dmpo_scores(logprobs, ref, mask, turn_ids, gamma=0.5)
    assert score.item() == pytest.approx(0.3 - 0.4 * 2 / 3)
    # g = 1: phi = 1, 1/2
    assert dmpo_scores(logprobs, ref, mask, turn_ids, gamma=1.0).item() == pytest.approx(0.1)


def test_pair_loss_by_hand() -> None:
    # S_w = 0.1, S_l = -0.3, beta = 0.5: -log sigmoid(0.2) = log(1 + e^-0.2)
    loss = dpo_pair_loss(torch.tensor([0.1]), torch.tensor([-0.3]), beta=0.5)
    assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.2)))


def test_with_one_turn_per_sequence_it_is_dpo_by_hand() -> None:
    """DPO-MCTS's pairs: one candidate turn each after a shared prompt. phi(0, 1) = 1 for any
    gamma, so L = -log sigmoid(beta ((log pi_w - log ref_w) - (log pi_l - log ref_l)))."""
    mask = torch.tensor([[False, True, True], [False, True, True]])
    turn_ids = torch.tensor([[-1, 0, 0], [-1, 0, 0]])
    ref = torch.tensor([[math.nan, -1.0, -1.0], [math.nan, -2.0, -0.5]], dtype=torch.float64)
    logprobs = torch.tensor([[-5.0, -0.7, -1.1], [-5.0, -2.1, -0.6]], dtype=torch.float64)
    # chosen: 0.3 - 0.1 = 0.2; rejected: -0.1 - 0.1 = -0.2; beta 2: -log sigmoid(0.8)
    for gamma in (0.5, 1.0):
        scores = dmpo_scores(logprobs, ref, mask, turn_ids, gamma=gamma)
        assert scores.tolist() == pytest.approx([0.2, -0.2])
        loss = dpo_pair_loss(scores[:1], scores[1:], beta=2.0)
        assert loss.item() == pytest.approx(math.log(1 + math.exp(-0.8)))


def test_the_per_sequence_form_has_the_pair_losss_value_and_gradient() -> None:
    torch.manual_seed(0)
    mask = torch.tensor([[True, True, False, True, True], [True, False, True, True, False]])
    turn_ids = torch.tensor([[0, 0, -1, 1, 2], [0, -1, 1, 1, -1]])
    ref = torch.randn(2, 5, dtype=torch.float64)
    logprobs = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    beta, gamma = 0.7, 0.8
    scores = dmpo_scores(logprobs, ref, mask, turn_ids, gamma=gamma)
    pair = dpo_pair_loss(scores[:1], scores[1:], beta=beta).sum()
    (expected,) = torch.autograd.grad(pair, logprobs)
    signs = torch.tensor([1.0, -1.0])
    partner = scores.detach().flip(0)  # each member's partner's current score
    out = dmpo_loss(logprobs, ref, mask, turn_ids, signs, partner, beta=beta, gamma=gamma)
    (got,) = torch.autograd.grad(out.loss.sum(), logprobs)
    assert out.loss.sum().item() == pytest.approx(pair.item())
    assert torch.allclose(got, expected)
    assert torch.all(got[~mask] == 0)  # nothing off the output tokens


def test_at_the_reference_the_gradient_is_half_beta_times_the_score_difference() -> None:
    """The learner's case: the step runs the reference's weights, every score is 0, the
    partner's score taken as 0 is exact, and L = log 2."""
    logprobs, ref, mask, turn_ids = two_turn_sequence()
    logprobs = torch.where(mask, ref, logprobs).repeat(2, 1).requires_grad_(True)
    ref = ref.repeat(2, 1)
    out = dmpo_loss(
        logprobs, ref, mask.repeat(2, 1), turn_ids.repeat(2, 1), torch.tensor([1.0, -1.0]),
        torch.zeros(2), beta=0.5, gamma=0.5,
    )  # fmt: skip
    assert out.loss.sum().item() == pytest.approx(math.log(2))
    (grad,) = torch.autograd.grad(out.loss.sum(), logprobs)
    phi = [0.0, 1.0, 1.0, 0.0, 2 / 3]  # per token: its turn's weight
    expected = torch.tensor([[-0.25 * w for w in phi], [0.25 * w for w in phi]])
    assert torch.allclose(grad, expected.double())


def test_a_sequence_without_a_pair_gets_no_gradient() -> None:
    logprobs, ref, mask, turn_ids = two_turn_sequence()
    logprobs = logprobs.clone().requires_grad_(True)
    out = dmpo_loss(
        logprobs, ref, mask, turn_ids, torch.zeros(1), torch.zeros(1), beta=0.1, gamma=0.9
    )
    (grad,) = torch.autograd.grad(out.loss.sum(), logprobs)
    assert out.loss.item() == 0 and torch.all(grad == 0)


def test_the_shipped_config_is_the_papers_dmpo() -> None:
    config = load_config(ROOT / "configs/table1/dmpo.yaml")
    train = config.train
    assert (train.advantage, train.loss, train.rollouts_per_task) == ("preference", "dpo", 2)
    assert train.strictly_on_policy and train.epochs == 1


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.loss=ppo"], "train.advantage preference goes with loss dpo"),
        (["train.advantage=loo"], "train.advantage preference goes with loss dpo"),
        (["train.preference.beta=0"], "train.preference: beta > 0"),
        (["train.preference.gamma=0"], "train.preference: beta > 0, gamma in (0, 1]"),
        (["train.preference.margin=-1"], "margin >= 0"),
    ],
)
def test_bad_preference_settings_are_one_line_errors(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_config(ROOT / "configs/table1/dmpo.yaml", overrides)
    assert "\n" not in str(caught.value)


def test_dmpo_without_strictly_on_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="strictly_on_policy"):
        load_config(
            ROOT / "configs/table1/dmpo.yaml",
            ["train.strictly_on_policy=false", "train.epochs=2"],
        )


DMPO = [
    "train.advantage=preference", "train.loss=dpo", "train.strictly_on_policy=true",
    "train.epochs=1", "train.preference.beta=1.0",
]  # fmt: skip


def test_dmpo_raises_the_reward(tmp_path: Path) -> None:
    records = run_synthetic(tmp_path, 6, *DMPO, "train.tasks_per_iteration=4")
    curve = [r["rollout/reward_mean"] for r in records]
    assert sum(curve[-2:]) / 2 > curve[0] + 0.15, curve
    assert all(r["loss/policy"] == pytest.approx(math.log(2) / 2, abs=1e-3) for r in records)


def test_dmpo_trains_on_multi_turn_episodes(tmp_path: Path) -> None:
    """Three turns per episode: the turn weights phi(t, 3) in the learner's loss; the one step
    of each iteration at the reference (loss log 2 / 2 per rollout)."""
    records = run_synthetic(
        tmp_path, 2, *DMPO, "agent.max_turns=3", "train.preference.gamma=0.5",
        suite=MultiTurnWordSuite(turns=3),
    )  # fmt: skip
    assert len(records) == 2
    assert all(r["loss/policy"] == pytest.approx(math.log(2) / 2, abs=1e-3) for r in records)
    assert all(r["loss/grad_norm"] > 0 for r in records)


def test_dmpo_with_the_preferences_flipped_does_not_raise_the_reward(
    tmp_path: Path, flipped_preferences: None
) -> None:
    records = run_synthetic(tmp_path, 6, *DMPO, "train.tasks_per_iteration=4")
    curve = [r["rollout/reward_mean"] for r in records]
    assert sum(curve[-2:]) / 2 < curve[0], curve
