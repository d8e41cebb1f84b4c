"""Behaviour metrics against numbers worked out by hand (loop_spec.md section 5).

Run: python -m pytest tests/inspect/test_metrics.py -q
"""

from __future__ import annotations

import math

import pytest

from loop.inspect.metrics import (
    METRICS,
    RolloutMetrics,
    aggregate,
    change_intervals,
    code_blocks,
    direction,
    give_up_counts,
    is_execution_error,
    ratio,
    rollout_metrics,
)
from tests.inspect.builders import FENCE, call, rollout, rollout_a, rollout_b, turn


def test_rollout_a_counts() -> None:
    m = rollout_metrics(rollout_a())
    assert (m.turns, m.api_calls, m.failed_api_calls) == (3, 4, 1)
    assert m.show_api_doc == 1  # one occurrence in the code of turn 1
    assert m.multi_cell_turns == 1  # turn 2 has a ```python and a ```py block
    assert m.execution_errors == 1
    assert (m.give_up_failed, m.give_up_recovered) == (1, 1)  # phone.login failed, then worked
    assert m.assume == 1
    assert m.dummy == 2  # "A dummy password" and 'dummy_pw' in the code
    # "apis.api_docs.show_api_doc(app_name='phone')" 44, "apis.phone.login(password='dummy_pw')"
    # 37, "x = 1" 5, "apis.phone.login(password=p)" 28
    assert m.code_chars == 44 + 37 + 5 + 28
    assert m.sequence == (
        "api_docs.show_api_doc", "phone.login", "phone.login", "phone.search_contacts"
    )  # fmt: skip
    assert m.success and m.reward == 1.0


def test_rollout_b_counts() -> None:
    m = rollout_metrics(rollout_b())
    assert (m.turns, m.api_calls, m.failed_api_calls) == (4, 4, 3)
    assert (m.show_api_doc, m.multi_cell_turns, m.dummy) == (0, 0, 0)
    assert m.execution_errors == 3  # two exceptions and a timeout
    # search_contacts fails (1), send_text_message fails (2), search_contacts fails again (not
    # new), complete_task succeeds (removes nothing): 2 failed, 0 recovered
    assert (m.give_up_failed, m.give_up_recovered) == (2, 0)
    assert m.assume == 3  # assume, assumed, Assuming
    assert m.code_chars == len("c = 1") + len("ok")
    assert not m.success and m.reward == 0.5


def test_aggregate_of_a_and_b() -> None:
    agg = aggregate([rollout_metrics(rollout_a()), rollout_metrics(rollout_b())])
    assert agg["rollouts"] == 2
    assert agg["success_rate"] == 0.5 and agg["reward_mean"] == 0.75
    assert agg["turns"] == 3.5 and agg["api_calls"] == 4 and agg["failed_api_calls"] == 2
    assert agg["show_api_doc"] == 0.5
    assert agg["multi_cell_turns"] == pytest.approx(1 / 7)  # pooled over 3 + 4 turns
    assert agg["execution_errors"] == pytest.approx(4 / 7)
    assert agg["give_up_rate"] == pytest.approx((3 - 1) / 3)  # failed 1 + 2, recovered 1 + 0
    assert agg["assume"] == 2 and agg["dummy"] == 1
    assert agg["code_chars"] == (114 + 7) / 2
    assert agg["distinct_sequences"] == 2  # one task, two different call sequences
    assert set(agg) == {spec.key for spec in METRICS}


def test_give_up_recovery_and_relapse() -> None:
    fail, ok = "ApiError: 401", None
    turns = [
        turn("", (call("a.x", ok=False),), error=fail),  # {a.x}: failed 1
        turn("", (call("a.x"),), error=ok),  # retried without error: recovered 1
        turn("", (call("a.x", ok=False), call("b.y")), error=fail),  # a.x and b.y: failed 3
        turn("", (call("b.y"),)),  # b.y recovered: 2; a.x never retried
    ]
    assert give_up_counts(turns) == (3, 2)


def test_give_up_counts_every_endpoint_of_a_failed_turn() -> None:
    # The paper's rule: a turn whose cell fails adds all the endpoints it called, even one that
    # succeeded before a later line raised. Endpoints never reached are not "attempted".
    turns = [turn("", (call("a.ok"),), error="NameError: name 'x' is not defined")]
    assert give_up_counts(turns) == (1, 0)
    assert give_up_counts([turn("", (), error="SyntaxError")]) == (0, 0)


def test_execution_error_from_structured_fields_or_the_observation() -> None:
    assert is_execution_error(turn("", error="KeyError: 'x'"))
    assert is_execution_error(turn("", timed_out=True))
    assert is_execution_error(turn("", observation="Execution failed.\nTraceback ..."))
    assert not is_execution_error(turn("", observation="No code was found."))
    assert not is_execution_error(turn("", observation=None))  # the last turn


def test_code_blocks_follow_the_agents_extraction() -> None:
    text = f"a\n{FENCE}python\nab\n{FENCE}\n{FENCE}py\n\n{FENCE}\n{FENCE}py\ncde"
    assert code_blocks(text) == ["ab", "cde"]  # blank block left out; unterminated one kept
    assert code_blocks(f"{FENCE}\nnot python\n{FENCE}") == []
    assert code_blocks("no code") == []


def test_words_assume_and_dummy() -> None:
    text = "ASSUMING x. assumed. An assumption is not counted. dummy_venmo_pass, Dummy."
    m = rollout_metrics(rollout("t_1", [turn(text)]))
    assert m.assume == 2 and m.dummy == 2


def test_show_api_doc_counts_occurrences_in_code_not_prose() -> None:
    text = (
        f"I'll call apis.api_docs.show_api_doc.\n{FENCE}python\n"
        "apis.api_docs.show_api_doc(app_name='a', api_name='b')\n"
        "apis.api_docs.show_api_doc(app_name='a', api_name='c')\n"
        f"apis.api_docs.show_api_descriptions(app_name='a')\n{FENCE}"
    )
    assert rollout_metrics(rollout("t_1", [turn(text)])).show_api_doc == 2


def test_unscored_rollout_and_empty_group() -> None:
    m = rollout_metrics(rollout("t_2", [], success=None, reward=None, status="timeout"))
    assert m.turns == 0 and not m.success and m.reward == 0.0
    agg = aggregate([m])
    assert agg["multi_cell_turns"] is None and agg["execution_errors"] is None
    assert agg["give_up_rate"] is None and agg["distinct_sequences"] == 1
    with pytest.raises(ValueError, match="no rollouts"):
        aggregate([])


def test_direction_against_the_paper() -> None:
    assert direction(2.0, 1.6) == "as paper" and direction(0.5, 1 / 3) == "as paper"
    assert direction(0.5, 1.6) == "against" and direction(float("inf"), 1 / 30) == "against"
    assert direction(None, 1.6) == direction(1.0, 1.6) == direction(2.0, None) == "-"
    factors = {spec.key: spec.paper for spec in METRICS if spec.paper is not None}
    assert factors == pytest.approx(  # loop_spec.md section 5
        {"show_api_doc": 1.6, "give_up_rate": 1 / 3, "multi_cell_turns": 1 / 6,
         "assume": 1 / 30, "dummy": 1 / 6}
    )  # fmt: skip


def test_ratio() -> None:
    assert ratio(2.0, 3.0) == 1.5
    assert ratio(0.0, 0.0) is None and ratio(None, 1.0) is None
    assert ratio(0.0, 1.0) is not None and math.isinf(ratio(0.0, 1.0) or 0.0)


def test_calls_outside_turns_count() -> None:
    traj = rollout("t_1", [turn("", (call("a.x"),))])
    traj.api_calls = [call("a.x"), call("a.y", ok=False)]  # the sandbox died mid-step
    m = rollout_metrics(traj)
    assert m.api_calls == 2 and m.failed_api_calls == 1 and m.sequence == ("a.x", "a.y")


def metrics(task: str, docs: int, failed: int = 0, recovered: int = 0) -> RolloutMetrics:
    """A rollout of `task` that read the documentation `docs` times."""
    return RolloutMetrics(
        task_id=task, turns=3, api_calls=4, failed_api_calls=failed, show_api_doc=docs,
        multi_cell_turns=0, execution_errors=0, give_up_failed=failed,
        give_up_recovered=recovered, assume=0, dummy=0, code_chars=100, success=False,
        reward=0.0, sequence=(),
    )  # fmt: skip


def test_change_intervals_pair_tasks_and_bound_the_ratio() -> None:
    tasks = [f"t{i}" for i in range(12)]
    before = [metrics(t, 1) for t in tasks]
    # every task reads twice as much after: every draw says 2x
    assert change_intervals(before, [metrics(t, 2) for t in tasks])["show_api_doc"] == (2.0, 2.0)
    # half the tasks read 3 times, half 1 time (as before): the interval holds 2x, excludes 1x
    # and the extremes no draw of 12 tasks reaches (all 3s or all 1s)
    mixed = [metrics(t, 3 if i % 2 else 1) for i, t in enumerate(tasks)]
    low, high = change_intervals(before, mixed, seed=1)["show_api_doc"] or (0, 0)
    assert 1.0 < low < 2.0 < high < 3.0
    # a task only one group ran is left out of the draws
    extra = [*mixed, metrics("only_after", 100)]
    assert change_intervals(before, extra, seed=1)["show_api_doc"] == (low, high)
    # nothing failed before or after: the give-up rate's change is undefined in every draw
    assert change_intervals(before, mixed)["give_up_rate"] is None
    with pytest.raises(ValueError, match="no task in both"):
        change_intervals(before, [metrics("other", 1)])
