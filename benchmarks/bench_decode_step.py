"""One decode step of the `hf` engine, with and without its fused kernels, in one process.

    python benchmarks/bench_decode_step.py [--rows 8] [--prefix 1500] [--threads 1 2]

SmolLM2-135M + LoRA r16 (B factors random, so the adapter counts), `--rows` rows viewing one
`--prefix`-token prefix entry (as the quickstart's rollouts view the shared prompt) with 100-170
own tokens each. Five engines over the same model and the same rows, stepped in turn (order
alternating, several repeats, medians): `unfused` (each projection module called, attention as
matrix products), `projections` (fused projections, attention as matrix products), `fused`
(fused projections and the CPU flash kernel for attention), `packed` (those, with the
projections and the LM head on packed weight copies) and `capped` (`packed` with the
generator's context cap, `--cap`, the quickstart's 2,048 tokens: on a CPU its slots take the cap
at once and its rows sit further apart; the generator's engine); then the sampling
of one step (`pick_tokens`, and per-row `torch.multinomial`, its draw before), the
learner-parity check of the fused and packed engines (max |logit gap| against the unfused one
on the same rows), and the rows joining a step with `--join-tokens` new ids each (a turn's glue
and observation), prefilled one row at a time against one packed `prefill_rows`.
Prints ms per step and the ratios to `unfused`. `--profile` adds, per thread count, where a
`packed` step's time goes (torch.profiler, self CPU time): the matrix products, the attention
kernel over the rows' own slots and over the shared prefix, and everything else.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # as a script
from loop.generators.base import SamplingParams
from loop.generators.hf.engine import DecoderEngine, Row
from loop.generators.hf.kvcache import KVStore
from loop.generators.hf.sampling import pick_tokens
from loop.model.aliases import resolve_model
from loop.model.policy import LoraSettings, load_policy


def lora_model(dtype: str = "float32") -> Any:
    """SmolLM2-135M with LoRA r16 whose B factors are random (so the adapter counts), the same
    in any dtype."""
    policy = load_policy(
        resolve_model("smollm2-135m"), lora=LoraSettings(rank=16, alpha=32), dtype=dtype
    )
    torch.manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    return policy.model


def engine_with_rows(
    model: Any,
    rows: int,
    prefix: list[int],
    fused: bool,
    packed: bool = False,
    max_tokens: int | None = None,
) -> tuple[DecoderEngine, list[Row]]:
    """An engine whose `rows` rows view `prefix` and hold their own ids (the same per seed)."""
    engine = DecoderEngine(model, max_rows=rows, fused=fused, packed=packed, max_tokens=max_tokens)
    store, kv = KVStore(2**31), engine.new_store(len(prefix))
    engine.prefill(Row(ids=[]), prefix, store=kv)
    entry = store.add_entry(prefix, kv)
    ids = torch.Generator().manual_seed(1)
    active = []
    for i in range(rows):
        row = Row(ids=list(prefix), entry=entry, n_prefix=len(prefix))
        engine.add(row, None)
        engine.reserve(400)
        engine.prefill(row, torch.randint(0, 49000, (100 + 10 * i,), generator=ids).tolist())
        active.append(row)
    return engine, active


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--prefix", type=int, default=1500)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--join-tokens", type=int, default=40, help="new ids a joining row has")
    parser.add_argument("--profile", action="store_true", help="where a packed step's time goes")
    parser.add_argument("--cap", type=int, default=2048, help="the capped engine's context cap")
    args = parser.parse_args()
    model = lora_model().eval()
    prefix = torch.randint(0, 49000, (args.prefix,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        engines = {
            "unfused": engine_with_rows(model, args.rows, prefix.tolist(), fused=False),
            "projections": engine_with_rows(model, args.rows, prefix.tolist(), fused=True),
            "fused": engine_with_rows(model, args.rows, prefix.tolist(), fused=True),
            "packed": engine_with_rows(model, args.rows, prefix.tolist(), True, packed=True),
            "capped": engine_with_rows(
                model, args.rows, prefix.tolist(), True, packed=True, max_tokens=args.cap
            ),
        }
        engines["projections"][0].fused_attention = False
        tokens = [5] * args.rows
        logits = {name: engine.decode(rows, tokens) for name, (engine, rows) in engines.items()}
        gap = (logits["fused"] - logits["unfused"]).abs().max().item()
        packed_gap = (logits["packed"] - logits["unfused"]).abs().max().item()
        print(f"{args.rows} rows over a {args.prefix}-token prefix; max |logit gap| against "
              f"unfused: fused {gap:.1e}, packed {packed_gap:.1e}")  # fmt: skip
        for threads in args.threads:
            torch.set_num_threads(threads)
            names = [*engines, "sampling", "multinomial"]
            times: dict[str, list[float]] = {name: [] for name in names}
            order = list(engines.items())
            params = [SamplingParams(max_new_tokens=10**6, temperature=1.0) for _ in tokens]
            for repeat in range(args.repeats):
                for name, (engine, rows) in order if repeat % 2 else order[::-1]:
                    start = time.perf_counter()
                    out = engine.decode(rows, tokens)
                    times[name].append(time.perf_counter() - start)
                start = time.perf_counter()
                pick_tokens(out, params, [None] * len(tokens), [[] for _ in tokens],
                            [[] for _ in tokens], [None] * len(tokens))  # fmt: skip
                times["sampling"].append(time.perf_counter() - start)
                start = time.perf_counter()
                multinomial_draws(out)
                times["multinomial"].append(time.perf_counter() - start)
            sampling = statistics.median(times.pop("sampling"))
            multinomial = statistics.median(times.pop("multinomial"))
            base = statistics.median(times["unfused"])
            line = ", ".join(
                f"{name} {statistics.median(t) * 1e3:.1f} ms ({base / statistics.median(t):.2f}x)"
                for name, t in times.items()
            )
            before = f"per-row torch.multinomial, the draw before: {multinomial * 1e3:.1f} ms"
            print(f"{threads} thread(s): {line}; sampling {sampling * 1e3:.1f} ms ({before})")
            alone, packed = joining(*engines["packed"], args.join_tokens, args.repeats)
            print(f"  {args.rows} rows joining with {args.join_tokens} new ids each (a turn's "
                  f"glue and observation): one at a time {alone * 1e3:.1f} ms, packed "
                  f"{packed * 1e3:.1f} ms ({alone / packed:.2f}x)")  # fmt: skip
            if args.profile:
                print(f"  a packed step's time: {step_shares(*engines['packed'], args.repeats)}")


PRODUCTS = ("mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::bmm", "aten::linear")
ATTENTION = "aten::_scaled_dot_product_flash_attention_for_cpu"


def step_shares(engine: DecoderEngine, rows: list[Row], steps: int) -> str:
    """Self CPU time of `steps` decode steps by kind of work (the rows are cut back after)."""
    lengths = [len(row.ids) for row in rows]
    with torch.profiler.profile(record_shapes=True) as profiler:
        for _ in range(steps):
            engine.decode(rows, [5] * len(rows))
            for row, length in zip(rows, lengths, strict=True):
                del row.ids[length:]
    kinds = {"products": 0.0, "attention, own slots": 0.0, "attention, prefix": 0.0, "other": 0.0}
    for event in profiler.key_averages(group_by_input_shape=True):
        if event.key in PRODUCTS:
            kind = "products"
        elif event.key == ATTENTION:  # the prefix part runs every row's queries as one batch
            shared = event.input_shapes and event.input_shapes[0] and event.input_shapes[0][0] == 1
            kind = "attention, prefix" if shared and len(rows) > 1 else "attention, own slots"
        else:
            kind = "other"
        kinds[kind] += event.self_cpu_time_total
    total = sum(kinds.values())
    per_step = total / steps / 1e3
    return f"{per_step:.1f} ms a step: " + ", ".join(
        f"{kind} {value / total:.0%}" for kind, value in kinds.items()
    )


def joining(
    engine: DecoderEngine, rows: list[Row], count: int, repeats: int
) -> tuple[float, float]:
    """Seconds (medians) to prefill `count` new ids on every row: each row's `prefill` in turn,
    and one `prefill_rows` for all (the rows are cut back to their ids after each)."""
    lengths = [len(row.ids) for row in rows]
    new = [list(range(1000 + 7 * i, 1000 + 7 * i + count)) for i in range(len(rows))]
    times: dict[str, list[float]] = {"alone": [], "packed": []}
    for repeat in range(repeats):
        for how in ("alone", "packed") if repeat % 2 else ("packed", "alone"):
            for row, length in zip(rows, lengths, strict=True):
                del row.ids[length:]
            start = time.perf_counter()
            if how == "alone":
                for row, ids in zip(rows, new, strict=True):
                    engine.prefill(row, ids)
            else:
                engine.prefill_rows(rows, new)
            times[how].append(time.perf_counter() - start)
    for row, length in zip(rows, lengths, strict=True):
        del row.ids[length:]
    return statistics.median(times["alone"]), statistics.median(times["packed"])


def multinomial_draws(logits: torch.Tensor) -> list[torch.Tensor]:
    """The draw `pick_tokens` made before its inverse transform: torch.multinomial per row."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    draws = [torch.multinomial(row.exp(), 1) for row in logprobs]
    return [row.gather(0, draw) for row, draw in zip(logprobs, draws, strict=True)]


if __name__ == "__main__":
    main()
