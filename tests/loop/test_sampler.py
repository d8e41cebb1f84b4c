"""The task sampler's no-signal pools: which groups count as carrying no signal, how often such
tasks are drawn, the skip counts, and exact resumption.

Run: python -m pytest tests/loop/test_sampler.py -q
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from loop.rollout.task_sampler import TaskSampler, group_signal


@dataclass(frozen=True)
class T:
    id: str


TASKS = [T(f"t{i}") for i in range(10)]


def test_group_signal_by_kind() -> None:
    assert group_signal([1.0, 0.5, 1.0], [True, False, True]) == "signal"
    assert group_signal([1.0, 1.0], [True, True]) == "solved"
    assert group_signal([0.5, 0.5, 0.5], [False, False, False]) == "stuck"  # do-nothing ties
    assert group_signal([0.0, 0.0], [False, False]) == "stuck"
    assert group_signal([], []) == "signal"  # nothing known: drawn as usual


def test_at_probability_one_draws_are_the_papers() -> None:
    plain = TaskSampler(TASKS, seed=5)
    pooled = TaskSampler(TASKS, seed=5, no_signal_draw_prob=1.0)
    for task in TASKS[:5]:
        pooled.record(task.id, "solved")
    assert [t.id for t in plain.draw(25)] == [t.id for t in pooled.draw(25)]
    assert pooled.take_skip_counts() == {"sampler/skipped_solved": 0, "sampler/skipped_stuck": 0}


def test_no_signal_tasks_are_drawn_less_often_and_counted() -> None:
    sampler = TaskSampler(TASKS, seed=1, no_signal_draw_prob=0.2)
    for task in TASKS[:4]:
        sampler.record(task.id, "solved")
    for task in TASKS[4:6]:
        sampler.record(task.id, "stuck")
    drawn = [t.id for t in sampler.draw(400)]
    low = sum(drawn.count(t.id) for t in TASKS[:6]) / 6
    high = sum(drawn.count(t.id) for t in TASKS[6:]) / 4
    assert low < 0.35 * high, (low, high)  # about 0.2 as often
    counts = sampler.take_skip_counts()
    assert counts["sampler/skipped_solved"] > 0 and counts["sampler/skipped_stuck"] > 0
    assert sampler.take_skip_counts() == dict.fromkeys(counts, 0)  # reset after reading
    sampler.record("t0", "signal")  # a task that shows spread again is drawn as usual
    assert sampler.last_signal["t0"] == "signal"


def test_resuming_continues_the_same_draws() -> None:
    sampler = TaskSampler(TASKS, seed=2, no_signal_draw_prob=0.3)
    for task in TASKS[::2]:
        sampler.record(task.id, "stuck")
    sampler.draw(13)
    state = sampler.state_dict()
    expected = [t.id for t in sampler.draw(30)]
    clone = TaskSampler(TASKS, seed=2, no_signal_draw_prob=0.3)
    clone.load_state_dict(state)
    assert [t.id for t in clone.draw(30)] == expected


def test_bad_probability_is_refused() -> None:
    with pytest.raises(ValueError, match="no_signal_draw_prob"):
        TaskSampler(TASKS, seed=0, no_signal_draw_prob=0.0)


@dataclass(frozen=True)
class V:
    id: str
    scenario_id: str


def test_stratified_draws_spread_each_iteration_over_the_scenarios() -> None:
    # 3 scenarios with 6, 4 and 2 variants: 12 tasks
    tasks = [V(f"{s}_{n}", s) for s, count in (("a", 6), ("b", 4), ("c", 2)) for n in range(count)]
    uniform = TaskSampler(tasks, seed=4)
    sampler = TaskSampler(tasks, seed=4, stratify="scenario")
    first_pass = [t.id for t in sampler.draw(12)]
    assert sorted(first_pass) == sorted(t.id for t in tasks)  # still each task once a pass
    assert sorted(first_pass) == sorted(t.id for t in uniform.draw(12))
    for start in (0, 3):  # while all three scenarios have tasks left, 3 draws cover all three
        assert {i.split("_")[0] for i in first_pass[start : start + 3]} == {"a", "b", "c"}
    assert [t.id for t in TaskSampler(tasks, seed=4, stratify="scenario").draw(12)] == first_pass
