"""What the value head adds to the learner's peak memory: policy alone against policy + value head.

    python benchmarks/bench_value_head.py [--tokens 4096] [--layers 30] [--threads 2]

The learned-critic methods (`train.advantage: gae | verlog`, loop/learner/critic.py) put a 3-layer
MLP on the policy's last hidden state and compute its values in the same forward pass as the
log-probs, chunked like them. This measures one learner step's forward and backward (the
learner's own `stress_test`: one rollout of `--tokens` tokens, the last 90% trained, with the
loss the run would use) on the real SmolLM2-135M (float32, CPU, LoRA r16 on all linear layers,
the trainer's default, no gradient checkpointing), built once with `train.advantage: loo`
("policy": the clipped policy loss) and once with `gae` ("policy + value": policy loss + value
loss; the head at the paper's proportions of the hidden size, 576 -> 346 -> 230 -> 1).

Memory, exactly: every tensor storage that an operation creates during the step is counted
from its allocation until it is freed (a TorchDispatchMode sees each op's outputs; a weakref
finalizer on the storage sees it freed), and "peak" is the largest total alive at once. The
model's weights, which exist before the step, are not counted; the gradients of the trainable
weights and of the head, made during the step, are. This is the memory the step's tensors
need, without allocator slack; the peak RSS of a CPU process moved by gigabytes between two
identical runs here (another process's load, glibc's arenas), far more than the head's share.

The value head's part alone (its forward over all chunks, the value loss and their backward on
real hidden states) is traced too: its largest tensor, and whether any tensor it creates has a
vocabulary-sized dimension.
"""

from __future__ import annotations

import argparse
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

MODEL = "smollm2-135m"
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's loop/


class LiveTensors(TorchDispatchMode):
    """Bytes of the tensor storages created inside the mode and still alive; their peak."""

    def __init__(self, exclude: set[int]):
        super().__init__()
        self.exclude = exclude  # data pointers of storages that existed before (the weights)
        self.alive: dict[int, int] = {}
        self.live = self.peak = 0
        self.shapes: list[tuple[int, ...]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor) and item.device.type == "cpu":
                self.shapes.append(tuple(item.shape))
                self._track(item.untyped_storage())
        return out

    def _track(self, storage: Any) -> None:
        key = storage.data_ptr()
        if key == 0 or key in self.alive or key in self.exclude:
            return
        size = storage.nbytes()
        self.alive[key] = size
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self.alive.pop(key, 0)


def build(advantage: str, layers: int) -> tuple[Any, Any]:
    """The policy (first `layers` decoder layers) and its learner for `advantage`."""
    from loop.config import load_config
    from loop.model.policy import LoraSettings, load_policy
    from loop.trainer import build_learner

    torch.manual_seed(0)
    policy = load_policy(MODEL, lora=LoraSettings(rank=16))
    body = policy.model.get_base_model().model
    body.layers = body.layers[:layers]
    body.config.num_hidden_layers = len(body.layers)
    return policy, build_learner(load_config(None, [f"train.advantage={advantage}"]), policy)


def step_peak(advantage: str, tokens: int, layers: int) -> tuple[float, float]:
    """Peak MiB of the tensors one learner step creates, and the step's wall time."""
    policy, learner = build(advantage, layers)
    learner.stress_test(256)  # warm-up
    weights = {t.untyped_storage().data_ptr() for t in policy.model.state_dict().values()}
    started = time.perf_counter()
    with LiveTensors(weights) as mode:
        learner.stress_test(tokens)
    return mode.peak / 2**20, time.perf_counter() - started


def value_head_part(tokens: int, layers: int) -> dict[str, Any]:
    """Every tensor the value head's forward, loss and backward create on real hidden states."""
    from loop.algo.losses import clipped_value_loss
    from loop.learner.batch import Sample
    from loop.learner.logprobs import values_from_hidden

    policy, learner = build("gae", layers)
    vocab = int(policy.model.config.vocab_size)
    ids = torch.randint(0, vocab, (tokens,))
    zeros = torch.zeros(tokens)
    sample = Sample(ids, torch.ones(tokens, dtype=torch.bool), zeros, zeros.long(), zeros)
    with torch.no_grad():
        hidden = learner._hidden(learner._collate([sample]))
    mask = torch.ones(1, tokens, dtype=torch.bool)
    with LiveTensors({hidden.untyped_storage().data_ptr()}) as mode:
        values = values_from_hidden(learner.critic.head, hidden, chunk_size=learner.chunk_size)
        loss = clipped_value_loss(values, torch.zeros_like(values), torch.ones_like(values), mask)
        loss.loss.sum().backward()
    largest = max(mode.shapes, key=lambda s: torch.Size(s).numel())
    return {
        "tensors": len(mode.shapes),
        "largest": list(largest),
        "peak_mib": mode.peak / 2**20,
        "vocab_sized": any(vocab in shape for shape in mode.shapes),
        "vocab": vocab,
    }


def main() -> int:
    """Both learner steps, the value head's part alone, and the ratio."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=30, help="decoder layers kept (of 30)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {MODEL}, float32, CPU, {args.layers} decoder layers, LoRA r16, {args.tokens} "
          "tokens, one learner step forward+backward", flush=True)  # fmt: skip
    policy, policy_s = step_peak("loo", args.tokens, args.layers)
    print(f"  policy: {policy:,.1f} MiB ({policy_s:.0f} s)", flush=True)
    value, value_s = step_peak("gae", args.tokens, args.layers)
    print(f"  policy + value: {value:,.1f} MiB ({value_s:.0f} s)", flush=True)
    part = value_head_part(args.tokens, args.layers)
    print("| learner step | peak of the step's tensors |\n|---|---|")
    print(f"| policy (train.advantage loo) | {policy:,.1f} MiB |")
    print(f"| policy + value (train.advantage gae) | {value:,.1f} MiB |")
    print(f"value head adds {value - policy:+,.2f} MiB: ratio {value / policy:.4f} "
          f"({(value / policy - 1) * 100:+.2f} %)")  # fmt: skip
    print(f"value head's own part: {part['tensors']} tensors, peak {part['peak_mib']:.2f} MiB, "
          f"largest {part['largest']}, any dimension of the vocabulary's size "
          f"({part['vocab']:,}): {part['vocab_sized']}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
