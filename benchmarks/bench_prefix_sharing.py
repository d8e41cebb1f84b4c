"""Decode speed of the `hf` generator at evaluation load: one prefix entry per task or one shared.

    python benchmarks/bench_prefix_sharing.py [--rows 72] [--tasks 36] [--new-tokens 64]

`--rows` first-turn requests of `--tasks` distinct prompts (a 400-id shared "system prompt",
then a few ids of the task), decoded together at temperature 1 with SmolLM2-135M and a LoRA
adapter, as an evaluation of 36 tasks x 2 rollouts does. Printed per setting: generated tokens/s,
and the ratio to "one entry per task" on one thread, all measured in this one run:

- one entry per task: every first-turn prompt becomes a prefix entry (`share_fraction` 1.0,
  the rule before), so each decode step runs the prefix attention once per entry in the batch;
- shared: a prompt an entry covers for half its length views it (`share_fraction` 0.5, the
  default), so the step reads one entry for all rows; each row prefills its task's own ids.

Each on 1 and 2 torch threads (`generator.torch_threads`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script
from loop.generators.base import SamplingParams
from loop.generators.hf import generator as hf
from loop.model.policy import LoraSettings, load_policy


async def tokens_per_s(
    policy, prompts: list[list[int]], threads: int, new_tokens: int, share_fraction: float
) -> float:
    generator = hf.HFGenerator(
        policy, max_batch_size=len(prompts), torch_threads=threads, share_fraction=share_fraction
    )
    try:
        await generator.generate(prompts[0][:-3], SamplingParams(max_new_tokens=1))  # warm up
        params = [
            SamplingParams(max_new_tokens=new_tokens, temperature=1.0, seed=i)
            for i in range(len(prompts))
        ]
        started = time.perf_counter()
        results = await asyncio.gather(
            *(generator.generate(p, q) for p, q in zip(prompts, params, strict=True))
        )
        return sum(len(r.token_ids) for r in results) / (time.perf_counter() - started)
    finally:
        await generator.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=72)
    parser.add_argument("--tasks", type=int, default=36)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    policy = load_policy("smollm2-135m", lora=LoraSettings(rank=16, alpha=32))
    encode = policy.tokenizer
    system = encode("You are an agent that completes tasks through APIs. " * 40)["input_ids"][:400]
    prompts = [
        system + encode(f" Task {i % args.tasks}: count my playlists.")["input_ids"]
        for i in range(args.rows)
    ]
    print(f"{args.rows} rows, {args.tasks} distinct prompts, {args.new_tokens} new tokens each")
    baseline = None
    for name, fraction in (("one entry per task", 1.0), ("shared", 0.5)):
        for threads in (1, 2):
            rate = asyncio.run(tokens_per_s(policy, prompts, threads, args.new_tokens, fraction))
            baseline = baseline or rate
            print(f"  {name:20s} {threads} thread(s): {rate:7.1f} tokens/s  {rate / baseline:.2f}x",
                  flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
