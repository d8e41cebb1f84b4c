"""Collecting ahead (`train.overlap.max_staleness`): the staleness rules by hand, the collector's
schedule with a fake collection, and the config checks.

Run: python -m pytest tests/loop/test_staleness.py -q
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from loop.checks import check_run
from loop.config import ConfigError, load_config
from loop.rollout.ahead import AheadCollector
from loop.rollout.staleness import admits, assemble, group_version, staleness_metrics
from loop.rollout.trajectory import Trajectory, Turn
from tasks import Task


def group(task: str, version: int | None, names: tuple[str | None, ...] = ()) -> list[Trajectory]:
    """Two rollouts of `task` that sampled `version`; their turns name `names` (one each)."""
    rollouts = []
    for k in range(2):
        traj = Trajectory(task, task, 1, k, reward=float(k))
        traj.policy_version = version
        traj.turns = [Turn(0, 1, "stop", "t", None, adapter_version=n) for n in names]
        rollouts.append(traj)
    return rollouts


def test_a_group_older_than_s_versions_is_dropped_and_counted() -> None:
    groups = [group("a", 5), group("b", 4), group("c", 3), group("d", 5)]
    kept = assemble(groups, iteration=5, s=1)
    assert [g[0].task_id for g in kept.groups] == ["a", "b", "d"]
    assert kept.lags == [0, 1, 2, 0]
    assert kept.dropped == {"stale": 1, "mixed_versions": 0}
    metrics = staleness_metrics(kept, recollected=3)
    assert metrics["stale/groups_dropped"] == metrics["stale/groups_dropped_stale"] == 1
    assert metrics["stale/lag_mean"] == pytest.approx(3 / 4) and metrics["stale/lag_max"] == 2
    lag_counts = [metrics[f"stale/groups_lag_{lag}"] for lag in range(3)]
    assert lag_counts == [2, 1, 1] and metrics["stale/groups_recollected"] == 3
    assert assemble(groups, iteration=5, s=2).dropped["stale"] == 0  # a looser bound keeps it


def test_the_synchronous_loop_drops_nothing() -> None:
    groups = [group("a", 7), group("b", None)]  # unpinned: counts as current
    kept = assemble(groups, iteration=7, s=0)
    assert len(kept.groups) == 2 and kept.lags == [0, 0]
    assert staleness_metrics(kept)["stale/groups_dropped"] == 0
    with pytest.raises(ValueError, match="not yet published"):
        assemble([group("a", 8)], iteration=7, s=0)


def test_a_group_whose_turns_name_two_versions_is_dropped_loudly() -> None:
    same = group("a", 4, ("run-v4", "run-v4"))
    mixed = group("b", 4, ("run-v4", "run-v5"))
    split = [group("c", 4)[0], group("c", 5)[0]]  # its rollouts pinned differently
    assert group_version(same) == 4 and group_version(mixed) is None
    assert group_version(split) is None
    kept = assemble([same, mixed, split], iteration=5, s=1)
    assert kept.dropped == {"stale": 0, "mixed_versions": 2} and len(kept.groups) == 1


def test_admission_holds_accepted_plus_in_flight_to_s_plus_one_iterations() -> None:
    assert admits(accepted=40, in_flight=0, new=40, tasks_per_iteration=40, s=1)
    assert not admits(accepted=40, in_flight=1, new=40, tasks_per_iteration=40, s=1)
    assert not admits(accepted=40, in_flight=0, new=40, tasks_per_iteration=40, s=0)
    assert admits(accepted=40, in_flight=40, new=40, tasks_per_iteration=40, s=2)
    assert admits(accepted=0, in_flight=0, new=40, tasks_per_iteration=40, s=0)
    with pytest.raises(ValueError):
        admits(accepted=-1, in_flight=0, new=1, tasks_per_iteration=40, s=0)


def tasks(n: int, prefix: str) -> list[Task]:
    return [Task(f"{prefix}{i}_1", f"{prefix}{i}", 1, 1, "x", (), "train") for i in range(n)]


class FakeDraws:
    """Draws numbered batches of tasks and records when each collection starts and ends."""

    def __init__(self) -> None:
        self.draws = 0
        self.events: list[str] = []
        self.gates: dict[int, asyncio.Event] = {}

    def draw(self) -> list[Task]:
        self.draws += 1
        return tasks(2, f"d{self.draws}-")

    async def collect(self, iteration: int, drawn: list[Task]) -> tuple[list, int, dict]:
        self.events.append(f"start {iteration}")
        await self.gates.setdefault(iteration, asyncio.Event()).wait()
        self.events.append(f"end {iteration}")
        return [[Trajectory(t.id, t.id, 1, 0)] for t in drawn], 0, {}


async def test_s_1_collects_the_next_iteration_while_this_one_learns() -> None:
    fake = FakeDraws()
    ahead = AheadCollector(fake.collect, max_staleness=1, tasks_per_iteration=2,
                           iterations=3, published=0)  # fmt: skip
    fake.gates[0] = asyncio.Event()
    fake.gates[0].set()
    first = await ahead.take(0, fake.draw)
    assert fake.events == ["start 0", "end 0"] and len(first.groups) == 2
    assert ahead.dispatch_ahead(0, fake.draw) == 2  # iteration 1's two groups
    assert ahead.dispatch_ahead(0, fake.draw) == 0  # already running: nothing more
    learned = await ahead.off_loop(lambda: fake.events.append("learn 0") or "done")
    await asyncio.sleep(0)
    assert learned == "done" and fake.events[2:] == ["learn 0", "start 1"]
    assert ahead.pending_tasks() == {1: ["d2-0_1", "d2-1_1"]}  # what a checkpoint records
    fake.gates[1].set()
    second = await ahead.take(1, fake.draw)
    assert [g[0].task_id for g in second.groups] == ["d2-0_1", "d2-1_1"]
    assert ahead.dispatch_ahead(2, fake.draw) == 0  # no iteration past the run's last
    assert fake.draws == 2


async def test_s_0_draws_and_collects_in_step() -> None:
    fake = FakeDraws()
    ahead = AheadCollector(fake.collect, max_staleness=0, tasks_per_iteration=2,
                           iterations=3, published=0)  # fmt: skip
    for gate in range(3):
        fake.gates[gate] = asyncio.Event()
        fake.gates[gate].set()
    await ahead.take(0, fake.draw)
    assert ahead.dispatch_ahead(0, fake.draw) == 0 and ahead.pending_tasks() == {}
    assert (await ahead.off_loop(lambda: 7)) == 7
    await ahead.take(1, fake.draw)
    assert fake.events == ["start 0", "end 0", "start 1", "end 1"] and fake.draws == 2


async def test_s_2_runs_two_iterations_ahead_within_the_admission_bound() -> None:
    fake = FakeDraws()
    ahead = AheadCollector(fake.collect, max_staleness=2, tasks_per_iteration=2,
                           iterations=10, published=0)  # fmt: skip
    assert ahead.dispatch_ahead(0, fake.draw) == 4  # iterations 1 and 2
    await asyncio.sleep(0)
    assert fake.events == ["start 1", "start 2"]
    assert sorted(ahead.pending_tasks()) == [1, 2]
    await ahead.cancel()
    assert ahead.pending_tasks() == {}


async def test_a_resumed_run_recollects_the_saved_iterations_and_counts_them() -> None:
    fake = FakeDraws()
    saved = {4: tasks(2, "saved-")}
    ahead = AheadCollector(fake.collect, max_staleness=1, tasks_per_iteration=2,
                           iterations=10, published=4, saved=saved)  # fmt: skip
    assert ahead.recollected == 2 and ahead.pending_tasks() == {4: ["saved-0_1", "saved-1_1"]}
    fake.gates[4] = asyncio.Event()
    fake.gates[4].set()
    resumed = await ahead.take(4, fake.draw)
    assert [g[0].task_id for g in resumed.groups] == ["saved-0_1", "saved-1_1"]
    assert fake.draws == 0  # the saved tasks, not new draws


def test_collecting_ahead_needs_the_server_backend() -> None:
    with pytest.raises(ConfigError, match=r"use generator\.backend: vllm_server") as caught:
        check_run(load_config(None, ["train.overlap.max_staleness=1", "generator.backend=hf"]), 1)
    assert "\n" not in str(caught.value)
    check_run(
        load_config(None, ["train.overlap.max_staleness=1", "generator.backend=vllm_server"]), 1
    )
    check_run(load_config(None, ["generator.backend=hf"]), 1)  # S = 0: any backend
    with pytest.raises(ConfigError, match=r"train\.overlap\.max_staleness: must be >= 0"):
        load_config(None, ["train.overlap.max_staleness=-1"])


def test_the_servers_get_lora_slots_for_every_version_a_group_may_sample() -> None:
    from loop.build import vllm_server_args

    for staleness, slots in ((0, "2"), (1, "2"), (3, "4")):
        config = load_config(None, ["generator.backend=vllm_server",
                                    f"train.overlap.max_staleness={staleness}"])  # fmt: skip
        args = vllm_server_args(config, "base", enable_lora=True)
        assert args[args.index("--max-loras") + 1] == slots


def test_the_mismatch_is_split_with_each_stale_version_s_own_adapter(tmp_path: Path) -> None:
    """Step 4's mismatch split: a stale rollout's pi_v comes from its version's published
    adapter, a current one's from the recompute (fake learner: log-probs by hand)."""
    from loop.learner.batch import Sample
    from loop.learner.stats import mismatch_stats
    from loop.run.rundir import RunDir

    groups = [group("a", 1), group("b", 2)]  # iteration 2: "a" sampled version 1, "b" is current
    mask = torch.tensor([False, True, True])
    samples = []
    for source in range(4):
        sample = Sample(torch.arange(3), mask, torch.log(torch.tensor([1.0, 0.5, 0.5])),
                        torch.tensor([-1, 0, 0]), torch.zeros(3), source=source)  # fmt: skip
        sample.old_logprobs = torch.log(torch.tensor([1.0, 0.25, 0.5]))  # pi_prox
        samples.append(sample)
    asked: list[tuple[Path, list[int]]] = []

    class Learner:
        def logprobs_with_adapter(self, adapter: Path, chunk: list[Sample]) -> list[torch.Tensor]:
            asked.append((adapter, [s.source for s in chunk]))
            return [torch.log(torch.tensor([1.0, 0.5, 0.25])) for _ in chunk]  # pi_v

    run = RunDir(tmp_path)
    run.adapter_sync(1).mkdir(parents=True)
    flat = [traj for g in groups for traj in g]
    versions = [flat[s.source].policy_version for s in samples]
    assert versions == [1, 1, 2, 2]

    def mismatch_parts() -> dict[str, float]:
        found = Learner().logprobs_with_adapter
        return mismatch_stats(samples, versions, 2, run.adapter_sync, found)

    metrics = mismatch_parts()
    assert asked == [(run.adapter_sync(1), [0, 1])]  # once per stale version, its rollouts only

    def k3(rho: float) -> float:
        return rho - 1 - math.log(rho)

    # stale: engine pi_v/mu = (1, 0.5), staleness pi_prox/pi_v = (0.5, 2); current:
    # engine pi_prox/mu = (0.5, 1), staleness 1
    assert metrics["mismatch/tokens"] == 8
    assert metrics["mismatch/engine_k3"] == pytest.approx((k3(0.5) + k3(0.5)) * 2 / 8)
    assert metrics["mismatch/staleness_k3"] == pytest.approx((k3(0.5) + k3(2.0)) * 2 / 8)
    # a version whose adapter is gone: its rollouts are left out, the run goes on
    run.adapter_sync(1).rmdir()
    metrics = mismatch_parts()
    assert metrics["mismatch/tokens"] == 4 and metrics["mismatch/staleness_k3"] == 0
    assert metrics["mismatch/engine_k3"] == pytest.approx(k3(0.5) / 2)


def test_the_split_needs_a_published_lora_and_one_learner() -> None:
    servers = ["generator.backend=vllm_server", "train.off_policy.split_mismatch=true"]
    check_run(load_config(None, servers), 1)
    for overrides, world in (([*servers, "model.lora_rank=0"], 1), (servers, 2)):
        with pytest.raises(
            ConfigError, match=r"train\.off_policy\.split_mismatch loads the LoRA adapter"
        ):
            check_run(load_config(None, overrides), world)
    with pytest.raises(ConfigError, match=r"needs generator\.backend vllm_server"):
        check_run(load_config(None, ["train.off_policy.split_mismatch=true"]), 1)
