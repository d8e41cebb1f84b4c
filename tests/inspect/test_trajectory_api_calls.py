"""API calls are stored once, in the turns; old rollouts files that repeat them still read.

Run: python -m pytest tests/inspect/test_trajectory_api_calls.py -q
"""

from __future__ import annotations

import json

from loop.rollout.trajectory import Trajectory
from tests.inspect.builders import call, rollout, turn


def _two_turns() -> Trajectory:
    return rollout("t_1", [turn("", (call("a.x"),)), turn("", (call("a.y", ok=False),))])


def test_calls_derive_from_turns_and_are_written_once() -> None:
    traj = _two_turns()
    assert [c["api"] for c in traj.api_calls] == ["x", "y"]
    traj.api_calls = [call("a.x"), call("a.y", ok=False)]  # what loop/rollout/agent.py assigns
    data = traj.to_json()
    assert "api_calls" not in data and "own_api_calls" not in data
    assert sum(len(t["api_calls"]) for t in data["turns"]) == 2
    back = Trajectory.from_json(json.loads(json.dumps(data)))
    assert back.api_calls == traj.api_calls and back == traj


def test_old_files_with_the_repeated_key_read_the_same() -> None:
    old = _two_turns().to_json()
    old["api_calls"] = [call("a.x"), call("a.y", ok=False)]  # the duplicated form
    traj = Trajectory.from_json(old)
    assert traj.own_api_calls is None and len(traj.api_calls) == 2
    assert "api_calls" not in traj.to_json()


def test_calls_outside_any_turn_are_kept() -> None:
    traj = _two_turns()
    crashed = [call("a.x"), call("a.y", ok=False), call("a.z")]  # a.z ran in a crashed step
    traj.api_calls = crashed
    data = traj.to_json()
    assert data["api_calls"] == crashed
    assert Trajectory.from_json(data).api_calls == crashed


def test_a_rollout_cut_by_its_timeout_still_has_its_turns_calls() -> None:
    # The episode is cancelled before it assigns `traj.api_calls`; the turns have the calls.
    assert len(_two_turns().api_calls) == 2
    no_turns = rollout("t_1", [])
    no_turns.api_calls = [call("a.x")]  # as tests/loop/test_metrics.py sets them
    assert len(no_turns.api_calls) == 1
