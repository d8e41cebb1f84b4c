"""Evaluation metrics against numbers worked out by hand.

Run: python -m pytest tests/loop/test_metrics.py
"""

from __future__ import annotations

import math

import pytest

from loop.algo.credit import assign_credit
from loop.rollout.trajectory import Trajectory
from loop.run.metrics import (
    compute_metrics,
    infra_failure_problem,
    iteration_metrics,
    pass_at_k,
    scenario_goal_completion,
)
from loop.run.runlog import summary_line


def traj(
    task: str,
    sample: int,
    success: bool,
    *,
    difficulty: int = 1,
    reward: float | None = None,
    status: str = "ok",
    calls: int = 0,
    failed: int = 0,
) -> Trajectory:
    t = Trajectory(task, task.rsplit("_", 1)[0], difficulty, sample)
    t.success = success
    t.reward = (1.0 if success else 0.5) if reward is None else reward
    t.status = status  # type: ignore[assignment]
    t.api_calls = [{"ok": i >= failed} for i in range(calls)]
    return t


def test_pass_at_k_matches_hand_computation() -> None:
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c < k
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_tgc_sgc_and_pass_at_k_over_two_scenarios() -> None:
    rollouts = [
        # scenario a: variants a_1, a_2; sample 0 solves both, sample 1 solves only a_1
        traj("a_1", 0, True),
        traj("a_1", 1, True),
        traj("a_2", 0, True),
        traj("a_2", 1, False),
        # scenario b: one variant, never solved
        traj("b_1", 0, False),
        traj("b_1", 1, False),
    ]
    m = compute_metrics(rollouts)
    assert m["eval/tgc"] == pytest.approx((1 + 0.5 + 0) / 3)
    # sample 0: a solved, b not -> 1/2; sample 1: neither -> 0; mean 1/4
    assert m["eval/sgc"] == pytest.approx(0.25)
    assert scenario_goal_completion(rollouts) == pytest.approx(0.25)
    assert m["eval/pass@1"] == pytest.approx((1 + 0.5 + 0) / 3)
    assert m["eval/pass@2"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["eval/reward_mean"] == pytest.approx((1 + 1 + 1 + 0.5 + 0.5 + 0.5) / 6)


def test_infra_failures_count_as_failures_and_are_reported() -> None:
    rollouts = [traj("a_1", 0, False, reward=None, status="generator_error"), traj("a_2", 0, True)]
    rollouts[0].reward = None
    m = compute_metrics(rollouts)
    assert m["eval/infra_failures"] == 1 and m["eval/status/generator_error"] == 1
    assert m["eval/tgc"] == 0.5 and m["eval/reward_mean"] == 0.5


def test_behaviour_and_difficulty_breakdown() -> None:
    rollouts = [
        traj("a_1", 0, True, difficulty=1, calls=4, failed=1),
        traj("b_1", 0, False, difficulty=3, calls=2, failed=2),
    ]
    m = compute_metrics(rollouts)
    assert m["eval/api_calls_mean"] == 3 and m["eval/failed_api_calls_mean"] == 1.5
    assert m["eval/difficulty_1/success_rate"] == 1.0
    assert m["eval/difficulty_3/success_rate"] == 0.0
    assert not any(math.isnan(v) for v in m.values())


def test_no_rollouts_is_an_error() -> None:
    with pytest.raises(ValueError, match="no rollouts"):
        compute_metrics([])


def test_training_reward_and_success_count_excluded_rollouts_as_zero() -> None:
    group = [
        traj("t_1", 0, True, reward=1.0),
        traj("t_1", 1, False, reward=0.0),
        traj("t_1", 2, False, reward=0.5),
        traj("t_1", 3, False, reward=None, status="env_error"),
    ]
    group[3].reward = None
    credit = assign_credit([group], method="loo", reward="fraction", threshold=0.01)
    kept = [True, True, False, False]  # after any top-up: what is trained on
    m = iteration_metrics([group], credit, 0, [], kept)
    assert m["rollout/reward_mean"] == pytest.approx(1.5 / 4)  # the excluded one counts as 0
    assert m["rollout/reward_mean_scored"] == pytest.approx(1.5 / 3)
    assert m["rollout/success_rate"] == pytest.approx(1 / 4)
    assert m["rollout/success_rate_scored"] == pytest.approx(1 / 3)
    assert m["rollout/infra_failure_share"] == pytest.approx(1 / 4)
    assert m["rollout/kept"] == 2 and m["rollout/filtered_fraction"] == pytest.approx(1 / 3)


def test_groups_that_teach_nothing_are_counted_and_named_in_the_iteration_line() -> None:
    stuck = [traj("a_1", k, False, reward=0.5) for k in range(3)]
    solved = [traj("b_1", k, True) for k in range(3)]
    mixed = [traj("c_1", 0, True), traj("c_1", 1, False, reward=0.5), traj("c_1", 2, True)]
    # an excluded rollout leaves its group's scored ones: still one reward, still stuck
    excluded = [traj("d_1", 0, False, reward=0.0), traj("d_1", 1, False, reward=None)]
    excluded[1].status = "env_error"  # type: ignore[assignment]
    groups = [stuck, solved, mixed, excluded]
    credit = assign_credit(groups, method="loo", reward="fraction", threshold=0.01)
    m = iteration_metrics(groups, credit, 0, [], credit.keep)
    assert (m["rollout/groups_stuck"], m["rollout/groups_solved"]) == (2, 1)
    assert m["rollout/kept"] == 3  # the mixed group's, only
    line = summary_line(0, 4, m)
    assert "kept 3/11 (filtered 0.70; of 4 groups 2 stuck, 1 solved) |" in line
    only = [traj("e_1", k, False, reward=0.5) for k in range(2)]
    credit = assign_credit([only], method="loo", reward="fraction", threshold=0.01)
    m = iteration_metrics([only], credit, 0, [], credit.keep)
    assert "kept 0/2 (filtered 1.00; of 1 groups 1 stuck) |" in summary_line(0, 4, m)
    m["rollout/groups_stuck"] = 0
    assert "(filtered 1.00) |" in summary_line(0, 4, m)  # nothing said when all taught


def test_a_search_iteration_line_reports_the_searches_not_the_pairs_as_rollouts() -> None:
    m = {
        "search/return_mean": 0.6,
        "search/rollouts": 24.0,
        "search/new_pairs": 7.0,
        "search/buffer_pairs": 7.0,
        "rollout/reward_mean": 0.5,
        "rollout/success_rate": 0.0,
    }
    line = summary_line(0, 4, m)
    assert line.startswith("iter 1/4 | search return 0.600 (24 rollouts, 7 new pairs, 7 kept) |")
    assert "success" not in line  # the pairs' one-turn rows have no success of their own


def test_too_many_infrastructure_failures_stop_the_run_naming_the_statuses() -> None:
    metrics = {
        "rollout/infra_failure_share": 0.75,
        "rollout/status/ok": 1.0,
        "rollout/status/env_error": 2.0,
        "rollout/status/generator_error": 1.0,
    }
    assert infra_failure_problem(metrics, 0.8) is None
    assert infra_failure_problem(metrics, None) is None
    assert infra_failure_problem(metrics, 0.5) == (
        "75% of the iteration's rollouts failed for infrastructure reasons (env_error 2, "
        "generator_error 1), more than train.max_infra_failure_share=0.5: fix the cause before "
        "training on"
    )
    lost = Trajectory("t", "s", 1, 0, status="generator_error")
    lost.error = "no vLLM server serves base; servers 0 http://127.0.0.1:1/v1: down for good"
    named = infra_failure_problem(metrics, 0.5, [[Trajectory("t", "s", 1, 1), lost]])
    assert named is not None and named.endswith(f"; the first: {lost.error}")
