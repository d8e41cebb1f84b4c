"""Verlog's memory window (`agent.memory_turns`): each turn's prompt is the task context plus the
last n turns, spliced token for token out of the episode; each turn becomes its own training
sample whose learner log-probs match the sampler's; the rollouts file keeps the whole episode.

Run: python -m pytest tests/loop/test_memory_window.py -q
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from loop.config import AgentConfig, load_config
from loop.generators.base import Generation, SamplingParams
from loop.generators.hf.generator import HFGenerator
from loop.learner.batch import make_samples
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from loop.parts import TrainParts
from loop.rollout.agent import run_episode
from loop.trainer import train
from tests.loop.synthetic import (
    MultiTurnWordSuite,
    NoSandboxPool,
    code_word_tokenizer,
    synthetic_policy,
)


class RecordingGenerator:
    """Answers turn k with the words w(10k+3) w(10k+4) and a stop token; records each prompt."""

    name = "recording"
    shares_weights = False

    def __init__(self) -> None:
        self.prompts: list[list[int]] = []
        self.outputs: list[list[int]] = []

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        self.prompts.append(list(prompt_token_ids))
        k = len(self.outputs)
        ids = [10 * k + 3, 10 * k + 4, params.stop_token_ids[0]]
        self.outputs.append(ids)
        return Generation(ids, [-0.5] * len(ids), "stop")


def _episode(generator: Any, memory_turns: int | None, turns: int = 4) -> Any:
    suite = MultiTurnWordSuite(turns=turns)
    task = suite.tasks("train")[0]
    settings = AgentConfig(max_turns=turns, max_new_tokens=4, max_context_tokens=4000,
                           memory_turns=memory_turns)  # fmt: skip
    env = suite.make_env(task, None)
    return asyncio.run(
        run_episode(env, task, generator, code_word_tokenizer(), settings, example=[])
    )


@pytest.mark.parametrize("n", [1, 2])
def test_windowed_prompt_is_the_context_plus_the_last_n_turns_token_for_token(n: int) -> None:
    generator = RecordingGenerator()
    traj = _episode(generator, n)
    assert len(traj.turns) == 4 and traj.memory_turns == n
    context = traj.tokens[: traj.prompt_length]
    # Turn k as the episode recorded it: the sampled ids, then the environment's ids (glue and
    # observation) up to the next turn's start.
    spans = []
    for k, turn in enumerate(traj.turns):
        end = traj.turns[k + 1].output_start if k + 1 < len(traj.turns) else len(traj.tokens)
        assert traj.tokens[turn.output_start : turn.output_end] == generator.outputs[k]
        spans.append(traj.tokens[turn.output_start : end])
    for t, prompt in enumerate(generator.prompts):
        expected = context + [i for span in spans[max(0, t - n) : t] for i in span]
        assert prompt == expected, t
        assert traj.prompt_ids(t) == expected
    assert len(generator.prompts[3]) < traj.turns[3].output_start  # the window dropped turns
    # The whole episode is still in the trajectory (rollouts file, report).
    assert sum(traj.is_output) == 12  # system, instructions, task; 4 turns; 3 observations
    assert len(traj.messages) == 3 + 4 + 3


def test_without_a_window_every_prompt_is_the_whole_prefix() -> None:
    generator = RecordingGenerator()
    traj = _episode(generator, None)
    for t, prompt in enumerate(generator.prompts):
        assert prompt == traj.tokens[: traj.turns[t].output_start]


def test_each_turn_is_a_sample_whose_learner_log_probs_match_the_sampler() -> None:
    torch.manual_seed(0)
    policy = synthetic_policy()
    traj = _episode(HFGenerator(policy, max_batch_size=1), 1)
    samples = make_samples(traj, [0.5] * len(traj.turns), 4000, source=0, reward=1.0)
    assert [s.turn for s in samples] == list(range(len(traj.turns)))
    for t, sample in enumerate(samples):
        turn = traj.turns[t]
        assert sample.tokens.tolist() == traj.prompt_ids(t) + traj.tokens[
            turn.output_start : turn.output_end
        ]  # fmt: skip
        assert int(sample.is_output.sum()) == turn.output_end - turn.output_start
        assert sample.positions is not None
        assert sample.positions[sample.is_output].tolist() == list(
            range(turn.output_start, turn.output_end)
        )
    learner = Learner(policy, LearnerSettings(lr=1e-3, weight_decay=0.0))
    stats = learner.recompute_old_logprobs(samples)
    assert stats["recompute/tokens"] == sum(traj.is_output)
    assert stats["recompute/abs_logprob_diff_max"] < 1e-4, stats


def test_verlog_with_a_memory_window_trains_turns_and_logs_whole_episodes(tmp_path: Path) -> None:
    from tests.loop.test_trainer import SYNTHETIC

    args = [a for a in SYNTHETIC if not a.startswith("agent.max_turns")]
    config = load_config(None, [
        f"output_dir={tmp_path}", "name=window", "train.iterations=2", *args,
        "agent.max_turns=3", "agent.memory_turns=1", "train.advantage=verlog", "critic.lr=0.01",
    ])  # fmt: skip
    torch.manual_seed(0)
    policy = synthetic_policy()
    parts = TrainParts(policy, HFGenerator(policy, max_batch_size=16), policy.tokenizer,
                       MultiTurnWordSuite(turns=3), NoSandboxPool())  # fmt: skip
    train(config, parts, show_progress=False)
    lines = (tmp_path / "window" / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert records[0]["rollout/turns_mean"] == 3
    # 16 rollouts x 3 turns, each turn its own sample: 48 per epoch, minibatches of 8 turns
    assert records[0]["learn/optimizer_steps"] == 2 * 48 // 8
    assert records[0]["recompute/abs_logprob_diff_max"] < 1e-4
    with gzip.open(tmp_path / "window" / "rollouts" / "iter-1.jsonl.gz", "rt") as handle:
        rollout = json.loads(handle.readline())
    assert len(rollout["turns"]) == 3
    learner = rollout["learner_logprobs"]  # every sampled token of the whole episode
    assert [x is not None for x in learner] == rollout["is_output"]
    assert all(math.isfinite(x) for x in learner if x is not None)
