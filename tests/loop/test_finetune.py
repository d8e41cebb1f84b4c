"""The fine-tuning methods beside LOOP: cross-entropy in the learner, expert iteration in the
trainer, the warm start's cache key.

- SFT: the learner's cross-entropy loss is exactly -mean log p over the output tokens (so the
  prompt and the observations are never trained) and it falls over a few epochs.
- EI: `advantage: filter` + `loss: cross_entropy` keeps exactly the rollouts whose return
  reaches `return_threshold`, and raises the reward of the synthetic task.
- The warm start's cache key changes with its data and with every setting that shapes it.

Run: python -m pytest tests/loop/test_finetune.py -q
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
from pathlib import Path

import torch

from loop.batch import Sample, collate
from loop.config import load_config
from loop.learner import Learner
from loop.logprobs import token_logprobs
from loop.trajectory import Trajectory
from loop.warmstart import cache_key
from tests.loop.synthetic import synthetic_policy
from tests.loop.test_trainer import rewards, run_synthetic


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
        policy, lr=3e-3, weight_decay=0.0, loss="cross_entropy", epochs=1, minibatch_size=2
    )
    samples = [demo_sample(0), demo_sample(1)]
    batch = collate(samples, pad_id=2, device=torch.device("cpu"))
    with torch.no_grad():
        logprobs = token_logprobs(policy.model, batch.input_ids, batch.attention_mask)
        out = learner._policy_loss(batch)
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
