"""The preflight's memory estimates beside the GPU measurements of benchmarks/README.md.

    python benchmarks/bench_preflight.py            (about 6 minutes on 2 CPU cores, no GPU)
    python benchmarks/bench_preflight.py --tiny     (the script itself, on the tiny shape)

For each learner row of "On a GPU" (bench_gpu.py's `learner`, `learner32b` and `peak`
sections: one rollout of T tokens, gradient checkpointing unless the row says not, log-prob
chunks of 1,024, LoRA r16 on all linear layers or full fine-tuning, one process) it traces the
same step the preflight traces (loop/preflight/trace.py: fake tensors, FSDPMemTracker or, for
one process's full fine-tuning, MemTracker) and prints the traced peak beside the measured
`torch.cuda.max_memory_allocated`, with their ratio. The margin the preflight adds for what the
trace cannot see (loop/preflight/plan.py) is not included: the measurement does not see it
either. Then the hf engine's rows (bench_gpu.py `engine_long`: 32 rows of 8,192 + 16 and
12,288 + 16 tokens, every key in its row slot): the engine's rule that `plan_hf_engine` uses
(its slots, the largest transient, the resident weights) against the measured peak; the rule
plans a growth of every row's slots under active rows, which these first prompts never make.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loop.preflight.plan import hf_engine_memory  # noqa: E402
from loop.preflight.shapes import GIB, SHAPES, parameter_count  # noqa: E402
from loop.preflight.trace import TraceRequest, run_traces  # noqa: E402

# (model, train, tokens) -> measured step peak GiB: benchmarks/README.md, "On a GPU" (an H200).
# LoRA rows: each adapted layer as one product (loop/model/lora.py), measured 2026-11-28 (the
# LoRA rows before it were measured with peft's own forward, which the trace no longer takes).
MEASURED = {
    ("Qwen/Qwen2.5-0.5B-Instruct", "full", 8192): 5.8,
    ("Qwen/Qwen2.5-0.5B-Instruct", "full", 16384): 6.2,
    ("Qwen/Qwen2.5-0.5B-Instruct", "full", 32768): 7.0,
    ("Qwen/Qwen2.5-7B-Instruct", "LoRA", 8192): 18.68,
    ("Qwen/Qwen2.5-7B-Instruct", "LoRA", 16384): 22.18,
    ("Qwen/Qwen2.5-7B-Instruct", "LoRA, no checkpointing", 8192): 62.1,  # 2026-11-30
    ("Qwen/Qwen2.5-7B-Instruct", "full", 8192): 58.0,
    ("Qwen/Qwen2.5-7B-Instruct", "full", 16384): 60.4,
    ("Qwen/Qwen2.5-7B-Instruct", "full", 32768): 65.3,
    ("Qwen/Qwen2.5-32B-Instruct", "LoRA", 32768): 95.69,
}
# The hf engine's rows, measured (bench_gpu.py `engine_long`, 2026-11-30; kv_cache_mb 0): rows,
# prompt tokens, new tokens -> peak GiB
ENGINE_MEASURED = {(32, 8192, 16): 30.36, (32, 12288, 16): 38.2}


def main() -> None:
    """Trace every row in one subprocess and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny shape, two short rows")
    tiny = parser.parse_args().tiny
    rows = [("tiny", "LoRA", 256), ("tiny", "full", 256)] if tiny else list(MEASURED)
    requests = [
        TraceRequest(
            SHAPES[model],
            1,
            tokens,
            lora_rank=16 if train.startswith("LoRA") else None,
            gradient_checkpointing="no checkpointing" not in train,
        )
        for model, train, tokens in rows
    ]
    results = run_traces(requests, timeout_s=3600)
    print(
        "| model | train | tokens | measured step peak GiB | preflight's traced peak GiB | ratio |"
    )
    print("|---|---|---|---|---|---|")
    for (model, train, tokens), result in zip(rows, results, strict=True):
        traced = result.peak_bytes / GIB
        measured = MEASURED.get((model, train, tokens))
        ratio = f"{traced / measured:.2f}" if measured else ""
        name = model.split("/")[-1].removesuffix("-Instruct")
        print(f"| {name} | {train} | {tokens:,} | {measured or ''} | {traced:.1f} | {ratio} |")
    shape = SHAPES["tiny" if tiny else "Qwen/Qwen2.5-7B-Instruct"]
    weights = parameter_count(shape) * 2 / GIB  # bfloat16, as the plan counts
    print("\n| hf engine rows | tokens | slots GiB | transient GiB | rule + weights GiB |"
          " measured GiB | ratio |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for (count, tokens, new), measured in ENGINE_MEASURED.items():
        rule = hf_engine_memory(
            shape, 2, rows=count, max_context_tokens=tokens + new, kv_cache_bytes=0
        )
        plan = rule.peak / GIB + weights
        print(
            f"| {count} | {tokens:,} + {new} | {rule.slots / GIB:.1f} | "
            f"{rule.transient / GIB:.1f} | {plan:.1f} | {measured} | {plan / measured:.2f} |"
        )


if __name__ == "__main__":
    main()
