"""Whose a failure is: the attribution rule's pure parts, by hand-computed cases.

Run: python -m pytest tests/loop/test_attribution.py
"""

from __future__ import annotations

from loop.rollout.collect import timeout_status
from loop.rollout.trajectory import INFRA_STATUSES, Trajectory


def test_a_rollout_whose_cells_used_the_time_is_the_agents_and_scored() -> None:
    status, error = timeout_status(cell_time_s=1800.0, limit_s=3600.0)
    assert status == "timeout" and status not in INFRA_STATUSES
    assert error == "rollout exceeded 3600 s, 1800 s of it in the agent's cells"


def test_a_rollout_that_ran_out_while_generating_is_ours_and_excluded() -> None:
    status, _ = timeout_status(cell_time_s=1799.0, limit_s=3600.0)
    assert status == "generation_timeout" and status in INFRA_STATUSES


def test_only_failures_of_our_machinery_are_excluded() -> None:
    assert {
        "generation_timeout", "sandbox_crash", "env_crash", "generator_error", "env_error",
    } == INFRA_STATUSES  # fmt: skip
    assert not Trajectory("t_1", "t", 1, 0, status="timeout").infra_failure
