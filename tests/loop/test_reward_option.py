"""`train.reward: acted`: the collateral test counts only once the agent acted (hand-computed):
changed the state or passed a test that is not collateral, never by which APIs it called; what
is collateral and whether the state changed is the suite's to say (the built-in world says
both, a suite that says neither is refused `acted` in one line).

Run: python -m pytest tests/loop/test_reward_option.py
"""

from __future__ import annotations

import asyncio

import pytest

from loop.algo.credit import assign_credit, rollout_reward
from loop.checks import check_run
from loop.config import ConfigError, load_config
from loop.rollout.trajectory import Trajectory, Turn
from loop.run.metrics import iteration_metrics
from tasks.apptown import AppTownSuite

READS = ("login", "show_profile", "search_contacts")  # what the built-in world marks read-only


def rollout(
    status: str, calls: list[tuple[str, bool]], goal: bool = False, changed: bool = False
) -> Trajectory:
    traj = Trajectory("t_1", "t", 1, 0, status=status, state_changed=changed)  # type: ignore[arg-type]
    turn = Turn(0, 1, "stop", "t", "x = 1")
    turn.api_calls = [
        {"app": "phone", "api": api, "ok": ok, "read_only": api in READS} for api, ok in calls
    ]
    traj.turns = [turn]
    traj.tests = [
        {"name": "email_updated", "passed": goal, "collateral": False},
        {"name": "no_collateral_changes", "passed": True, "collateral": True},
    ]
    traj.reward, traj.success = (1.0 if goal else 0.5), goal
    return traj


def test_doing_nothing_earns_nothing_under_acted_and_half_under_fraction() -> None:
    reads = [("login", True), ("show_profile", True), ("search_contacts", True)]
    idle = rollout("max_turns", reads)
    assert rollout_reward(idle, "fraction") == 0.5
    assert rollout_reward(idle, "acted") == 0.0


@pytest.mark.parametrize(
    ("status", "calls", "changed", "reward"),
    [
        ("ok", [], False, 0.0),  # complete_task alone is not acting
        ("max_turns", [("update_contact", True)], True, 0.5),  # changed something
        ("ok", [("update_contact", True)] * 2, False, 0.0),  # a write undone changed nothing
        ("max_turns", [("update_contact", False)], False, 0.0),  # a refused write neither
    ],
)
def test_the_collateral_test_counts_once_the_agent_acted(
    status: str, calls: list[tuple[str, bool]], changed: bool, reward: float
) -> None:
    assert rollout_reward(rollout(status, calls, changed=changed), "acted") == reward


def test_passing_the_tasks_own_test_is_acting_without_a_change() -> None:
    """A question answered right changes nothing, and earns the whole reward."""
    answered = rollout("ok", [("show_profile", True)], goal=True)
    assert rollout_reward(answered, "acted") == 1.0


def test_acted_is_the_reward_the_advantages_see_and_it_is_logged() -> None:
    idle = rollout("ok", [])
    wrong = rollout("ok", [("update_contact", True)], changed=True)
    right = rollout("ok", [("update_contact", True)], goal=True, changed=True)
    group = [idle, wrong, right]
    credit = assign_credit([group], method="loo", reward="acted", threshold=0.01)
    assert credit.rewards == [0.0, 0.5, 1.0]
    # LOO: A_i = R_i - mean of the others; the idle rollout is now the worst, not a tie.
    assert [a[0] for a in credit.turn_advantages] == pytest.approx([-0.75, 0.0, 0.75])
    metrics = iteration_metrics([group], credit, 0, [], credit.keep)
    assert metrics["rollout/train_reward_mean"] == pytest.approx(0.5)
    assert metrics["rollout/reward_mean"] == pytest.approx(2.0 / 3)  # the tests' own reward
    assert load_config(None, ["train.reward=acted"]).train.reward == "acted"


def test_acted_reads_the_state_not_the_calls() -> None:
    """Calls marked as writes that changed nothing are not acting; unmarked tests make `acted`
    equal `fraction`: loop/ knows no names."""
    writes = rollout("ok", [("login", True), ("update_contact", True)])
    for call in writes.api_calls:
        call["read_only"] = False
    assert rollout_reward(writes, "acted") == 0.0  # no change: the collateral test is held back
    idle = rollout("max_turns", [("login", True)])
    for test in idle.tests:
        test["collateral"] = False
    assert rollout_reward(idle, "acted") == 0.5  # no test is collateral: nothing to hold back


def test_acted_on_a_suite_that_marks_nothing_is_refused_in_one_line() -> None:
    config = load_config(None, ["train.reward=acted", "suite=appworld"])
    with pytest.raises(ConfigError, match="suite appworld marks none") as raised:
        check_run(config, 1)
    assert "\n" not in str(raised.value)
    check_run(load_config(None, ["train.reward=acted"]), 1)  # apptown marks both
    check_run(load_config(None, ["suite=appworld"]), 1)  # fraction needs no marks


class NoKernel:
    """Only the bridge handler: the test calls the environment's handler directly."""

    handler_errors: tuple[str, ...] = ()

    def set_handler(self, handler: object) -> None:
        self.handler = handler


def test_the_built_in_world_marks_its_collateral_test_and_its_reads() -> None:
    suite = AppTownSuite(seed=0)
    env = suite.make_env(suite.tasks("train")[0], NoKernel())  # type: ignore[arg-type]
    env.reset()
    env.handle("api_docs", "show_app_descriptions", {})
    with pytest.raises(Exception, match="not logged in"):
        env.handle("phone", "update_contact", {"contact_id": 1})
    assert [(c.api, c.ok, c.read_only) for c in env.api_calls] == [
        ("show_app_descriptions", True, True),
        ("update_contact", False, False),
    ]
    report = asyncio.run(env.aevaluate())
    assert [t.collateral for t in report.tests] == [False] * (len(report.tests) - 1) + [True]
    assert report.tests[-1].name == "no_collateral_changes"
    assert report.state_changed is False
    assert env.server.read_only("files", "list_directory")
    assert not env.server.read_only("nope", "x")


def test_gold_demonstrations_on_a_suite_without_gold_solutions_are_refused_in_one_line() -> None:
    config = load_config(None, ["warm_start.source=gold", "suite=appworld"])
    with pytest.raises(ConfigError, match="suite appworld has none"):
        check_run(config, 1)
    check_run(load_config(None, ["warm_start.source=gold"]), 1)  # the built-in world has them
