"""The trainer collecting ahead (`train.overlap.max_staleness` 1) on the synthetic run, on CPU.

The servers are stood in for by `PublishedCopies`: every published version is its own copy of
the synthetic policy, sampled by an hf generator, and a request samples the version it names,
as the vllm_server backend does. Iteration k+1's groups are then collected while iteration k
learns (in a worker thread), each pinned to the version published when it started. The real
server: tests/loop/test_vllm_server.py and the end-to-end run in test_overlap_server.py
(`slow`).

Run: python -m pytest tests/loop/test_overlap.py -q     (about 30 s on 2 cores)
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import shutil
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from loop.config import load_config
from loop.generators.base import Generation, GeneratorStats, SamplingParams
from loop.generators.hf.generator import HFGenerator
from loop.model import checkpoint
from loop.model.policy import Policy
from loop.parts import TrainParts
from loop.trainer import train
from tests.loop.synthetic import SYNTHETIC, NoSandboxPool, WordSuite, synthetic_policy


class PublishedCopies:
    """Each published version its own copy of the policy; a request samples the one it names."""

    name = "copies"
    shares_weights = False

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.current = "v0"
        self.versions = {"v0": self._sampler(copy.deepcopy(policy.model))}
        self.requests: list[tuple[str | None, str]] = []  # (named, sampled)

    @property
    def version(self) -> str:
        return self.current

    def _sampler(self, model: Any) -> HFGenerator:
        copy_policy = Policy(
            model=model, tokenizer=self.policy.tokenizer, device=torch.device("cpu")
        )
        return HFGenerator(copy_policy, max_batch_size=1)

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:  # fmt: skip
        name = params.version or self.current
        self.requests.append((params.version, name))
        unpinned = dataclasses.replace(params, version=None)
        generation = await self.versions[name].generate(prompt_token_ids, unpinned)
        return dataclasses.replace(generation, adapter_version=name)

    def load_adapter(self, path: Path | None) -> None:
        assert path is not None
        model = copy.deepcopy(self.policy.model)
        model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
        self.current = f"v{len(self.versions)}"
        self.versions[self.current] = self._sampler(model)

    def release_memory(self) -> None:
        return None

    def stats(self) -> GeneratorStats:
        return GeneratorStats()

    async def close(self) -> None:
        return None


def run_ahead(tmp_path: Path, iterations: int, *extra: str) -> tuple[list[dict], PublishedCopies]:
    """The synthetic run with S = 1 and the published copies; its metrics records."""
    config = load_config(
        None, [f"output_dir={tmp_path}", "name=ahead", f"train.iterations={iterations}",
               *SYNTHETIC, "train.overlap.max_staleness=1", *extra],
    )  # fmt: skip
    torch.manual_seed(0)
    policy = synthetic_policy()
    generator = PublishedCopies(policy)
    parts = TrainParts(policy, generator, policy.tokenizer, WordSuite(), NoSandboxPool())
    train(config, parts, show_progress=False)
    lines = (tmp_path / "ahead" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], generator


def rollouts(tmp_path: Path, iteration: int) -> list[dict]:
    path = tmp_path / "ahead" / "rollouts" / f"iter-{iteration}.jsonl.gz"
    with gzip.open(path, "rt") as lines:
        return [json.loads(line) for line in lines]


def test_groups_collected_ahead_sample_one_version_each_and_are_counted(tmp_path: Path) -> None:
    records, generator = run_ahead(tmp_path, 3)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for record in records:
        assert record["stale/groups_dropped"] == 0 and record["stale/lag_max"] <= 1
        assert record["time/wait_rollouts_s"] >= 0 and record["recompute/tokens"] > 0
        assert record["stale/groups_lag_0"] + record.get("stale/groups_lag_1", 0) == 2
    assert records[0]["stale/lag_max"] == 0  # nothing ran ahead of iteration 0
    # iteration k+1 was dispatched while k learned, before k's weights were published
    assert records[1]["stale/groups_lag_1"] == records[2]["stale/groups_lag_1"] == 2
    for iteration in range(3):
        by_group: dict[str, set[tuple[int, str]]] = defaultdict(set)
        for rollout in rollouts(tmp_path, iteration):
            for turn in rollout["turns"]:
                by_group[rollout["task_id"]].add(
                    (rollout["policy_version"], turn["adapter_version"])
                )
        assert len(by_group) == 2
        for task, versions in by_group.items():
            assert len(versions) == 1, (iteration, task, versions)  # one version per group
            ((number, name),) = versions
            assert name == f"v{number}" and iteration - number in (0, 1)
    assert all(named == sampled for named, sampled in generator.requests)  # always pinned


def test_a_killed_run_recollects_the_groups_it_had_collected_ahead(tmp_path: Path) -> None:
    """A kill after iteration 0's checkpoint loses iteration 1's rollouts collected ahead: the
    resumed run collects the same tasks again and counts them; nothing is trained twice."""
    records, _ = run_ahead(tmp_path, 3)
    state = checkpoint.load_state(tmp_path / "ahead" / "checkpoints" / "iter-1")
    first_tasks = sorted({r["task_id"] for r in rollouts(tmp_path, 1)})
    assert sorted(state["ahead"][1]) == first_tasks  # the checkpoint names what ran ahead
    assert checkpoint.load_state(tmp_path / "ahead" / "checkpoints" / "iter-3")["ahead"] == {}
    for name in ("iter-2", "iter-3"):  # as if killed during iteration 1
        shutil.rmtree(tmp_path / "ahead" / "checkpoints" / name)
    resumed, _ = run_ahead(tmp_path, 3)
    assert [r["iteration"] for r in resumed] == [0, 1, 2]
    assert (
        resumed[1]["stale/groups_recollected"] == 2 and resumed[2]["stale/groups_recollected"] == 0
    )
    assert sorted({r["task_id"] for r in rollouts(tmp_path, 1)}) == first_tasks
    assert resumed[1]["stale/groups_lag_0"] == 2  # collected again with the resumed weights
    assert resumed[0] == records[0]
