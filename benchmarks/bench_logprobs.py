"""Peak memory and time of the chunked log-probs against the naive full-logits computation.

    python benchmarks/bench_logprobs.py [--tokens 4096 8192 16384] [--layers 2] [--full-ft]
        [--methods naive chunked body] [--threads 1] [--repeats 1]

`loop.learner.logprobs.token_logprobs` ("chunked": LM head, log-softmax and gather over chunks of
`--chunk-size` positions, each chunk recomputed in the backward pass) against
`token_logprobs_naive` ("naive": the model's full (1, T, V) logits, then log-softmax and
gather), on the real SmolLM2-135M (vocabulary 49,152, float32, CPU) with a LoRA adapter (r 16,
all linear layers: the trainer's default; `--full-ft` trains every weight instead). "body" is
the transformer body alone (its last hidden state, no LM head): the floor under both methods.
One sequence of T random token ids; "forward" is a no-grad pass (the old log-probs),
"forward+backward" the pass plus `backward()` of the sum of the log-probs (a training step
without the optimizer).

Depth: by default only the first `--layers 2` of the model's 30 decoder layers are kept (the
real embedding, final norm and LM head stay). The methods run the same body, and the full
body's attention, quadratic in T, would take hours at 16K tokens on 2 CPU cores; what they
differ in is the vocabulary-sized part, which the shallow model keeps whole. So the memory the
chunking saves is the same with 30 layers, but the time ratios here overstate the LM head's
share: with the full body both times grow by the same amount (about 15 times the "body"
column) and their ratio moves towards 1. `--layers 30` measures the full model.

Memory (honestly, for a CPU process): tracemalloc does not see torch's allocations, so each
measurement runs in a fresh subprocess that loads the model, warms up with the same method at
256 tokens, reads its resident set size (VmRSS in /proc/self/status), resets the kernel's
peak-RSS counter (writing 5 to /proc/self/clear_refs, Linux >= 4.0) and runs the measured pass.
"peak" is the peak RSS during the pass (VmHWM) minus the RSS before it: the extra memory the
pass held at its worst, every intermediate tensor included, plus allocator slack (glibc keeps
some freed small blocks, so figures move by a few tens of MiB between runs; tensors above
32 MiB are mmapped and returned at once). The model and the input are not counted. A fresh
process per measurement keeps one measurement's freed-but-kept memory out of the next.

Time: the CPU time of the same pass (`time.process_time`), with one torch thread by default.
The machine is shared: wall time mostly measures the neighbours' load (it moved by 2-3x between
runs), while the CPU time of one thread measures the work (cache and memory-bandwidth contention
remain). `--repeats N` adds timed passes and keeps the fastest. The methods run back to back
for each (T, pass), and the ratios (chunked / naive) come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m"
WARMUP_TOKENS = 256
METHODS = ("naive", "chunked", "body")


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """In this (fresh) process: load, warm up, one measured pass, then timing repeats."""
    import gc

    import torch

    from loop.learner.logprobs import token_logprobs, token_logprobs_naive
    from loop.model.policy import LoraSettings, load_policy

    torch.manual_seed(0)
    policy = load_policy(MODEL, lora=None if args.full_ft else LoraSettings(rank=16))
    model = policy.model
    body = (model.get_base_model() if hasattr(model, "get_base_model") else model).model
    body.layers = body.layers[: args.layers]  # keep the first `layers` decoder layers
    body.config.num_hidden_layers = len(body.layers)
    vocab = int(body.config.vocab_size)
    model.train()

    def compute(ids: torch.Tensor) -> torch.Tensor:
        if args.method == "chunked":
            return token_logprobs(model, ids, chunk_size=args.chunk_size)
        if args.method == "naive":
            return token_logprobs_naive(model, ids)
        return body(input_ids=ids, use_cache=False).last_hidden_state  # the floor: no LM head

    def run(tokens: int) -> tuple[float, float]:
        ids = torch.randint(0, vocab, (1, tokens))
        model.zero_grad(set_to_none=True)
        wall, cpu = time.perf_counter(), time.process_time()
        if args.mode == "forward":
            with torch.no_grad():
                compute(ids)
        else:
            compute(ids).sum().backward()
        return time.perf_counter() - wall, time.process_time() - cpu

    if args.threads:
        torch.set_num_threads(args.threads)
    run(WARMUP_TOKENS)
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    seconds, cpu_seconds = run(args.tokens)
    peak = _status_kib("VmHWM")
    for _ in range(args.repeats - 1):
        again = run(args.tokens)
        seconds, cpu_seconds = min(seconds, again[0]), min(cpu_seconds, again[1])
    return {"peak_mib": (peak - before) / 1024, "seconds": seconds, "cpu_seconds": cpu_seconds}


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def run_one(args: argparse.Namespace, tokens: int, mode: str, method: str) -> dict[str, Any]:
    """One measurement in a fresh subprocess; a killed or failed one is reported, not raised."""
    command = [
        sys.executable, __file__, "--_measure", "--_method", method, "--_mode", mode,
        "--_tokens", str(tokens), "--layers", str(args.layers), "--repeats", str(args.repeats),
        "--threads", str(args.threads),
        "--chunk-size", str(args.chunk_size), *(["--full-ft"] if args.full_ft else []),
    ]  # fmt: skip
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        why = f"signal {-done.returncode}" if done.returncode < 0 else done.stderr.strip()[-300:]
        return {"error": why}
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    """Measure every (T, pass, method), then print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 8192, 16384])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers kept (of 30)")
    parser.add_argument("--chunk-size", type=int, default=1024, help="positions per chunk")
    parser.add_argument("--full-ft", action="store_true", help="no LoRA: train every weight")
    parser.add_argument("--modes", nargs="+", default=["forward", "forward+backward"])
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--repeats", type=int, default=1, help="timed passes (the fastest)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_method", help=argparse.SUPPRESS)
    parser.add_argument("--_mode", help=argparse.SUPPRESS)
    parser.add_argument("--_tokens", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        args.method, args.mode, args.tokens = args._method, args._mode, args._tokens
        print(json.dumps(measure(args)))
        return 0
    import torch

    threads = args.threads or torch.get_num_threads()
    print(
        f"# {MODEL}, float32, CPU ({threads} torch threads), first {args.layers} "
        f"decoder layers, {'full fine-tuning' if args.full_ft else 'LoRA r16'}, "
        f"chunk {args.chunk_size}, fastest of {args.repeats} timed pass(es)",
        flush=True,
    )
    print(_header(args.methods), flush=True)
    rows = []
    for tokens in args.tokens:
        for mode in args.modes:
            results = {method: run_one(args, tokens, mode, method) for method in args.methods}
            rows.append(_row(tokens, mode, results))
            print(rows[-1], flush=True)
    print()
    print("\n".join([_header(args.methods), *rows]))
    return 0


def _header(methods: list[str]) -> str:
    names = [f"{m} peak" for m in methods] + [f"{m} CPU time" for m in methods]
    if {"naive", "chunked"} <= set(methods):
        names[len(methods) : len(methods)] = ["peak ratio"]
        names.append("time ratio")
    columns = ["tokens", "pass", "logits T x V x 4 B", *names]
    return "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"


def _row(tokens: int, mode: str, results: dict[str, dict[str, Any]]) -> str:
    logits_mib = tokens * 49152 * 4 / 2**20
    peaks = [r.get("error") or f"{r['peak_mib']:,.0f} MiB" for r in results.values()]
    times = ["-" if "error" in r else f"{r['cpu_seconds']:.1f} s" for r in results.values()]
    if "naive" in results and "chunked" in results:
        naive, chunked = results["naive"], results["chunked"]
        ok = "error" not in naive and "error" not in chunked
        peaks.append(f"{chunked['peak_mib'] / naive['peak_mib']:.3f}" if ok else "-")
        times.append(f"{chunked['cpu_seconds'] / naive['cpu_seconds']:.2f}" if ok else "-")
    cells = [f"{tokens:,}", mode, f"{logits_mib:,.0f} MiB", *peaks, *times]
    return "| " + " | ".join(cells) + " |"


if __name__ == "__main__":
    sys.exit(main())
