"""Before/after statistics against hand-computed values.

Run: python -m pytest tests/loop/test_stats.py
"""

from __future__ import annotations

import math

import pytest

from loop.run.significance import (
    compare,
    fisher_one_sided,
    task_bootstrap_one_sided,
    wilson_interval,
)


def test_fisher_small_table_by_hand() -> None:
    # Margins: 4 after, 4 before, 4 successes in 8. P(X >= 3) = (C(4,3)C(4,1) + C(4,4)C(4,0))
    # / C(8,4) = (16 + 1) / 70.
    assert fisher_one_sided(3, 4, 1, 4) == pytest.approx(17 / 70, abs=1e-15)


def test_fisher_matches_the_reference_implementation() -> None:
    # scipy.stats.fisher_exact([[20, 16], [10, 26]], alternative="greater").pvalue
    assert fisher_one_sided(20, 36, 10, 36) == pytest.approx(0.015328524966854782, rel=1e-12)


def test_fisher_edges() -> None:
    assert fisher_one_sided(0, 5, 0, 5) == 1.0  # no success anywhere: no evidence
    assert fisher_one_sided(0, 0, 0, 0) == 1.0
    assert fisher_one_sided(5, 5, 0, 5) == pytest.approx(1 / math.comb(10, 5))
    assert fisher_one_sided(0, 5, 5, 5) == 1.0  # worse after: p = 1
    with pytest.raises(ValueError, match="successes <= n"):
        fisher_one_sided(6, 5, 0, 5)


def test_wilson_interval_by_hand() -> None:
    # 5/10, z = 1.96: centre 0.5, half-width 1.96 sqrt(0.025 + z^2/400) / (1 + z^2/10).
    low, high = wilson_interval(5, 10)
    z = 1.959963984540054
    half = z * math.sqrt(0.025 + z * z / 400) / (1 + z * z / 10)
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-12)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_task_bootstrap_sees_a_consistent_gain_and_no_gain() -> None:
    before = {f"t{i}": [False, False] for i in range(20)}
    better = {f"t{i}": [True, i % 2 == 0] for i in range(20)}
    assert task_bootstrap_one_sided(before, better, samples=2000) < 0.001
    assert task_bootstrap_one_sided(before, before, samples=2000) == 1.0  # never > 0
    with pytest.raises(ValueError, match="share no task"):
        task_bootstrap_one_sided({"a": [True]}, {"b": [True]})


def test_compare_counts_rollouts_and_says_it_in_one_line() -> None:
    before = {"a": [True, False], "b": [False, False]}
    after = {"a": [True, True], "b": [True, False]}
    result = compare(before, after)
    assert (result.before_successes, result.before_n) == (1, 4)
    assert (result.after_successes, result.after_n) == (3, 4)
    assert result.p_fisher == pytest.approx(fisher_one_sided(3, 4, 1, 4))
    assert result.p_bootstrap is not None
    line = result.line("heldout")
    assert line.startswith("heldout: 0.250") and "-> 0.750" in line and "(+0.500" in line
