"""`python train.py --config X --preflight`: trace, plan, print; 0 for a plan, 2 for refusals.

Prints the plan section by section (stdout), then one line per refusal (stderr, each naming the
config keys). The learner's memory comes from one traced step (`loop.preflight.trace`, in a
subprocess); everything else is arithmetic (`loop.preflight.plan`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from loop.config import RunConfig
from loop.preflight.plan import (
    Plan,
    learner_world_size,
    plan_disk,
    plan_files,
    plan_hf_engine,
    plan_host,
    plan_learners,
    plan_servers,
    plan_timeouts,
)
from loop.preflight.shapes import GIB, GPU_GIB, shape_of
from loop.preflight.trace import TraceRequest, TraceResult, run_trace


def gpu_memory_gib(gpu: str) -> float:
    """GiB of the named GPU type (`GPU_GIB`), or of this machine's first GPU for 'auto'."""
    if gpu == "auto":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(
                f"--gpu auto needs a GPU on this machine: name one ({', '.join(GPU_GIB)})"
            )
        return torch.cuda.get_device_properties(0).total_memory / GIB
    if gpu not in GPU_GIB:
        raise ValueError(f"--gpu {gpu!r}: use one of {', '.join(GPU_GIB)}, or auto")
    return GPU_GIB[gpu]


def trace_request(config: RunConfig, shape: dict, world_size: int) -> TraceRequest:
    """The traced step of `config`'s learner: its model, LoRA, checkpointing and lengths."""
    m, t = config.model, config.train
    return TraceRequest(
        shape=shape,
        world_size=world_size,
        seq_len=t.max_seq_len,
        dtype=m.dtype,
        lora_rank=m.lora_rank or None,
        lora_alpha=m.lora_alpha,
        gradient_checkpointing=m.gradient_checkpointing,
        logprob_chunk_size=t.logprob_chunk_size,
        attn_implementation="sdpa",
    )


def make_plan(
    config: RunConfig,
    *,
    world_size: int | None = None,
    gpu: str = "h100",
    trace: Callable[[TraceRequest], TraceResult] | None = None,
) -> Plan:
    """The whole plan of `config` (`trace`: `run_trace` unless given; tests pass a stub)."""
    gpu_gib = gpu_memory_gib(gpu)
    shape = shape_of(config.model.name)
    n = learner_world_size(config, world_size)
    result = (trace or run_trace)(trace_request(config, shape, n))
    plan = Plan()
    if config.model.load_in_4bit:
        plan.add("learners", "model.load_in_4bit: traced with a bfloat16 base (an over-estimate)")
    plan_learners(plan, config, result, gpu, gpu_gib)
    plan_servers(plan, config, shape, result, gpu, gpu_gib)
    plan_hf_engine(plan, config, shape, result, gpu, gpu_gib)
    kernels = plan_host(plan, config, shape)
    plan_files(plan, config, kernels, n)
    plan_disk(plan, config, result)
    plan_timeouts(plan, config, n)
    return plan


def preflight(config: RunConfig, *, world_size: int | None = None, gpu: str = "h100") -> int:
    """Plan `config`, print it; 0 when nothing is refused, else 2 (one stderr line each)."""
    plan = make_plan(config, world_size=world_size, gpu=gpu)
    print(f"preflight of {config.name} ({config.model.name})")
    for title, lines in plan.sections.items():
        print(f"{title}:")
        for line in lines:
            print(f"  {line}")
    for refusal in plan.refusals:
        print(f"train.py: preflight refuses: {refusal}", file=sys.stderr)
    if not plan.refusals:
        print("preflight: nothing refused")
    return 2 if plan.refusals else 0
