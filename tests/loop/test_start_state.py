"""The K rollouts of a task must start from one state: collection marks a rollout whose
environment reports another start as `start_state_mismatch`, an infrastructure failure.

Run: python -m pytest tests/loop/test_start_state.py
"""

from __future__ import annotations

import asyncio
from typing import Any

from loop.config import AgentConfig
from loop.generators.scripted import ScriptedGenerator
from loop.rollout.collect import RolloutJob, check_start_state, collect_rollouts
from loop.rollout.trajectory import Trajectory
from tasks.core import Task
from tests.loop.synthetic import NoSandboxPool, WordEnv, WordSuite, code_word_tokenizer


def test_a_rollout_from_another_start_is_an_infrastructure_failure() -> None:
    starts: dict[str, str] = {}
    first, same, other = (Trajectory("t_1", "t", 1, k, reward=0.5) for k in range(3))
    first.start_fingerprint = same.start_fingerprint = "a" * 64
    other.start_fingerprint = "b" * 64
    for traj in (first, same, other):
        check_start_state(traj, starts)
    assert (first.status, same.status, other.status) == ("ok", "ok", "start_state_mismatch")
    assert other.infra_failure and other.reward is None and other.success is None
    assert other.error is not None and "bbbbbbbbbbbb" in other.error
    unknown = Trajectory("t_1", "t", 1, 3)  # no fingerprint: not compared
    check_start_state(unknown, starts)
    assert unknown.status == "ok"


class DriftingSuite(WordSuite):
    """Its environments report the start state of their sample: the third one drifts."""

    def __init__(self) -> None:
        super().__init__()
        self.made = 0

    def make_env(self, task: Task, sandbox: Any) -> WordEnv:
        env = WordEnv(task)
        env.start_fingerprint = "drifted" if self.made == 2 else "same"
        self.made += 1
        return env


def test_collection_excludes_the_rollout_that_started_elsewhere() -> None:
    suite = DriftingSuite()
    task = suite.tasks("train")[0]
    tokenizer = code_word_tokenizer()
    jobs = [RolloutJob(task, k, seed=k) for k in range(3)]
    done = asyncio.run(
        collect_rollouts(
            jobs, suite=suite, pool=NoSandboxPool(), tokenizer=tokenizer,
            generator=ScriptedGenerator(tokenizer, ["w10 w20"]),
            settings=AgentConfig(max_turns=1, max_new_tokens=8, max_context_tokens=256),
            example=[], max_concurrent=1,
        )
    )  # fmt: skip
    assert [t.status for t in done] == ["ok", "ok", "start_state_mismatch"]
    assert [t.start_fingerprint for t in done] == ["same", "same", "drifted"]
    assert done[0].reward == 1.0 and done[2].reward is None
