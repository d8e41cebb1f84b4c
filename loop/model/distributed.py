"""Multi-process helpers: every function is a no-op (or the identity) in a single process.

The trainer calls these at its edges; with one process nothing here touches torch.distributed.

Several learner processes are started by a launcher that sets the usual environment (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), either of

    torchrun --nproc-per-node 2 train.py --config configs/<name>.yaml
    accelerate launch --multi_gpu --num_processes 2 train.py --config configs/<name>.yaml

(`--multi_gpu` is what makes accelerate start several processes, on CPU-only machines too;
without it, and without an `accelerate config`, it starts one.)

`init_from_env` then joins the process group (nccl on GPUs, one GPU per process chosen by
`LOCAL_RANK`; gloo on CPU) and `shard_model` shards the policy with FSDP2, PyTorch's
`fully_shard`, the engine under accelerate's `fsdp_version: 2`. We call it directly rather than
through `Accelerator.prepare` because accelerate (1.15) turns FSDP on only for GPU-type
processes (CPU processes get plain data parallelism, so the 2-process CPU test could not
exercise sharding), and because `prepare` wants to own the optimizer and the backward call,
which live in loop/learner/learner.py.

The wrapping is close to accelerate's FSDP2 auto-wrap and the reference's (loop_spec.md section
7.4): one group per decoder layer, resharded after forward; the input and output embeddings in
one group, gathered from the start of forward to the end of backward (tied weights must be one
group; this costs holding one or two vocabulary-sized matrices whole); the body as the root.
Precision, as the reference's (loop_spec.md section 7.4: trainable modules upcast to float32,
the runtime policy "params bf16, gradient reduce fp32"): the LoRA weights are stored, sharded
and stepped by the optimizer in float32 (peft upcasts them: the master weights), gathered and
computed in the model's dtype (`MixedPrecisionPolicy(param_dtype=...)`: a bfloat16 model runs
its adapters in bfloat16, as the vLLM sampler does), and their gradients reduced in float32 and
averaged over processes (the learner scales its loss by the world size to undo the average). A
float32 model is unchanged. One process (no FSDP) computes its float32 adapters in float32.
The reference puts each LoRA module in its own group; here the adapters share their layer's
group, since FSDP2 needs one dtype only among a group's trainable parameters (a bfloat16 frozen
base beside float32 adapters is fine).

Trap: the learner never calls the model's top-level `forward`.
`loop.learner.logprobs.token_logprobs` runs the transformer body and then the LM head on chunks of
positions, so the FSDP root is the body, and the LM head's group (which holds the input embedding
too, so that it joins the body's FSDP tree and tied weights stay one parameter) is used in those
later chunk calls, the "chunked loss" pattern FSDP2 supports. The full forward (`model(...)`) still
works.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from loop.model import aliases

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_groups: dict[str, Any] = {}  # "wait": the gloo group of `wait_for_main`, once initialised


def is_distributed() -> bool:
    """True inside an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """The number of learner processes (1 without a process group)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if is_distributed() else 0


def is_main() -> bool:
    """True on rank 0: the process that collects rollouts, logs and writes checkpoints."""
    return rank() == 0


def all_sum(values: Sequence[float]) -> list[float]:
    """Each of `values` summed over the processes (for metrics that every rank counts locally)."""
    if not is_distributed():
        return [float(v) for v in values]
    total = torch.tensor([float(v) for v in values], dtype=torch.float64, device=_device())
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return [float(v) for v in total.cpu()]


def all_gather_cat(tensor: Tensor) -> Tensor:
    """The 1-D tensors of every process, concatenated in rank order (sizes may differ)."""
    if not is_distributed():
        return tensor
    objects: list[Any] = [None] * world_size()
    dist.all_gather_object(objects, tensor.detach().cpu())
    return torch.cat(objects)


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every process."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def wait_for_main(obj: Any) -> Any:
    """Rank 0's `obj` on every process, after however long rank 0 alone works on it (an
    evaluation, an iteration's rollouts): through the wait group (gloo, the long
    `wait_timeout_s`), not the learners' group, whose short timeout still stops a stuck
    collective."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=_groups.get("wait"))
    return box[0]


def barrier() -> None:
    """Wait for every process."""
    if is_distributed():
        dist.barrier()


def launched_world_size() -> int:
    """The number of learner processes the launcher started (`WORLD_SIZE`), known before
    `init_from_env` joins them; 1 without a launcher."""
    return max(1, int(os.environ.get("WORLD_SIZE", "1")))


def init_from_env(
    *, collective_timeout_s: float = 3600.0, wait_timeout_s: float = 6 * 3600.0
) -> bool:
    """Join the process group a launcher describes in the environment; True when distributed.

    Does nothing (and returns False) without `WORLD_SIZE` > 1, and nothing twice. On a machine
    with CUDA each process takes the GPU `LOCAL_RANK` and talks nccl; on CPU, gloo. Call it
    before the model is loaded, so that `device="cuda"` means this process's GPU.
    Two groups: the learners' (their collectives fail after `collective_timeout_s`) and a gloo
    "wait" group for `wait_for_main` (`wait_timeout_s`, hours: rank 0 alone evaluates and
    collects rollouts meanwhile, which an nccl collective's watchdog would kill at 10 minutes).
    """
    if launched_world_size() <= 1:
        return False
    die_with_launcher()
    if not dist.is_initialized():
        timeout = timedelta(seconds=collective_timeout_s)
        if torch.cuda.is_available():
            local = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(local)
            dist.init_process_group(backend="nccl", timeout=timeout, device_id=local)
        else:
            dist.init_process_group(backend="gloo", timeout=timeout)
        _groups["wait"] = dist.new_group(backend="gloo", timeout=timedelta(seconds=wait_timeout_s))
    return is_distributed()


def die_with_launcher() -> None:
    """End this process when the launcher that started it dies (Linux: PR_SET_PDEATHSIG).

    torchrun starts each worker in a session of its own, so a SIGKILL of the launcher, even of
    its whole process group, leaves the workers training: a killed run goes on writing
    checkpoints beside the rerun that resumes it. The workers' own children (the vLLM engine,
    the sandboxes) already end with them.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the launcher died before the request took effect
        os._exit(1)


def shutdown() -> None:
    """Leave the process group (a no-op without one)."""
    _groups.clear()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def shard_model(model: Any, weights: dict[str, Tensor] | None = None) -> Any:
    """Shard `model` in place with FSDP2 across the process group; the identity in one process.

    `model` is a transformers causal LM or a peft model wrapping one, either loaded on this
    process's device (every rank holds the whole model until it is sharded), or, the lean way,
    built with its parameters on the meta device (`load_policy(..., empty=True)`) with rank 0
    passing the whole state dict as `weights` (on the CPU; the other ranks pass None): then each
    rank allocates only its shards and receives them from rank 0 one tensor at a time, so host
    memory holds the model about once (rank 0's copy) instead of once per rank, and no GPU holds
    it whole. Loaded models get rank 0's trainable parameters broadcast first (`fully_shard`
    keeps each rank's own slice of its local tensor, so the ranks must agree; a seeded LoRA init
    already does). Afterwards every parameter is a DTensor holding this rank's shard: build the
    optimizer after this call, and gather with `full_state_dict` to save.
    """
    if not is_distributed():
        return model
    if any(not p.is_floating_point() for p in model.parameters()):
        raise ValueError("a 4-bit base cannot be sharded here: use one process or bfloat16")
    empty = any(p.is_meta for p in model.parameters())
    if empty and is_main() and weights is None:
        raise ValueError("shard_model: a model on the meta device needs rank 0's weights")
    if not empty:
        _broadcast_trainable(model)
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()} if empty else {}
    wrap_fsdp(model)
    if empty:
        _receive_shards(model, weights or {}, buffers)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()  # the whole model this GPU held before sharding goes back
    return model


def wrap_fsdp(model: Any) -> nn.Module:
    """The FSDP2 groups of `shard_model`, on the current process group; returns the root (the
    body). No weights move: the loop/preflight trace wraps a meta-device model with it.

    One group per decoder layer, resharded after forward; both embeddings in one group kept
    gathered from forward to backward; the body as the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    causal_lm = aliases.causal_lm(model)
    body = causal_lm.base_model  # what token_logprobs runs: the FSDP root
    embed, head = causal_lm.get_input_embeddings(), causal_lm.get_output_embeddings()
    if body is causal_lm or embed is None or head is None:
        raise ValueError(f"cannot shard {type(causal_lm).__name__}: not a *ForCausalLM model")
    # Computed in the model's dtype (the embedding's: the base's storage), reduced in float32;
    # float32 LoRA weights stay float32 in their shards, where the optimizer steps them.
    policy = MixedPrecisionPolicy(param_dtype=embed.weight.dtype, reduce_dtype=torch.float32)
    for layer in _decoder_layers(causal_lm, body):
        fully_shard(layer, mp_policy=policy)
    # One group for both embeddings: tied weights must be (one parameter, one group), and the
    # embedding, run inside the body, puts the head's group under the body's root.
    fully_shard([embed, head], mp_policy=policy, reshard_after_forward=False)
    fully_shard(body, mp_policy=policy)
    return body


def full_state_dict(model: Any, *, trainable_only: bool = False) -> dict[str, Tensor]:
    """The whole (unsharded) state dict on the CPU on rank 0; `{}` on the other ranks.

    Collective under FSDP: every rank must call it. `trainable_only` keeps only parameters with
    `requires_grad` (the LoRA adapter), which is all a LoRA checkpoint or a vLLM sync needs.
    Keys are the model's own (`model.state_dict()`), so peft's `save_pretrained(state_dict=)`
    and `set_peft_model_state_dict` understand them.
    """
    # Tied weights (one tensor under two names) are kept once, under their first name, as
    # Hugging Face saves them.
    first: dict[int, str] = {}
    for name, value in model.state_dict(keep_vars=True).items():
        first.setdefault(id(value), name)
    trainable = {id(p) for p in model.parameters() if p.requires_grad}
    keep = {name for key, name in first.items() if not trainable_only or key in trainable}
    if not is_distributed():
        state = model.state_dict()
        return {name: state[name].detach().cpu().clone() for name in state if name in keep}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(
        full_state_dict=True, cpu_offload=True, ignore_frozen_params=trainable_only
    )
    gathered = get_model_state_dict(model, options=options)  # {} off rank 0
    return {k: v for k, v in gathered.items() if k in keep and isinstance(v, Tensor)}


def load_full_state_dict(model: Any, state: dict[str, Tensor]) -> None:
    """Load whole tensors (some or all of the model's, by its own keys) into `model`.

    Under FSDP every rank passes the same tensors and keeps its shard of each; in one process
    it is `model.load_state_dict(state, strict=False)`."""
    if not is_distributed():
        model.load_state_dict(state, strict=False)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    options = StateDictOptions(full_state_dict=True, strict=False)
    set_model_state_dict(model, dict[str, Any](state), options=options)


def optimizer_state_dict(model: Any, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """`optimizer.state_dict()`, with FSDP's sharded moments gathered whole to rank 0.

    Collective under FSDP: every rank calls it, rank 0 gets the full state keyed by parameter
    name (the other ranks get `{}`). In one process it is `optimizer.state_dict()` itself, so
    a checkpoint resumes only with the number of processes that wrote it.
    """
    if not is_distributed():
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    state: dict[str, Any] = dict(get_optimizer_state_dict(model, optimizer, options=options))
    return state if is_main() else {}


def load_optimizer_state_dict(
    model: Any, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load what `optimizer_state_dict` returned; under FSDP every rank passes the full state.

    Clears the gradients (torch initialises an empty optimizer's state with one zero-gradient
    step, and skips it when any gradient is present).
    """
    if not is_distributed():
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    optimizer.zero_grad(set_to_none=True)
    options = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(model, optimizer, state, options=options)


def _decoder_layers(causal_lm: Any, body: nn.Module) -> list[nn.Module]:
    """The repeated blocks: transformers' own device-map unit (`_no_split_modules`)."""
    names = set(getattr(causal_lm, "_no_split_modules", None) or ())
    layers = [m for m in body.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot shard {type(causal_lm).__name__}: no decoder layers found "
            f"(_no_split_modules={sorted(names)})"
        )
    return layers


def _receive_shards(
    model: nn.Module, weights: dict[str, Tensor], buffers: dict[str, Tensor]
) -> None:
    """Give a sharded meta-device model storage for its shards and fill them from rank 0.

    One tensor at a time: rank 0 broadcasts it whole and drops its own reference, every rank
    keeps its slice. Rank 0's host copy thus shrinks as the shards fill, and no rank holds more
    than one whole tensor beside its shards."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    device = _device()
    model.to_empty(device=device)  # this rank's shards only
    targets: dict[int, tuple[str, Tensor]] = {}  # tied weights: one tensor, filled once
    for name, value in model.state_dict(keep_vars=True).items():
        targets.setdefault(id(value), (name, value))
    missing = [n for _, (n, _) in targets.items() if n not in weights] if is_main() else []
    if missing := broadcast_object(missing):
        raise ValueError(f"rank 0's weights lack {len(missing)} tensor(s), e.g. {missing[0]}")
    with torch.no_grad():
        for name, buffer in model.named_buffers():  # not all in the state dict: put back
            buffer.copy_(buffers[name])
        for name, target in targets.values():
            if is_main():
                whole = weights[name].to(device, target.dtype)
            else:
                whole = torch.empty(target.shape, dtype=target.dtype, device=device)
            dist.broadcast(whole, src=0)
            if isinstance(target, DTensor):  # this rank's slice, cut locally
                mine = distribute_tensor(whole, target.device_mesh, target.placements,
                                         src_data_rank=None)  # fmt: skip
                target.to_local().copy_(mine.to_local())
            else:
                target.copy_(whole)
            del whole
            weights.pop(name, None)  # rank 0: the caller's dict lets go of the tensor
        weights.clear()  # tied names left over
    # Rank 0's weights drew from the RNG (a seeded LoRA init) and the others' did not.
    torch.set_rng_state(broadcast_object(torch.get_rng_state()))


def _broadcast_trainable(model: nn.Module) -> None:
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                dist.broadcast(param.data, src=0)


def use_device(device: torch.device) -> None:
    """Make `device` this thread's current CUDA device (nothing for a CPU device).

    CUDA's current device is per thread: a worker thread (the overlap's learner, run by
    loop/rollout/ahead.py `off_loop`) starts on cuda:0 whatever the process set, so on ranks
    1.. its index-less tensors and nccl's object collectives would land on another rank's GPU.
    The learner's entry point calls this first (loop/learner/update.py)."""
    if device.type == "cuda":
        torch.cuda.set_device(device)


def _device() -> torch.device:
    """Where collective tensors go: this process's GPU (`LOCAL_RANK`, as `init_from_env` chose
    it, not the calling thread's current device), or the CPU under gloo."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
