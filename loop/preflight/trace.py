"""One learner step traced at a world size, with no GPU and no weights: the memory per GPU.

`trace_learner_step` builds the model from its published shape on the meta device, applies
gradient checkpointing and LoRA as `loop.model.policy` does, wraps it in the project's FSDP2
groups (`loop.model.distributed.wrap_fsdp`) on a fake process group of `world_size` ranks
(`FakeStore`: collectives return at once and move nothing), gives it fake storage
(`FakeTensorMode`: tensors with shapes, dtypes and byte counts but no data), and runs one
forward, backward and AdamW step of a `seq_len` rollout (the trainer's stress-test rollout:
the last 90% output) through the learner's own path: the body's hidden states, the chunked
LM head (`logprobs_from_hidden`, `logprob_chunk_size`), the config's policy loss, the
Learner's optimizer, fused as on a GPU, its states already made (the step traced is a run's
second or later: the first has no AdamW states beside its forward and backward). torch's
`FSDPMemTracker` records the peak of live tensor bytes by kind. A full fine-tuning in one
process is what the trainer runs there, a plain model: torch's `MemTracker` traces it, no
FSDP (whose reduce-scatter holds float32 copies of a group's gradients no single GPU makes).

What this is and is not:
- The fake tensors live on the CPU device: torch's fake CUDA tensors need a CUDA build. The
  byte counts are the same on either device; what the trace cannot see is the CUDA context
  (~0.5-1 GiB), allocator fragmentation (reserved but unallocated blocks) and kernel
  workspaces (cuBLAS, flash attention): loop/preflight/plan.py adds `MARGIN_GIB` for those.
- The peak is `torch.cuda.max_memory_allocated`'s counterpart: benchmarks/README.md lists the
  trace beside the peaks measured on an H200 (Qwen2.5-0.5B and 7B full fine-tuning, 7B and
  32B LoRA with and without gradient checkpointing, 8K-32K tokens: within 1%).
- The LM head runs over every position, not only the output rows as the learner's does (which
  rows are output is data, which fake tensors do not have): the chunk's logits, the peak's
  part above the body, are the same size either way.
- transformers keeps a (T, T) causal mask for any fake input (it cannot read that the mask is
  all ones); `_unpadded_attention` drops it as the real step does.
- LoRA in one process is traced as a one-rank FSDP2 model (torch's plain `MemTracker` cannot
  track a model with frozen parameters); FSDP's gathered copy of the parameters, which a
  single process does not have, is then left out of the total (the adapter's reduce-scatter
  buffers are small).
- The fake process group is global state: `run_trace` runs the trace in a subprocess
  (`python -m loop.preflight.trace '[JSON, ...]'`), so the caller's process stays clean.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

from loop.learner.batch import collate
from loop.learner.learner import Learner
from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden
from loop.learner.objective import policy_loss
from loop.learner.settings import LearnerSettings
from loop.learner.stress import stress_rollout
from loop.model.distributed import wrap_fsdp
from loop.model.policy import DTYPES, LoraSettings, policy_from_model


@dataclass(frozen=True)
class TraceRequest:
    """What to trace: a model shape (`loop.preflight.shapes`) and the config's settings."""

    shape: dict[str, Any]
    world_size: int
    seq_len: int
    dtype: str = "bfloat16"
    lora_rank: int | None = 16  # None: full fine-tuning
    lora_alpha: int = 32
    gradient_checkpointing: bool = True
    logprob_chunk_size: int = 1024
    attn_implementation: str = "sdpa"


@dataclass(frozen=True)
class TraceResult:
    """Peak bytes per learner GPU, by kind (FSDPMemTracker's categories), and the counts."""

    peak_bytes: int  # what one learner GPU holds at the step's peak
    by_kind: dict[str, int]  # sharded params, gathered params, activations, optimizer state ...
    parameters: int  # every weight of the model, unsharded
    trainable: int  # the trainable ones (the LoRA adapter, or every weight)
    world_size: int


class _Tokenizer:
    """What the stress rollout and the Learner read of a tokenizer: a pad id and one id."""

    pad_token_id = 0

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        return {"input_ids": [1]}


@contextlib.contextmanager
def _unpadded_attention() -> Iterator[None]:
    """transformers drops an all-ones attention mask for SDPA's causal kernel (no (T, T) mask),
    but takes every fake tensor for one being traced and keeps the mask: a (T, T) tensor of
    3 bytes an entry (3 GiB at 32K tokens) that the real step never holds. The traced rollout
    is one unpadded sequence, so the mask is dropped here as transformers drops it there."""
    from transformers import masking_utils

    ignore = masking_utils._ignore_causal_mask_sdpa

    def unpadded(padding_mask: Any, q_length: int, kv_length: int, *args: Any, **kw: Any) -> bool:
        local = kw.get("local_attention_size", args[2] if len(args) > 2 else None)
        return q_length == kv_length and (local is None or kv_length < local)

    masking_utils._ignore_causal_mask_sdpa = unpadded
    try:
        yield
    finally:
        masking_utils._ignore_causal_mask_sdpa = ignore


# MemTracker's kinds under FSDPMemTracker's names (one process: its parameters and gradients
# are whole, as a one-rank FSDP model's "sharded" ones)
PLAIN_KINDS = {"Parameter": "Sharded Param", "Gradient": "Sharded Grad", "Optstate": "OptState"}


class _Forward(torch.nn.Module):
    """The traced forward as one module's call: torch's plain MemTracker refuses a module
    called twice outside any other (the chunked LM head), and takes it inside one."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, loss: Callable[[], torch.Tensor]) -> torch.Tensor:
        return loss()


def _with_optimizer_state(learner: Learner) -> None:
    """The Learner's AdamW as on a GPU, fused (one kernel per group, no temporaries; the
    foreach kernels a CPU runs hold a copy of the states' size), with its states made: AdamW
    makes them at its first step, and every later step's forward and backward run beside them
    (Qwen2.5-0.5B's full fine-tuning peaks in the LM head's backward with the states held).
    One step on zero gradients makes them, so the traced step is a later one."""
    settings = learner.settings
    learner.optimizer = torch.optim.AdamW(
        learner.params, lr=settings.lr, weight_decay=settings.weight_decay, fused=True
    )
    for param in learner.params:
        param.grad = torch.zeros_like(param)
    learner.optimizer.step()
    learner.optimizer.zero_grad(set_to_none=True)


def trace_learner_step(request: TraceRequest) -> TraceResult:
    """Trace one learner step (call in a fresh process: it joins a fake process group)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.testing._internal.distributed.fake_pg import FakeStore
    from transformers import Qwen2Config, Qwen2ForCausalLM

    r = request
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=r.world_size)
    config = Qwen2Config(**r.shape)
    config._attn_implementation = r.attn_implementation
    with torch.device("meta"):
        model: Any = Qwen2ForCausalLM(config)
    model.to(DTYPES[r.dtype])
    parameters = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    lora = LoraSettings(rank=r.lora_rank, alpha=r.lora_alpha) if r.lora_rank else None
    policy = policy_from_model(
        model,
        _Tokenizer(),
        torch.device("cpu"),
        lora=lora,
        gradient_checkpointing=r.gradient_checkpointing,
    )
    plain = r.world_size == 1 and lora is None  # one process, no FSDP: MemTracker can track it
    root = None if plain else wrap_fsdp(policy.model)
    settings = LearnerSettings(lr=1e-5, weight_decay=0.0, logprob_chunk_size=r.logprob_chunk_size)
    sample = stress_rollout(r.seq_len, _Tokenizer(), values=False, reference=False)
    batch = collate([sample], _Tokenizer.pad_token_id, policy.device)

    def loss() -> torch.Tensor:
        hidden = last_hidden_state(policy.model, batch.input_ids, batch.attention_mask)
        logprobs = logprobs_from_hidden(
            policy.model,
            hidden,
            batch.input_ids,
            chunk_size=r.logprob_chunk_size,
            temperature=1.0,  # every position: picking the output rows is data-dependent
        )
        return policy_loss(batch, logprobs, settings).loss.sum()

    with FakeTensorMode(allow_non_fake_inputs=True), _unpadded_attention():
        policy.model.to_empty(device="cpu")
        if root is None:  # to_empty gave each of a tied pair its own storage (FSDP keeps one)
            policy.model.tie_weights()
        learner = Learner(policy, settings)
        trainable = sum(p.numel() for p in learner.params)  # a DTensor counts its whole size
        _with_optimizer_state(learner)
        if root is None:
            tracker: Any = MemTracker()
            tracker.track_external(policy.model, learner.optimizer)
        else:
            tracker = FSDPMemTracker(mod=root, optm=learner.optimizer)
        with tracker:
            (_Forward(policy.model)(loss) if root is None else loss()).backward()
            learner.optimizer.step()
        peak = tracker.get_tracker_snapshot("peak")
    dist.destroy_process_group()
    kinds = next(iter(peak.values()))
    by_kind = {str(k.value if hasattr(k, "value") else k): int(v) for k, v in kinds.items()}
    by_kind = {PLAIN_KINDS.get(k, k): v for k, v in by_kind.items()}
    total = by_kind.pop("Total")
    if r.world_size == 1:  # one process has no gathered copy beside its (whole) parameters
        total -= by_kind.pop("Unsharded Param", 0)
    return TraceResult(total, by_kind, parameters, trainable, r.world_size)


def run_trace(request: TraceRequest, timeout_s: float = 600.0) -> TraceResult:
    """`trace_learner_step` in a subprocess; a failure is a RuntimeError with its last line."""
    return run_traces([request], timeout_s)[0]


def run_traces(requests: list[TraceRequest], timeout_s: float = 600.0) -> list[TraceResult]:
    """Several traces in one subprocess, in turn (one start-up: imports are most of a tiny
    trace's time)."""
    done = subprocess.run(
        [sys.executable, "-m", "loop.preflight.trace", json.dumps([asdict(r) for r in requests])],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) != len(requests):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the memory trace failed: {last}")
    return [TraceResult(**json.loads(line)) for line in lines]


if __name__ == "__main__":
    for asked in json.loads(sys.argv[1]):
        print(json.dumps(asdict(trace_learner_step(TraceRequest(**asked)))), flush=True)
