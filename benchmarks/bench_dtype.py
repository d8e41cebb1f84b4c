"""float32 against bfloat16 on this CPU: one `hf` engine decode step and one learner pass.

    python benchmarks/bench_dtype.py [--rows 24] [--prefix 486] [--tokens 1000] [--repeats 6]

SmolLM2-135M + LoRA r16 (B factors random) loaded twice in one process, in float32 and in
bfloat16 (peft keeps the LoRA factors in float32). For each, alternating in turn (order
flipped every repeat; medians): one decode step of the packed engine over `--rows` rows viewing
a `--prefix`-token prefix entry (the quickstart's shared prompt) with 100-330 own tokens
each, and one learner forward and backward over a `--tokens`-id sequence whose second half is
trained (the log-probs of those tokens, as the learner and the warm start compute them). Prints
whether oneDNN multiplies bfloat16 natively here (AVX512-BF16 or AMX: only then are the
engine's bfloat16 products packed, `loop/generators/hf/fused.py: can_pack`), the times, the
ratios, and how far the two dtypes' next-token distributions are apart on the same rows
(KL, and the gap of float32's most likely token).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script
from benchmarks.bench_decode_step import engine_with_rows, lora_model
from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden

DTYPES = ("float32", "bfloat16")


def learner_pass(model: Any, ids: torch.Tensor, trained: torch.Tensor) -> None:
    """Forward and backward over `ids` (1, T), the loss the mean log-prob of `trained`."""
    model.train()
    hidden = last_hidden_state(model, ids, None)
    logprobs = logprobs_from_hidden(
        model, hidden, ids, chunk_size=1024, temperature=1.0, positions=trained
    )
    (-logprobs[trained].mean()).backward()
    model.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--prefix", type=int, default=486)
    parser.add_argument("--tokens", type=int, default=1000, help="ids of the learner's sequence")
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    print(f"oneDNN multiplies bfloat16 natively here: {native}; {args.threads} threads")
    prefix = torch.randint(0, 49000, (args.prefix,), generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 49000, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    trained = torch.zeros_like(ids, dtype=torch.bool)
    trained[:, args.tokens // 2 :] = True
    models = {dtype: lora_model(dtype) for dtype in DTYPES}
    with torch.no_grad():
        engines = {
            dtype: engine_with_rows(model.eval(), args.rows, prefix.tolist(), True, packed=True)
            for dtype, model in models.items()
        }
    tokens = [5] * args.rows
    lengths = {dtype: [len(row.ids) for row in rows] for dtype, (_, rows) in engines.items()}

    def decode(dtype: str) -> torch.Tensor:
        engine, rows = engines[dtype]
        with torch.no_grad():
            logits = engine.decode(rows, tokens)
        for row, length in zip(rows, lengths[dtype], strict=True):
            del row.ids[length:]
        return logits

    first = {dtype: decode(dtype).float().log_softmax(-1) for dtype in DTYPES}  # packs
    exact, rounded = first["float32"], first["bfloat16"]
    kl = (exact.exp() * (exact - rounded)).sum(-1)  # KL(float32 || bfloat16) per row
    top = exact.argmax(-1, keepdim=True)
    top_gap = (exact.gather(-1, top) - rounded.gather(-1, top)).abs().max().item()
    times: dict[str, list[float]] = {
        f"{kind} {d}": [] for kind in ("decode", "learner") for d in DTYPES
    }
    for repeat in range(args.repeats):
        for dtype in DTYPES if repeat % 2 else DTYPES[::-1]:
            start = time.perf_counter()
            decode(dtype)
            times[f"decode {dtype}"].append(time.perf_counter() - start)
            start = time.perf_counter()
            learner_pass(models[dtype], ids, trained)
            times[f"learner {dtype}"].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    for kind, unit, scale in (("decode", "ms", 1e3), ("learner", "s", 1.0)):
        f32, bf16 = medians[f"{kind} float32"], medians[f"{kind} bfloat16"]
        print(
            f"{kind}: float32 {f32 * scale:.2f} {unit}, bfloat16 {bf16 * scale:.2f} {unit} "
            f"({f32 / bf16:.2f}x)"
        )
    print(
        f"decode step, bfloat16 against float32: KL mean {kl.mean().item():.4f} max "
        f"{kl.max().item():.4f} nats, max |log-prob gap| of float32's top token {top_gap:.4f}"
    )


if __name__ == "__main__":
    main()
