"""Whose a failure is: the attribution rule's pure parts, by hand-computed cases.

Run: python -m pytest tests/loop/test_attribution.py
"""

from __future__ import annotations

import math

import pytest

from loop.rollout.attribution import timeout_status, token_time_bound, token_time_charged
from loop.rollout.trajectory import INFRA_STATUSES, Trajectory, Turn


def test_a_rollout_whose_cells_used_the_time_is_the_agents_and_scored() -> None:
    status, error = timeout_status(cell_time_s=1800.0, limit_s=3600.0)
    assert status == "timeout" and status not in INFRA_STATUSES
    assert error == "rollout exceeded 3600 s, 1800 s of it in the agent's cells"


def test_a_rollout_that_ran_out_while_generating_is_ours_and_excluded() -> None:
    status, _ = timeout_status(cell_time_s=1799.0, limit_s=3600.0)
    assert status == "generation_timeout" and status in INFRA_STATUSES


def test_the_tokens_the_agent_emitted_count_with_its_cells() -> None:
    status, error = timeout_status(cell_time_s=1000.0, limit_s=3600.0, token_time_s=800.0)
    assert status == "timeout"
    assert error == (
        "rollout exceeded 3600 s, 1000 s of it in the agent's cells and 800 s generating the "
        "tokens it emitted"
    )
    assert timeout_status(1000.0, 3600.0, 799.0)[0] == "generation_timeout"


def test_the_time_per_token_is_the_slope_plus_z_standard_errors() -> None:
    # On a line: slope 0.1 s/token, no residuals, no margin.
    assert token_time_bound([(10, 1.0), (20, 2.0), (30, 3.0)], z=2) == pytest.approx(0.1)
    # Flat (slow whatever the length): nothing per token.
    assert token_time_bound([(10, 2.0), (20, 2.0), (30, 2.0)], z=2) == 0.0
    # (0, 0), (1, 1), (2, 1): slope 1/2, intercept 1/6, residuals -1/6, 1/3, -1/6, so
    # RSS 1/6, SE = sqrt(RSS / (n - 2) / Sxx) = sqrt(1/6 / 1 / 2) = sqrt(1/12).
    bound = token_time_bound([(0, 0.0), (1, 1.0), (2, 1.0)], z=2)
    assert bound == pytest.approx(0.5 + 2 * math.sqrt(1 / 12))
    assert token_time_bound([(0, 0.0), (1, 1.0), (2, 1.0)], z=0) == pytest.approx(0.5)


def test_an_unknown_time_per_token_charges_all_of_the_generation() -> None:
    assert token_time_bound([(10, 1.0), (20, 2.0)], z=2) == math.inf  # fewer than 3 calls
    assert token_time_bound([(150, 1.5)] * 5, z=2) == math.inf  # one length only


def test_each_turn_is_charged_its_tokens_at_most_its_generation_time() -> None:
    turns = [Turn(0, 10, "stop", "", None, generation_s=1.0)]
    turns.append(Turn(20, 120, "length", "", None, generation_s=5.0))
    assert token_time_charged(turns, 0.02) == pytest.approx(0.2 + 2.0)
    assert token_time_charged(turns, math.inf) == pytest.approx(6.0)


def test_only_failures_of_our_machinery_are_excluded() -> None:
    assert {
        "generation_timeout", "sandbox_crash", "env_crash", "generator_error", "env_error",
        "start_state_mismatch", "invalid_generation",  # a server's answer that fails its checks
    } == INFRA_STATUSES  # fmt: skip
    assert not Trajectory("t_1", "t", 1, 0, status="timeout").infra_failure
