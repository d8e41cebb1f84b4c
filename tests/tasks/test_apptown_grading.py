"""State diffs, the collateral-damage check, answer matching (in linear time), the TestReport,
and grading off the event loop under a time limit.

Run: python -m pytest tests/tasks/test_apptown_grading.py -q
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from tasks.apptown import AppTownSuite
from tasks.apptown.grading import Grader, StateDiff, answers_match, normalize, parse_number
from tasks.apptown.inprocess import run_in_process
from tasks.apptown.scenario import login_cell
from tasks.apptown.world import World
from tasks.core import TestReport, TestResult


@pytest.fixture(scope="module")
def world() -> World:
    return World.build(seed=0)


def test_diff_sees_added_updated_and_removed_rows(world: World) -> None:
    db = world.template.fork()
    db.execute("UPDATE todo_items SET title = 'changed' WHERE id = 1")
    db.execute("DELETE FROM files_files WHERE id = 2")
    db.execute("INSERT INTO music_likes (person_id, song_id, created_at) VALUES (1, 1, 'now')")
    db.execute("UPDATE todo_items SET priority = priority WHERE id = 3")  # no real change
    diff = StateDiff.compute(world.template, db)
    assert [(c.table, c.row_id) for c in diff.changes] == [
        ("files_files", 2),
        ("music_likes", diff.added("music_likes")[0]["id"]),
        ("todo_items", 1),
    ]
    assert diff.updated("todo_items")[0][1]["title"] == "changed"
    assert diff.removed("files_files")[0]["id"] == 2


def test_collateral_check_names_what_changed(world: World) -> None:
    db = world.template.fork()
    db.execute("UPDATE payments_accounts SET balance = 0 WHERE id = 7")
    grader = Grader("t_1", world.template, db, None, False)
    assert not grader.check_no_other_changes()
    message = grader.results[-1].message
    assert "payments_accounts#7 updated (balance:" in message and "-> 0" in message
    grader = Grader("t_1", world.template, db, None, False)
    assert grader.check_no_other_changes({"payments_accounts": {7: ("balance",)}})


@pytest.mark.parametrize(
    ("answer", "expected", "ok"),
    [
        (12.5, "12.50", True),
        ("$1,234.50", 1234.5, True),
        ("12", 12, True),
        (12.004, 12, True),
        (13, 12, False),
        (" Northern Windows. ", "northern windows", True),
        ("Northern", "North", False),
        (["b", "a"], ["a", "b"], True),
        ("a, b", ["b", "a"], True),
        (None, 0, False),
        (True, 1, False),
    ],
)
def test_answers_match(answer: object, expected: object, ok: bool) -> None:
    assert answers_match(answer, expected) is ok


def test_answers_match_ordered_lists() -> None:
    assert answers_match(["b", "a"], ["a", "b"], ordered=True) is False


def test_report_reward_and_success() -> None:
    report = TestReport("x_1", (TestResult("a", "A", True), TestResult("b", "B", False, "diff")))
    assert report.reward == 0.5 and not report.success
    assert "[FAIL] b: B" in report.summary() and "diff" in report.summary()
    assert report.to_dict()["tests"][1]["message"] == "diff"


def test_unanswered_question_fails_with_a_reason(suite: AppTownSuite) -> None:
    task = suite.task("payments_balance_1")
    db = suite.initial_state(task).fork()
    report = suite.grade(task, db, None, False)
    answer = report.tests[0]
    assert not answer.passed and answer.message == "complete_task was never called"
    assert report.reward == 0.5


def test_collateral_allowances_are_per_column(world: World) -> None:
    db = world.template.fork()
    db.execute("UPDATE payments_accounts SET balance = 0 WHERE id = 7")
    only_balance = {"payments_accounts": {7: ("balance",)}}
    assert Grader("t_1", world.template, db, None, False).check_no_other_changes(only_balance)
    db.execute("UPDATE payments_accounts SET person_id = -7 WHERE id = 7")
    grader = Grader("t_1", world.template, db, None, False)
    assert not grader.check_no_other_changes(only_balance)
    assert "payments_accounts#7 updated" in grader.results[-1].message
    named_as_added = {"payments_accounts": [7]}  # a list allows adding or removing, not updating
    assert not Grader("t_1", world.template, db, None, False).check_no_other_changes(named_as_added)


def test_gold_plus_renaming_the_contact_fails_the_collateral_check(suite: AppTownSuite) -> None:
    task = suite.task("phone_update_contact_email_1")
    cells = suite.gold_solution(task)
    tamper = (
        'apis.phone.update_contact(contact_id=contact["contact_id"], first_name="Zed", '
        "relationships=[])"
    )
    report = run_in_process(suite, task, [*cells[:-1], tamper, cells[-1]]).report
    assert [t.name for t in report.tests if not t.passed] == ["no_collateral_changes"], report


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("12", 12.0), ("$1,234.50", 1234.5), ("$ -3", -3.0), (".5", 0.5), ("1,.5", 1.5),
        ("-0.25", -0.25), ("1,,2", 12.0), ("\u0663", 3.0),  # an Arabic-Indic 3 (\d matches it)
        ("", None), ("$", None), ("-", None), (",", None), ("1,", None), ("1.", None),
        ("1.2.3", None), ("- 5", None), ("+5", None), ("1e5", None), ("-$5", None), ("5x", None),
    ],
)  # fmt: skip
def test_numbers_are_read_as_the_old_pattern_read_them(text: str, number: float | None) -> None:
    r"""What `\$?\s*(-?[\d,]*\.?\d+)` fully matched, and its value, without the pattern."""
    assert parse_number(text) == number


@pytest.mark.parametrize(
    "answer",
    ["1" * 2**20 + "x", "1," * 2**19 + "x", "$" + "1" * 2**20, "-" + "." * 2**20, "1\n" * 2**19],
    ids=["digits", "commas", "dollar", "dots", "lines"],
)
def test_a_megabyte_answer_is_graded_in_linear_time(answer: str) -> None:
    """The number pattern backtracked quadratically: 45,000 characters took 19 s, a megabyte
    would have taken hours. Every way the grader reads an answer now takes milliseconds."""
    start = time.perf_counter()
    normalize(answer)
    normalize([answer])
    answers_match([answer], [12.5])
    answers_match(answer, ["a", "b"])
    answers_match(answer, 12.5)
    assert time.perf_counter() - start < 0.5


def test_the_report_says_whether_the_state_changed(suite: AppTownSuite) -> None:
    task = suite.task("phone_update_contact_email_1")
    like = "apis.music.like_song(song_id=1)"
    unlike = "apis.music.unlike_song(song_id=1)"
    cells = [login_cell("music"), "apis.music.show_liked_songs()"]
    assert run_in_process(suite, task, cells).report.state_changed is False
    undone = run_in_process(suite, task, [*cells, like, unlike]).report
    assert undone.state_changed is False, undone
    assert run_in_process(suite, task, [*cells, like]).report.state_changed is True
    assert run_in_process(suite, task, suite.gold_solution(task)).report.state_changed is True


class NoKernel:
    """Only the bridge handler: nothing runs code."""

    handler_errors: tuple[str, ...] = ()

    def set_handler(self, handler: object) -> None:
        self.handler = handler


def test_a_grader_past_its_limit_fails_a_test_and_holds_up_no_one(suite: AppTownSuite) -> None:
    from tasks.apptown.env import AppTownEnv

    task = suite.task("payments_balance_1")

    def stuck(db: Any, answer: Any, completed: bool) -> TestReport:
        time.sleep(2.0)  # as a grader made slow by what the agent left would
        return suite.grade(task, db, answer, completed)

    env = AppTownEnv(
        task, NoKernel(), user=suite.user_of(task), initial_state=suite.initial_state(task),
        now=suite.world.now, grade=stuck, grade_timeout_s=0.3,
    )  # fmt: skip
    env.reset()

    async def grade_and_tick() -> tuple[TestReport, int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.ensure_future(tick())
        report = await env.aevaluate()
        ticker.cancel()
        return report, ticks

    start = time.monotonic()
    report, ticks = asyncio.run(grade_and_tick())
    assert time.monotonic() - start < 1.5  # the limit, not the grader, ended the wait
    assert ticks >= 10  # the event loop ran meanwhile
    assert [(t.name, t.passed) for t in report.tests] == [("graded_in_time", False)]
    assert report.reward == 0.0 and "longer than 0.3 s" in report.tests[0].message
