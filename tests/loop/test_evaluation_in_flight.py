"""An evaluation's passes (greedy and sampled) share one bound on rollouts in flight,
`eval.max_concurrent_rollouts`: a rollout in flight holds its keys and values between turns,
so more of them than the generator decodes at once only wait, holding memory.

Run: python -m pytest tests/loop/test_evaluation_in_flight.py -q   (fast; no model, no sandbox)
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from loop.config import load_config
from loop.evaluation import run_evaluations
from loop.generators.base import Generation, SamplingParams
from tests.loop.synthetic import NoSandboxPool, WordSuite, code_word_tokenizer


class Counting:
    """A generator stand-in answering two words and a stop after a short wait; it counts the
    calls in flight (one per rollout in flight at most: a rollout's turns run one by one)."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, **_: Any
    ) -> Generation:
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(0.01)
        self.now -= 1
        return Generation([10, 20, params.stop_token_ids[0]], [-0.5, -0.5, -0.5], "stop")


def test_the_passes_share_the_bound_on_rollouts_in_flight(tmp_path: Path) -> None:
    config = load_config(None, [
        "eval.split=dev", "eval.rollouts_per_task=4", "eval.sampled_rollouts_per_task=4",
        "eval.max_concurrent_rollouts=3", "agent.max_turns=1", "agent.max_new_tokens=6",
        "agent.max_context_tokens=4000",
    ])  # fmt: skip
    generator = Counting()
    evaluation = run_evaluations(
        config, suite=WordSuite(), pool=NoSandboxPool(),
        generator=generator, tokenizer=code_word_tokenizer(),  # type: ignore[arg-type]
        out_dir=lambda label: tmp_path / label, show_progress=False,
    )  # fmt: skip
    metrics = asyncio.run(evaluation)
    assert generator.most == 3  # both passes' 8 rollouts each, 3 in flight at once in all
    assert "eval/sampled/tgc" in metrics
    for label in ("dev", "dev@T1"):
        assert len((tmp_path / label / "rollouts.jsonl").read_text().splitlines()) == 8
