"""Replaying the warm start's demonstrations during RL (`train.replay.coef`): each step's gradient
is the RL loss's plus `demo_coef` x the mean cross-entropy of the step's demonstrations; steps
take the demonstrations in a seeded cycle; the config is refused where there are none; a run
replays them and logs `loss/demo`.

Run: python -m pytest tests/loop/test_demo_replay.py -q
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loop.algo.losses import cross_entropy_loss
from loop.checks import check_run
from loop.config import ConfigError, load_config
from loop.learner.batch import Sample
from loop.learner.learner import Learner
from loop.learner.logprobs import token_logprobs
from loop.learner.settings import LearnerSettings
from tests.loop.synthetic import synthetic_policy
from tests.loop.test_finetune import demo_sample, warm_started
from tests.loop.test_learner_guards import sample
from tests.loop.test_trainer import run_synthetic


def settings(demo_coef: float, demos_per_step: int = 2, epochs: int = 1) -> LearnerSettings:
    return LearnerSettings(
        lr=0.0, weight_decay=0.0, minibatch_size=1, max_grad_norm=1e9, kl_threshold=1e9,
        demo_coef=demo_coef, demos_per_step=demos_per_step, epochs=epochs,
    )  # fmt: skip


def gradients(learner: Learner) -> list[torch.Tensor]:
    return [p.grad.clone() for p in learner.params if p.grad is not None]


def test_the_step_adds_demo_coef_times_the_demonstrations_mean_cross_entropy() -> None:
    rollout, demos = sample(torch.full((10,), -2.0)), [demo_sample(s) for s in range(3)]
    with_demos = Learner(synthetic_policy(), settings(0.5))
    with_demos.replay(demos, seed=0)
    with_demos.learn([rollout], seed=0)
    without = Learner(synthetic_policy(), settings(0.0))
    without.replay(demos, seed=0)  # demo_coef 0: replay is off
    stats = without.learn([rollout], seed=0)
    assert "loss/demo" not in stats.metrics()
    # by hand: the first two demonstrations of the seeded order, their mean NLL
    picked = with_demos.demonstrations[:2]
    model = synthetic_policy().model
    nll = torch.stack([nll_of(model, demo) for demo in picked]).mean()
    (0.5 * nll).backward()
    by_hand = [p.grad for p in model.parameters() if p.requires_grad]
    for total, rl, demo in zip(gradients(with_demos), gradients(without), by_hand, strict=True):
        torch.testing.assert_close(total, rl + demo, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in by_hand)  # the term is not empty


def nll_of(model: torch.nn.Module, demo: Sample) -> torch.Tensor:
    logprobs = token_logprobs(model, demo.tokens[None])
    return cross_entropy_loss(logprobs, demo.is_output[None]).loss[0]


def test_steps_take_the_demonstrations_in_a_seeded_cycle_and_log_their_loss() -> None:
    demos = [demo_sample(s) for s in range(3)]
    learner = Learner(synthetic_policy(), settings(1.0, demos_per_step=2, epochs=2))
    learner.replay(demos, seed=1)
    order = learner.demonstrations
    assert sorted(id(d) for d in order) == sorted(id(d) for d in demos)
    seen: list[list[int]] = []
    collate = learner._collate

    def spy(samples: list[Sample]):  # type: ignore[no-untyped-def]
        if all(any(s is d for d in demos) for s in samples):
            seen.append([next(i for i, d in enumerate(order) if d is s) for s in samples])
        return collate(samples)

    learner._collate = spy  # type: ignore[method-assign]
    rollouts = [sample(torch.full((10,), -2.0)) for _ in range(3)]
    stats = learner.learn(rollouts, seed=0)  # 2 epochs x 3 minibatches of one rollout
    assert seen == [[0], [1], [2], [0], [1], [2], [0], [1], [2], [0], [1], [2]]
    assert stats.optimizer_steps == 6 and len(stats.demo_losses) == 6
    assert stats.metrics()["loss/demo"] == pytest.approx(sum(stats.demo_losses) / 6)
    assert all(loss > 0 for loss in stats.demo_losses)


def test_demo_replay_without_demonstrations_is_refused_in_one_line(tmp_path: Path) -> None:
    base = [f"output_dir={tmp_path}", "suite=apptown", "train.replay.coef=0.5",
            "generator.backend=vllm_server"]  # fmt: skip
    for extra, cause in [
        (["warm_start.source=none"], "needs warm_start.source gold or rollouts"),
        (["warm_start.source=gold", "train.replay.demos_per_step=3"], "multiple of the 2 learner"),
        (["train.replay.coef=-1"], "must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=cause) as caught:
            check_run(load_config(None, [*base, *extra]), 2)
        assert "\n" not in str(caught.value)


def test_a_run_replays_the_warm_starts_demonstrations(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LOOP_CACHE_DIR", str(tmp_path / "cache"))
    run_synthetic(tmp_path, 1)  # a teacher's rollouts, the warm start's demonstrations
    teacher = tmp_path / "synth" / "rollouts" / "iter-0.jsonl.gz"
    record, _ = warm_started(
        tmp_path, "replay", teacher, "train.iterations=1", "train.replay.coef=0.5"
    )
    assert record["iteration"] == 0 and record["learn/optimizer_steps"] > 0
    assert record["loss/demo"] > 0
