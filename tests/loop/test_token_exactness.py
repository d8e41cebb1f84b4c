"""Token in, token out with real backends: SmolLM2 playing real app-world tasks for a few turns.

For the `hf` and `vllm_server` generators alike, on real multi-turn rollouts:
- each generate call's prompt equals the trajectory prefix at that point;
- decoding each output span gives that turn's assistant message;
- `is_output` marks exactly the sampled ids: no environment or template token is marked;
- the sampler's log-probs agree with the learner's recomputation over the whole trajectory.
The `hf` case runs here; the `vllm_server` case runs on the server tests/loop/test_vllm_server.py
starts for its module (`test_rollouts_are_token_exact` there), so that one server start serves
both.
Run: python -m pytest tests/loop/test_token_exactness.py -s     (slow; -s prints the max diffs)
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import torch

from loop.config import AgentConfig
from loop.generators.base import Generation, Generator, SamplingParams
from loop.learner.logprobs import token_logprobs
from loop.model.policy import Policy
from loop.rollout.agent import run_episode
from loop.rollout.prompt import worked_example
from sandbox import KernelPool
from tasks import get_suite

pytestmark = pytest.mark.slow
SETTINGS = AgentConfig(max_turns=3, max_new_tokens=40, max_context_tokens=4096, temperature=1.0)
TOLERANCE = {"hf": 1e-3, "vllm_server": 1e-3}  # float32, same weights: about 3e-5 measured


class Recording:
    """Wraps a generator and keeps every prompt it was given."""

    def __init__(self, inner: Generator) -> None:
        self.inner, self.name, self.prompts = inner, inner.name, []  # type: ignore[var-annotated]

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        self.prompts.append(list(prompt_token_ids))
        return await self.inner.generate(prompt_token_ids, params, messages=messages)


async def roll_out(
    generator: Generator, tokenizer: Any, n_tasks: int
) -> list[tuple[Any, Recording]]:
    """`n_tasks` train tasks rolled out concurrently with `generator`, each prompt recorded."""
    suite = get_suite("apptown")

    async def one(task: Any, pool: KernelPool) -> tuple[Any, Recording]:
        recording = Recording(generator)
        sandbox = await pool.acquire_async()
        try:
            env = suite.make_env(task, sandbox)
            traj = await run_episode(
                env, task, recording, tokenizer, SETTINGS,  # type: ignore[arg-type]
                example=list(worked_example(suite)), seed=7,
            )  # fmt: skip
        finally:
            await pool.release_async(sandbox)
        return traj, recording

    with KernelPool(size=2, timeout_s=10) as pool:
        tasks = suite.tasks("train")[:n_tasks]
        return list(await asyncio.gather(*(one(t, pool) for t in tasks)))


def assert_token_exact(
    backend: str, results: list[tuple[Any, Recording]], tokenizer: Any, model: Any
) -> None:
    """The rollouts' prompts, spans, output mask and sampler log-probs, against `model`'s."""
    template_ids = {tokenizer.convert_tokens_to_ids("<|im_start|>")}
    max_diff = 0.0
    for traj, recording in results:
        assert traj.status in {"ok", "max_turns", "context_exhausted"}, traj.error
        assert len(recording.prompts) == len(traj.turns) >= 1
        sampled: set[int] = set()
        for turn, prompt in zip(traj.turns, recording.prompts, strict=True):
            assert prompt == traj.tokens[: turn.output_start]
            span = traj.tokens[turn.output_start : turn.output_end]
            assert tokenizer.decode(span, skip_special_tokens=True) == turn.text
            assert not template_ids & set(span[:-1])  # nothing of the template inside a turn
            sampled.update(range(turn.output_start, turn.output_end))
        marked = {i for i, out in enumerate(traj.is_output) if out}
        assert marked == sampled
        unmarked = (i for i in range(len(traj.tokens)) if i not in sampled)
        assert all(math.isnan(traj.sampler_logprobs[i]) for i in unmarked)
        with torch.no_grad():
            learner = token_logprobs(model, torch.tensor([traj.tokens]))[0]
        diffs = [abs(learner[i].item() - traj.sampler_logprobs[i]) for i in sorted(sampled)]
        max_diff = max(max_diff, *diffs)
    print(f"\n{backend}: sampler vs learner log-prob max abs diff {max_diff:.2e}")
    assert max_diff < TOLERANCE[backend], max_diff


def test_hf_rollouts_are_token_exact(smollm2_policy: Policy) -> None:
    from loop.generators.hf.generator import HFGenerator

    async def rolled_out() -> list[tuple[Any, Recording]]:
        generator = HFGenerator(smollm2_policy, max_batch_size=4)
        try:
            return await roll_out(generator, smollm2_policy.tokenizer, n_tasks=2)
        finally:
            await generator.close()

    results = asyncio.run(rolled_out())
    assert_token_exact("hf", results, smollm2_policy.tokenizer, smollm2_policy.model)
