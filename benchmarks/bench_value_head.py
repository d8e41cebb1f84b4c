"""What the value head adds to the learner's peak memory: policy alone against policy + value head.

    python benchmarks/bench_value_head.py [--tokens 4096] [--layers 30] [--repeats 3]

The learned-critic methods (`train.advantage: gae | verlog`, loop/critic.py) put a 3-layer MLP
on the policy's last hidden state and compute its values in the same forward pass as the
log-probs, chunked like them. This measures one learner step's forward and backward (the
learner's own `stress_test`: a rollout of `--tokens` tokens, the last 90% trained, the loss the
run would use) on the real SmolLM2-135M (float32, CPU, LoRA r16 on all linear layers, the
trainer's default), once with `train.advantage: loo` ("policy") and once with `gae`
("policy + value": policy loss + value loss, the head at the paper's proportions of the hidden
size, 576 -> 346 -> 230 -> 1).

Memory is measured as in bench_logprobs.py: each measurement runs in a fresh subprocess that
loads the model, warms up at 256 tokens, resets the kernel's peak-RSS counter and runs the
measured step; "peak" is the peak RSS during the step minus the RSS before it (allocator slack
included, so figures move by a few MiB between runs). The two configurations alternate
`--repeats` times and the ratio of the medians is printed.

The "policy + value" process also lists, exactly, every tensor that the value head's part of
the step creates (its forward over all chunks, the value loss, and their backward, traced with
a TorchDispatchMode): the largest one and whether any has a vocabulary-sized dimension.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m"
WARMUP_TOKENS = 256


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """In this (fresh) process: build the learner, warm up, one measured step."""
    import gc

    import torch

    from loop.config import load_config
    from loop.policy import LoraSettings, load_policy
    from loop.trainer import build_learner

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    policy = load_policy(MODEL, lora=LoraSettings(rank=16))
    body = policy.model.get_base_model().model
    body.layers = body.layers[: args.layers]
    body.config.num_hidden_layers = len(body.layers)
    config = load_config(None, [f"train.advantage={args.advantage}"])
    learner = build_learner(config, policy)
    learner.stress_test(WARMUP_TOKENS)
    gc.collect()
    before = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # peak RSS := current RSS
    learner.stress_test(args.tokens)
    peak = _status_kib("VmHWM")
    result: dict[str, Any] = {"peak_mib": (peak - before) / 1024}
    if learner.critic is not None:
        result |= trace_value_head(learner, args.tokens, int(body.config.vocab_size))
    return result


def trace_value_head(learner: Any, tokens: int, vocab: int) -> dict[str, Any]:
    """Every tensor the value head's forward, loss and backward create, on real hidden states."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from loop.logprobs import values_from_hidden
    from loop.losses import clipped_value_loss

    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for item in tree_flatten(out)[0]:
                if isinstance(item, torch.Tensor):
                    self.shapes.append(tuple(item.shape))
            return out

    ids = torch.randint(0, vocab, (1, tokens))
    with torch.no_grad():
        hidden = learner._hidden(learner._collate([_sample(tokens, ids[0])]))
    mask = torch.ones(1, tokens, dtype=torch.bool)
    with Shapes() as mode:
        values = values_from_hidden(learner.critic.head, hidden, chunk_size=learner.chunk_size)
        loss = clipped_value_loss(values, torch.zeros_like(values), torch.ones_like(values), mask)
        loss.loss.sum().backward()
    largest = max(mode.shapes, key=lambda s: _numel(s))
    return {
        "value_tensors": len(mode.shapes),
        "largest_value_tensor": list(largest),
        "largest_value_tensor_mib": _numel(largest) * 4 / 2**20,
        "vocab_sized": any(vocab in shape for shape in mode.shapes),
    }


def _sample(tokens: int, ids: Any) -> Any:
    import torch

    from loop.batch import Sample

    out = torch.ones(tokens, dtype=torch.bool)
    return Sample(ids, out, torch.zeros(tokens), torch.zeros(tokens, dtype=torch.long),
                  torch.zeros(tokens))  # fmt: skip


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}: this benchmark needs Linux")


def run_one(args: argparse.Namespace, advantage: str) -> dict[str, Any]:
    """One measurement in a fresh subprocess."""
    command = [
        sys.executable, __file__, "--_measure", "--_advantage", advantage,
        "--tokens", str(args.tokens), "--layers", str(args.layers),
        "--threads", str(args.threads),
    ]  # fmt: skip
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"measurement failed: {done.stderr.strip()[-500:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    """Alternate the two configurations, then print the peaks and their ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=30, help="decoder layers kept (of 30)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--_measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_advantage", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._measure:
        args.advantage = args._advantage
        print(json.dumps(measure(args)))
        return 0
    print(f"# {MODEL}, float32, CPU, {args.layers} decoder layers, LoRA r16, "
          f"{args.tokens} tokens, one learner step forward+backward", flush=True)  # fmt: skip
    peaks: dict[str, list[float]] = {"loo": [], "gae": []}
    traced: dict[str, Any] = {}
    for _ in range(args.repeats):
        for advantage in peaks:
            result = run_one(args, advantage)
            peaks[advantage].append(result["peak_mib"])
            traced |= {k: v for k, v in result.items() if k != "peak_mib"}
            print(f"  {advantage}: {result['peak_mib']:,.1f} MiB", flush=True)
    policy, value = statistics.median(peaks["loo"]), statistics.median(peaks["gae"])
    print("| learner step | peak (median) | runs |\n|---|---|---|")
    print(f"| policy | {policy:,.1f} MiB | {', '.join(f'{p:,.0f}' for p in peaks['loo'])} |")
    print(f"| policy + value | {value:,.1f} MiB | {', '.join(f'{p:,.0f}' for p in peaks['gae'])} |")
    print(f"value head adds {value - policy:+,.1f} MiB: ratio {value / policy:.4f} "
          f"({(value / policy - 1) * 100:+.2f} %)")  # fmt: skip
    print(f"value head's tensors: {traced['value_tensors']}, largest "
          f"{traced['largest_value_tensor']} ({traced['largest_value_tensor_mib']:.2f} MiB), "
          f"any vocabulary-sized dimension: {traced['vocab_sized']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
