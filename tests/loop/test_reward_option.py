"""`train.reward: acted`: the collateral test counts only once the agent acted (hand-computed).

Run: python -m pytest tests/loop/test_reward_option.py
"""

from __future__ import annotations

import pytest

from loop.config import load_config
from loop.credit import assign_credit, rollout_reward
from loop.metrics import rollout_metrics
from loop.trajectory import Trajectory, Turn


def rollout(status: str, calls: list[tuple[str, bool]], goal: bool = False) -> Trajectory:
    traj = Trajectory("t_1", "t", 1, 0, status=status)  # type: ignore[arg-type]
    turn = Turn(0, 1, "stop", "t", "x = 1")
    turn.api_calls = [{"app": "phone", "api": api, "ok": ok} for api, ok in calls]
    traj.turns = [turn]
    traj.tests = [
        {"name": "email_updated", "passed": goal},
        {"name": "no_collateral_changes", "passed": True},
    ]
    traj.reward, traj.success = (1.0 if goal else 0.5), goal
    return traj


def test_doing_nothing_earns_nothing_under_acted_and_half_under_fraction() -> None:
    reads = [("login", True), ("show_profile", True), ("search_contacts", True)]
    idle = rollout("max_turns", reads)
    assert rollout_reward(idle, "fraction") == 0.5
    assert rollout_reward(idle, "acted") == 0.0


@pytest.mark.parametrize(
    ("status", "calls", "reward"),
    [
        ("ok", [], 0.5),  # called complete_task
        ("max_turns", [("update_contact", True)], 0.5),  # changed something
        ("max_turns", [("update_contact", False)], 0.0),  # a refused write is not acting
    ],
)
def test_the_collateral_test_counts_once_the_agent_acted(
    status: str, calls: list[tuple[str, bool]], reward: float
) -> None:
    assert rollout_reward(rollout(status, calls), "acted") == reward


def test_acted_is_the_reward_the_advantages_see_and_it_is_logged() -> None:
    idle = rollout("max_turns", [])
    wrong = rollout("ok", [("update_contact", True)])
    right = rollout("ok", [("update_contact", True)], goal=True)
    group = [idle, wrong, right]
    credit = assign_credit([group], method="loo", reward="acted", threshold=0.01)
    assert credit.rewards == [0.0, 0.5, 1.0]
    # LOO: A_i = R_i - mean of the others; the idle rollout is now the worst, not a tie.
    assert [a[0] for a in credit.turn_advantages] == pytest.approx([-0.75, 0.0, 0.75])
    metrics = rollout_metrics([group], credit, 0, [], credit.keep)
    assert metrics["rollout/train_reward_mean"] == pytest.approx(0.5)
    assert metrics["rollout/reward_mean"] == pytest.approx(2.0 / 3)  # the tests' own reward
    assert load_config(None, ["train.reward=acted"]).train.reward == "acted"
