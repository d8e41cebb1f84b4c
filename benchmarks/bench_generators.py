"""Generation speed of `hf` against vLLM on the same multi-turn prompts, same model.

    python benchmarks/bench_generators.py [--turns 6] [--new-tokens 64] [--rollouts 4]

The prompts are real multi-turn rollout prefixes: the agent's opening prompt for a few dev
tasks, grown turn by turn with scripted assistant turns and real observations (the gold
solutions run in the real sandbox), so both backends see exactly the same token ids. Measured in
one run, for each backend:
- generated tokens per second with `--rollouts` rollouts in flight (batched), and the ratio;
- turn latency against context length with one rollout in flight: does the prefix get reused
  (vLLM's prefix cache) or recomputed every turn (hf without a shared cache)?
Sampling is greedy with a fixed number of new tokens (no stop token), so both do equal work.
vLLM runs as the `vllm_server` backend runs it: one OpenAI server started here, with the
trainer's arguments (`vllm_server`).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from loop.config import AgentConfig
from loop.generators.base import Generation, Generator, SamplingParams
from loop.model.aliases import resolve_model
from loop.rollout.agent import run_episode
from loop.rollout.prompt import worked_example
from sandbox import KernelPool
from tasks import get_suite


class Replay:
    """Replays gold-solution cells as assistant turns, to grow real multi-turn prefixes."""

    name = "replay"
    shares_weights = False

    def __init__(self, tokenizer: Any, cells: list[str]) -> None:
        self.tokenizer, self.cells, self.turn = tokenizer, cells, 0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        cell = self.cells[min(self.turn, len(self.cells) - 1)]
        self.turn += 1
        ids = self.tokenizer(f"```python\n{cell}\n```", add_special_tokens=False)["input_ids"]
        ids = [*ids, params.stop_token_ids[0]]
        return Generation(ids, [0.0] * len(ids), "stop")

    def load_adapter(self, path: Any) -> None:
        pass

    def release_memory(self) -> None:
        pass

    async def close(self) -> None:
        pass


def vllm_server(model: str) -> Generator:
    """One vLLM server on `model`, started with the trainer's arguments for it (on a CPU:
    prefix caching, no prompt split across engine steps), behind the `vllm_server` client."""
    from loop.build import vllm_server_args
    from loop.config import load_config
    from loop.generators.vllm.process import ServerProcess
    from loop.generators.vllm.server import VLLMServerGenerator

    args = vllm_server_args(load_config(None, [f"model.name={model}"]), "base", enable_lora=False)
    log_path = Path(tempfile.mkdtemp()) / "server.log"
    server = ServerProcess(args, log_path=log_path)
    return VLLMServerGenerator(base_model="base", adapter_prefix="bench", processes=[server])


async def measured(
    generator: Generator, prefixes: list[list[list[int]]], new_tokens: int
) -> dict[str, Any]:
    """`measure`, then the generator closed, in one event loop (a server's client binds to it)."""
    try:
        return await measure(generator, prefixes, new_tokens)
    finally:
        await generator.close()


def rollout_prefixes(tokenizer: Any, n_rollouts: int, turns: int) -> list[list[list[int]]]:
    """For each rollout, the prompt ids of its turns 1..turns (real observations)."""
    suite = get_suite("apptown")
    tasks = suite.tasks("dev")[:n_rollouts]
    settings = AgentConfig(max_turns=turns, max_context_tokens=8000, max_new_tokens=512)

    async def one(task: Any, pool: KernelPool) -> list[list[int]]:
        sandbox = await pool.acquire_async()
        try:
            cells = suite.gold_solution(task) * turns  # repeats past the end: long prefixes
            replay = Replay(tokenizer, cells[:-1])  # never the final complete_task cell
            env = suite.make_env(task, sandbox)
            traj = await run_episode(
                env, task, replay, tokenizer, settings, example=list(worked_example(suite))
            )
        finally:
            await pool.release_async(sandbox)
        return [traj.tokens[: t.output_start] for t in traj.turns]

    async def all_rollouts() -> list[list[list[int]]]:
        with KernelPool(size=2) as pool:
            return list(await asyncio.gather(*(one(t, pool) for t in tasks)))

    return asyncio.run(all_rollouts())


async def measure(
    generator: Generator, prefixes: list[list[list[int]]], new_tokens: int
) -> dict[str, Any]:
    """Throughput with all rollouts in flight, then per-turn latency with one in flight."""
    params = SamplingParams(max_new_tokens=new_tokens, temperature=0.0)
    await generator.generate(prefixes[0][0], SamplingParams(max_new_tokens=4, temperature=0.0))
    start, generated = time.perf_counter(), 0
    for turn in range(len(prefixes[0])):
        outs = await asyncio.gather(*(generator.generate(p[turn], params) for p in prefixes))
        generated += sum(len(o.token_ids) for o in outs)
    throughput = generated / (time.perf_counter() - start)
    latencies = []
    for prompt in prefixes[-1]:
        t0 = time.perf_counter()
        await generator.generate(prompt, params)
        latencies.append((len(prompt), time.perf_counter() - t0))
    return {"tokens_per_s": throughput, "latencies": latencies}


def main() -> None:
    """Build the prefixes once, run both backends on them, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=4)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from loop.generators.hf.generator import HFGenerator
    from loop.model.policy import load_policy

    path = resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(path)
    prefixes = rollout_prefixes(tokenizer, args.rollouts, args.turns)
    results = {}
    for name in ("hf", "vllm"):
        if name == "hf":
            generator: Generator = HFGenerator(load_policy(path), max_batch_size=args.rollouts)
        else:
            generator = vllm_server(path)
        results[name] = asyncio.run(measured(generator, prefixes, args.new_tokens))
    hf, vllm = results["hf"], results["vllm"]
    print(
        f"\nSmolLM2-135M-Instruct, {args.rollouts} rollouts x {args.turns} turns, "
        f"{args.new_tokens} new tokens per turn, greedy"
    )
    print(f"{'backend':<8} {'tokens/s':>10}")
    for name, r in results.items():
        print(f"{name:<8} {r['tokens_per_s']:>10.1f}")
    print(f"vllm / hf throughput: {vllm['tokens_per_s'] / hf['tokens_per_s']:.2f}x\n")
    print(f"{'context':>8} {'hf s/turn':>10} {'vllm s/turn':>12} {'hf/vllm':>8}")
    for (ctx, t_hf), (_, t_vllm) in zip(hf["latencies"], vllm["latencies"], strict=True):
        print(f"{ctx:>8} {t_hf:>10.2f} {t_vllm:>12.2f} {t_hf / t_vllm:>8.2f}")
    for name, r in results.items():
        first, last = r["latencies"][0], r["latencies"][-1]
        growth = last[1] / first[1]
        print(f"{name}: turn latency x{growth:.2f} from {first[0]} to {last[0]} context tokens")


if __name__ == "__main__":
    main()
