"""The fine-tuning methods beside LOOP: cross-entropy in the learner, expert iteration in the
trainer, the warm start's cache key.

- SFT: the learner's cross-entropy loss is exactly -mean log p over the output tokens (so the
  prompt and the observations are never trained) and it falls over a few epochs.
- EI: `advantage: filter` + `loss: cross_entropy` keeps exactly the rollouts whose return
  reaches `return_threshold`, and raises the reward of the synthetic task.
- RFT: the temperature ladder's successes are fine-tuned on, its rungs kept for a resume; with
  none, the policy stays.
- The warm start's cache key changes with its data and with every setting that shapes it; a
  warm start from a teacher's rollouts trains, is served to a separate generator, and a second
  run with the same data and settings loads the cached adapter.

Run: python -m pytest tests/loop/test_finetune.py -q
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
from pathlib import Path

import pytest
import torch

from loop.config import load_config
from loop.generators.base import GeneratorStats
from loop.generators.hf.generator import HFGenerator
from loop.learner.batch import Sample, collate
from loop.learner.learner import Learner
from loop.learner.logprobs import token_logprobs
from loop.learner.objective import policy_loss
from loop.learner.settings import LearnerSettings
from loop.model import checkpoint
from loop.model.policy import LoraSettings, _wrap_lora
from loop.parts import TrainParts
from loop.rollout.trajectory import Trajectory
from loop.trainer import train
from loop.warmstart import cache_key
from tests.loop.synthetic import NoSandboxPool, WordSuite, synthetic_policy
from tests.loop.test_trainer import SYNTHETIC, rewards, run_synthetic


def demo_sample(seed: int) -> Sample:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, 300, (16,), generator=generator)
    is_output = torch.zeros(16, dtype=torch.bool)
    is_output[5:9] = is_output[12:] = True  # two "turns"; 0-4 prompt, 9-11 an observation
    return Sample(
        tokens, is_output, torch.full((16,), float("nan")), torch.where(is_output, 0, -1),
        torch.where(is_output, 1.0, 0.0),
    )  # fmt: skip


def test_the_sft_loss_is_the_output_tokens_nll_and_falls() -> None:
    policy = synthetic_policy()
    learner = Learner(
        policy,
        LearnerSettings(
            lr=3e-3, weight_decay=0.0, loss="cross_entropy", epochs=1, minibatch_size=2
        ),
    )
    samples = [demo_sample(0), demo_sample(1)]
    batch = collate(samples, pad_id=2, device=torch.device("cpu"))
    with torch.no_grad():
        logprobs = token_logprobs(policy.model, batch.input_ids, batch.attention_mask)
        out = policy_loss(batch, learner._logprobs(batch, learner._hidden(batch)), learner.settings)
    for row, sample in enumerate(samples):
        expected = -logprobs[row][sample.is_output].mean()
        torch.testing.assert_close(out.loss[row], expected)
    losses = [learner.learn(samples, seed=e).metrics()["loss/policy"] for e in range(6)]
    assert losses[-1] < 0.8 * losses[0], losses
    assert all(b <= a + 1e-6 for a, b in itertools.pairwise(losses)), losses


def test_expert_iteration_keeps_exactly_the_rollouts_at_the_threshold(tmp_path: Path) -> None:
    records = run_synthetic(
        tmp_path, 4, "train.advantage=filter", "train.loss=cross_entropy",
        "train.return_threshold=0.75", "train.lr=0.003",
    )  # fmt: skip
    for iteration in range(4):
        path = tmp_path / "synth" / "rollouts" / f"iter-{iteration}.jsonl.gz"
        with gzip.open(path, "rt") as lines:
            rollouts = [json.loads(line) for line in lines]
        assert [r["kept"] for r in rollouts] == [r["reward"] >= 0.75 for r in rollouts]
        assert records[iteration]["rollout/kept"] == sum(r["kept"] for r in rollouts)
    curve = rewards(records)
    assert max(curve[-2:]) > curve[0] + 0.1, curve  # imitating the best rollouts helps


def test_the_warm_start_cache_key_follows_data_and_settings() -> None:
    config = load_config("configs/quickstart.yaml", ["warm_start.source=gold"])
    demo = Trajectory("t_1", "t", 1, 0, tokens=[1, 2, 3], is_output=[False, True, True])
    base = cache_key(config, [demo])
    assert cache_key(config, [demo]) == base  # deterministic
    other_data = dataclasses.replace(demo, tokens=[1, 2, 4])
    assert cache_key(config, [other_data]) != base
    assert cache_key(config, [demo, demo]) != base
    for override in (
        "warm_start.lr=0.01", "warm_start.epochs=7", "warm_start.style=paper",
        "model.lora_rank=8", "agent.max_new_tokens=50", "seed=3", "model.name=other",
    ):  # fmt: skip
        changed = load_config("configs/quickstart.yaml", ["warm_start.source=gold", override])
        assert cache_key(changed, [demo]) != base, override
    same = load_config(
        "configs/quickstart.yaml",
        ["warm_start.source=gold", "warm_start.cache=false", "model.torch_threads=1", "name=x"],
    )
    assert cache_key(same, [demo]) == base  # neither caching nor threads nor the run's name


class ServingRecorder:
    """The hf generator under another backend's name: records the adapters it is told to serve."""

    def __init__(self, inner: HFGenerator) -> None:
        self.inner, self.name, self.served = inner, "recorder", []
        self.shares_weights = False  # so the warm start hands it the adapter

    async def generate(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return await self.inner.generate(*args, **kwargs)

    def load_adapter(self, path: Path) -> None:
        self.served.append(Path(path))

    def release_memory(self) -> None:
        self.inner.release_memory()

    def stats(self) -> GeneratorStats:
        return self.inner.stats()

    async def close(self) -> None:
        await self.inner.close()


def warm_started(
    tmp_path: Path, name: str, teacher: Path, *extra: str
) -> tuple[dict, ServingRecorder]:
    """A LoRA run warm-started on `teacher`'s good rollouts (`extra`: more overrides); its
    first metrics record."""
    config = load_config(
        None,
        [f"output_dir={tmp_path}", f"name={name}", *SYNTHETIC, "model.lora_rank=4",
         "model.lora_alpha=8", "train.iterations=0", "warm_start.source=rollouts",
         f"warm_start.rollouts=[{teacher}]", "warm_start.min_reward=0.75",
         "warm_start.epochs=3", "warm_start.lr=0.01", "warm_start.minibatch_size=4", *extra],
    )  # fmt: skip
    torch.manual_seed(0)
    policy = synthetic_policy()
    policy.model = _wrap_lora(policy.model, LoraSettings(rank=4, alpha=8))
    generator = ServingRecorder(HFGenerator(policy, max_batch_size=16))
    parts = TrainParts(policy, generator, policy.tokenizer, WordSuite(), NoSandboxPool())
    train(config, parts, show_progress=False)
    record = json.loads(next(iter((tmp_path / name / "metrics.jsonl").open())))
    return record, generator


def test_a_warm_start_trains_on_a_teachers_rollouts_then_comes_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOP_CACHE_DIR", str(tmp_path / "cache"))
    run_synthetic(tmp_path, 1)  # the "teacher": one iteration's rollouts
    teacher = tmp_path / "synth" / "rollouts" / "iter-0.jsonl.gz"
    with gzip.open(teacher, "rt") as lines:
        good = sum(json.loads(line)["reward"] >= 0.75 for line in lines)
    assert good > 0
    first, served = warm_started(tmp_path, "a", teacher)
    assert first["warm_start/demonstrations"] == good and first["warm_start/cached"] == 0
    assert first["warm_start/loss_last_epoch"] < first["warm_start/loss_first_epoch"]
    adapter = tmp_path / "a" / "warm_start" / "adapter" / checkpoint.ADAPTER_FILE
    assert served.served == [adapter.parent]  # a separate engine samples from the warm start
    second, served = warm_started(tmp_path, "b", teacher)
    assert second["warm_start/cached"] == 1 and served.served == [tmp_path / "b/warm_start/adapter"]
    again = tmp_path / "b" / "warm_start" / "adapter" / checkpoint.ADAPTER_FILE
    assert again.read_bytes() == adapter.read_bytes()


def test_rft_trains_on_its_ladders_successes_resumes_by_rung_and_without_any_leaves_the_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """RFT ([P] App. C): the starting policy over the temperature ladder, fine-tuned on the
    rollouts that reached `min_reward` (each rung written; a rerun samples none again); when
    none did, nothing is trained or served, said in a line."""
    monkeypatch.setenv("LOOP_CACHE_DIR", str(tmp_path / "cache"))
    ladder = ["warm_start.source=rft", "warm_start.rft_temperatures=[0.5,1.0]"]
    found, served = warm_started(tmp_path, "rft", tmp_path / "unused", *ladder)
    assert found["warm_start/demonstrations"] > 0 and found["warm_start/cached"] == 0
    assert found["warm_start/loss_last_epoch"] < found["warm_start/loss_first_epoch"]
    assert served.served == [tmp_path / "rft" / "warm_start" / "adapter"]
    rungs = sorted((tmp_path / "rft" / "warm_start" / "rft").iterdir())
    assert [r.name for r in rungs] == ["pass-0-T0.5.jsonl.gz", "pass-0-T1.jsonl.gz"]
    sampled = [
        json.loads(line)
        for rung in rungs
        for line in gzip.decompress(rung.read_bytes()).splitlines()
    ]
    kept = sum(r["reward"] >= 0.75 for r in sampled)  # exactly the successes are trained on
    assert found["warm_start/demonstrations"] == kept < len(sampled)
    unreachable = "warm_start.min_reward=2.0"  # no rollout reaches it
    none, served = warm_started(tmp_path, "none", tmp_path / "unused", *ladder, unreachable)
    assert none["warm_start/demonstrations"] == 0 and served.served == []
    assert "rft kept no rollout" in capsys.readouterr().err

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a rung written before was sampled again")

    monkeypatch.setenv("LOOP_CACHE_DIR", str(tmp_path / "another-cache"))
    monkeypatch.setattr("loop.warmstart.collect_rollouts", never)
    again, _ = warm_started(tmp_path, "rft", tmp_path / "unused", *ladder)  # a stopped run, rerun
    assert again["warm_start/demonstrations"] == kept
