"""`TestReport` carries our tests' reward or a reward an external grader computed; both read
alike (`reward`, `success`, `to_dict`).

Run: python -m pytest tests/tasks/test_report_contract.py
"""

from __future__ import annotations

import pytest

from tasks.core import TestReport, TestResult


def test_an_external_reward_is_the_reward_whatever_the_tests_say() -> None:
    detail = (TestResult("format", "answers in JSON", False, "plain text"),)
    report = TestReport.external("t_1", 0.75, True, detail)
    assert (report.reward, report.success, report.is_external) == (0.75, True, True)
    assert report.to_dict()["reward"] == 0.75 and report.to_dict()["external"] is True
    assert "reward 0.75 (external)" in report.summary()
    bare = TestReport.external("t_1", 0.0, False)  # no per-test detail at all
    assert (bare.reward, bare.success, bare.tests) == (0.0, False, ())


def test_our_tests_give_the_reward_when_none_is_given() -> None:
    tests = (TestResult("a", "a", True), TestResult("b", "b", False, "no"))
    report = TestReport("t_1", tests)
    assert (report.reward, report.success, report.is_external) == (0.5, False, False)


def test_a_half_given_or_non_finite_external_reward_is_refused() -> None:
    with pytest.raises(ValueError, match="come together"):
        TestReport("t_1", (), external_reward=1.0)
    with pytest.raises(ValueError, match="external reward nan"):
        TestReport.external("t_1", float("nan"), False)
