"""The preflight's plan of a config: learners, servers, host memory, open files, disk and
timeouts, each a few printable lines, and the refusals (one line each, naming the keys).

Pure arithmetic on the config, the model's published shape (`loop.preflight.shapes`) and one
traced learner step (`loop.preflight.trace`); the only look at this machine is its open-file
limit and the free space where checkpoints go. The allowances below are estimates with their
source; docs/preflight.md says what the plan cannot see.
"""

from __future__ import annotations

import resource
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from loop.config import RunConfig
from loop.generators.hf.memory import EngineMemory, engine_memory
from loop.preflight.shapes import GIB, head_dim, kv_bytes_per_token, parameter_count
from loop.preflight.trace import TraceResult
from tasks import suite_class

# Beyond the traced tensors, per GPU: the CUDA context and kernel workspaces (cuBLAS, flash
# attention), 0.5-1 GiB per process (PyTorch's CUDA-semantics notes); we take the upper end.
CONTEXT_GIB = 1.0
# Allocator fragmentation, reserved but not allocated: an allowance, not a measurement (the
# trace matches `max_memory_allocated`, not `max_memory_reserved`, which was not recorded).
FRAGMENTATION = 0.05
KERNEL_PSS_MIB = 51.8  # one warm sandbox kernel (benchmarks/README.md, "The sandbox")
# one AppWorld engine after 21 tasks (`python benchmarks/bench_appworld.py`: 289 MiB RSS on the
# package's small root; the official root's databases make it larger)
ENGINE_RSS_MIB = 289
FDS_PER_SANDBOX = 12  # pipes, the bridge socket, /proc and cgroup files of one warm kernel
FDS_PER_SERVER = 64  # allowance: a started server's pipes, log and HTTP connections
FDS_PER_RANK = 256  # allowance: a learner's libraries, CUDA/NCCL handles, logs, sockets
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Plan:
    """Printable sections (title -> lines) and the refusals, one line each."""

    sections: dict[str, list[str]] = field(default_factory=dict)
    refusals: list[str] = field(default_factory=list)

    def add(self, title: str, line: str) -> None:
        """Append `line` to the section `title`."""
        self.sections.setdefault(title, []).append(line)


def gib(n_bytes: float) -> str:
    """`n_bytes` as GiB with one decimal."""
    return f"{n_bytes / GIB:.1f} GiB"


def with_margin(n_bytes: float) -> float:
    """Traced bytes plus what the trace cannot see (CONTEXT_GIB, FRAGMENTATION)."""
    return n_bytes * (1 + FRAGMENTATION) + CONTEXT_GIB * GIB


def learner_world_size(config: RunConfig, given: int | None) -> int:
    """The learner processes: `given` (--world-size), else what the config implies. Started
    servers on `generator.devices` of one node leave the learners the GPUs below them (0..n-1,
    as loop/checks.py requires): the 32B config's servers on 4-7 mean 4 learners."""
    if given is not None:
        return given
    gen = config.generator
    if gen.backend == "vllm_server" and not gen.servers and gen.devices:
        return max(1, min(gen.devices))
    return 1


def started_servers(config: RunConfig) -> list[list[int]]:
    """The GPUs of each server rank 0 starts ([] when the config names running servers)."""
    gen = config.generator
    if gen.backend != "vllm_server" or gen.servers:
        return []
    tp, devices = gen.tensor_parallel_size, gen.devices or list(range(gen.tensor_parallel_size))
    return [devices[i * tp : (i + 1) * tp] for i in range(gen.num_servers)]


def on_cpu(config: RunConfig) -> bool:
    """A run on the CPU (the rehearsal at toy size): no GPU memory to plan or refuse."""
    return config.model.device == "cpu"


def plan_learners(
    plan: Plan, config: RunConfig, trace: TraceResult, gpu: str, gpu_gib: float
) -> None:
    """Each rank's GPU and its traced peak at `train.max_seq_len`; refuse what does not fit."""
    title, need = "learners", with_margin(trace.peak_bytes)
    n, kinds = trace.world_size, trace.by_kind
    where = f"GPU(s) {', '.join(map(str, range(n)))} ({gpu}, {gpu_gib:.1f} GiB each)"
    plan.add(
        title, f"{n} rank(s) on " + ("the CPU (model.device: cpu)" if on_cpu(config) else where)
    )
    plan.add(
        title,
        f"model: {trace.parameters / 1e9:.2f} B parameters, "
        f"{trace.trainable / 1e6:.1f} M trainable",
    )
    parts = ", ".join(f"{k.lower()} {gib(v)}" for k, v in kinds.items() if v >= GIB / 20)
    plan.add(
        title,
        f"per GPU at train.max_seq_len={config.train.max_seq_len}: traced peak "
        f"{gib(trace.peak_bytes)} ({parts}); with the margin {gib(need)}",
    )
    if need > gpu_gib * GIB and not on_cpu(config):
        plan.refusals.append(
            f"learner memory {gib(need)} per GPU at train.max_seq_len="
            f"{config.train.max_seq_len} exceeds the {gpu} GPU's {gpu_gib:.1f} GiB: lower "
            "train.max_seq_len, turn on model.gradient_checkpointing or model.lora_rank, or "
            "add learners (--world-size)"
        )


def plan_servers(
    plan: Plan, config: RunConfig, shape: dict, trace: TraceResult, gpu: str, gpu_gib: float
) -> None:
    """vllm_server: each server's GPUs and memory (weights / TP + KV for max_model_len against
    gpu_memory_utilization x the GPU), and the context a turn may reach."""
    gen, title = config.generator, "servers"
    if gen.backend != "vllm_server":
        return
    if config.agent.max_context_tokens > gen.max_model_len:
        plan.refusals.append(
            f"agent.max_context_tokens={config.agent.max_context_tokens} > "
            f"generator.max_model_len={gen.max_model_len}: every turn past "
            f"{gen.max_model_len} tokens is an HTTP 400 from the server; set "
            f"generator.max_model_len={config.agent.max_context_tokens}"
        )
    servers = started_servers(config)
    if not servers:
        plan.add(title, f"running servers: {', '.join(gen.servers)} (not planned here)")
        return
    tp, dtype_bytes = gen.tensor_parallel_size, DTYPE_BYTES[config.model.dtype]
    weights = trace.parameters * dtype_bytes / tp
    kv_seq = kv_bytes_per_token(shape, dtype_bytes) * gen.max_model_len / tp
    budget = gen.gpu_memory_utilization * gpu_gib * GIB
    room = budget - weights - CONTEXT_GIB * GIB
    for devices in servers:
        plan.add(
            title,
            f"server on {'cores' if on_cpu(config) else 'GPU(s)'} {devices} (TP {tp}): "
            f"weights {gib(weights)} + KV of "
            f"one {gen.max_model_len}-token sequence {gib(kv_seq)} per GPU, within "
            f"gpu_memory_utilization {gen.gpu_memory_utilization} x {gpu_gib:.1f} = "
            f"{gib(budget)}: room for {max(0, int(room // kv_seq))} such sequences",
        )
    if room < kv_seq:
        plan.refusals.append(
            f"a server's weights {gib(weights)} + KV for generator.max_model_len="
            f"{gen.max_model_len} {gib(kv_seq)} per GPU exceed generator."
            f"gpu_memory_utilization={gen.gpu_memory_utilization} x {gpu_gib:.1f} GiB ({gpu})"
        )
    learner_gpus = set(range(trace.world_size))
    if not on_cpu(config) and any(learner_gpus & set(d) for d in servers):
        learner = with_margin(trace.peak_bytes)
        need = learner + budget
        plan.add(
            title,
            f"a server shares learner GPU(s): learner {gib(learner)} + server "
            f"{gib(budget)} = {gib(need)} of {gpu_gib:.1f} GiB",
        )
        if need > gpu_gib * GIB:
            plan.refusals.append(
                f"a learner ({gib(learner)}) and a server "
                f"(generator.gpu_memory_utilization={gen.gpu_memory_utilization}: {gib(budget)})"
                f" share a {gpu} GPU of {gpu_gib:.1f} GiB: lower either, or set "
                "generator.devices to other GPUs"
            )


def hf_engine_memory(
    shape: dict,
    dtype_bytes: int,
    *,
    rows: int,
    max_context_tokens: int,
    kv_cache_bytes: int,
    kv_rows_bytes: int | None = None,
) -> EngineMemory:
    """The hf engine's memory for `shape` by the engine's own rule (loop/generators/hf/
    memory.py): the slots, the KV store and the largest transient."""
    return engine_memory(
        layers=shape["num_hidden_layers"],
        kv_heads=shape["num_key_value_heads"],
        heads=shape["num_attention_heads"],
        head_dim=head_dim(shape),
        intermediate=shape["intermediate_size"],
        dtype_bytes=dtype_bytes,
        max_rows=rows,
        max_context_tokens=max_context_tokens,
        kv_cache_bytes=kv_cache_bytes,
        kv_rows_bytes=kv_rows_bytes,
    )


def plan_hf_engine(
    plan: Plan, config: RunConfig, shape: dict, trace: TraceResult, gpu: str, gpu_gib: float
) -> None:
    """hf: the engine's memory by its own rule (`hf_engine_memory`): `max_batch_size` row
    slots at the capacity the longest row gets (up to `agent.max_context_tokens`), the KV store
    and the largest transient, beside the resident model and optimizer."""
    gen = config.generator
    if gen.backend != "hf":
        return
    rows, length = gen.max_batch_size, config.agent.max_context_tokens
    store = int((gen.kv_cache_mb or 0) * 2**20)  # None: a quarter of what is free, so it fits
    bound = None if gen.kv_rows_mb is None else int(gen.kv_rows_mb * 2**20)
    engine = hf_engine_memory(
        shape,
        DTYPE_BYTES[config.model.dtype],
        rows=rows,
        max_context_tokens=length,
        kv_cache_bytes=store,
        kv_rows_bytes=bound,
    )
    kinds = trace.by_kind
    resident = sum(kinds.get(k, 0) for k in ("Sharded Param", "Buffer", "OptState"))
    need = with_margin(resident + engine.peak)
    plan.add(
        "hf engine",
        f"{rows} rows (generator.max_batch_size) x {length} tokens "
        f"(agent.max_context_tokens): slots {gib(engine.slots)}; KV store {gib(store)}; "
        f"largest transient {gib(engine.transient)} (a slot growth under active rows "
        f"{gib(engine.growth)}); resident model and optimizer {gib(resident)}; with the "
        f"margin {gib(need)} of {gpu_gib:.1f} GiB",
    )
    if need > gpu_gib * GIB:
        plan.refusals.append(
            f"the hf engine for generator.max_batch_size={rows} rows at "
            f"agent.max_context_tokens={length} ({gib(engine.peak)}: slots {gib(engine.slots)}, "
            f"KV store, the largest transient {gib(engine.transient)}) and the model "
            f"({gib(resident)}) need {gib(need)}, over the {gpu} GPU's {gpu_gib:.1f} GiB: "
            f"lower either"
        )


def plan_host(plan: Plan, config: RunConfig, shape: dict) -> int:
    """Host RAM: the warm kernels, or the engines of a suite that runs its own (loop/build.py
    gives those `sandbox.pool_size`), and rank 0's read of the whole model; returns the larger
    of the two counts (for the open files)."""
    weights = parameter_count(shape) * DTYPE_BYTES[config.model.dtype]
    each = config.sandbox.memory_mb * 2**20
    if suite_class(config.suite).uses_sandbox:
        count = min(config.sandbox.pool_size, config.train.max_concurrent_rollouts)
        what = "warm kernels (min(sandbox.pool_size, train.max_concurrent_rollouts))"
        measured = KERNEL_PSS_MIB
    else:  # the suite's own engines, `sandbox.pool_size` of them (loop/build.py)
        count, what, measured = (
            config.sandbox.pool_size,
            "suite engines (sandbox.pool_size)",
            (ENGINE_RSS_MIB),
        )
    plan.add(
        "host",
        f"{count} {what}: {gib(count * measured * 2**20)} at {measured} MiB each (measured), at "
        f"most {gib(count * each)} (sandbox.memory_mb={config.sandbox.memory_mb} each)",
    )
    plan.add("host", f"rank 0 reads the whole model once: {gib(weights)}")
    return count


def plan_files(plan: Plan, config: RunConfig, kernels: int, world_size: int) -> None:
    """Open files against RLIMIT_NOFILE: refused only above the hard limit (the trainer
    raises the soft limit to the hard one)."""
    servers = len(started_servers(config))
    need = kernels * FDS_PER_SANDBOX + servers * FDS_PER_SERVER + FDS_PER_RANK
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    plan.add(
        "open files",
        f"rank 0 about {need} ({kernels} kernels x {FDS_PER_SANDBOX}, "
        f"{servers} servers x {FDS_PER_SERVER}, {FDS_PER_RANK} its own; ranks 1..: "
        f"{FDS_PER_RANK} each); limit here: soft {soft}, hard {limit}",
    )
    if hard != resource.RLIM_INFINITY and need > hard:
        plan.refusals.append(
            f"about {need} open files needed (sandbox.pool_size / train.max_concurrent_rollouts"
            f" = {kernels} kernels) but the hard RLIMIT_NOFILE is {hard}: raise it (ulimit -Hn)"
        )


def plan_disk(plan: Plan, config: RunConfig, trace: TraceResult) -> None:
    """`train.keep_checkpoints` checkpoints and every `train.keep_every`-th (adapter or weights
    + AdamW's two moments) against the free space at `output_dir` here (a note: the run's
    machine may differ)."""
    lora = config.model.lora_rank > 0
    each = trace.trainable * (4 if lora else DTYPE_BYTES[config.model.dtype]) * 3
    t = config.train
    kept = t.keep_checkpoints + (t.iterations // t.keep_every if t.keep_every else 0)
    total = each * kept
    where = Path(config.output_dir).absolute()
    while not where.exists():
        where = where.parent
    free = shutil.disk_usage(where).free
    short = "  (more than is free here)" if total > free else ""
    plan.add(
        "disk",
        f"{kept} checkpoints (train.keep_checkpoints, and every train.keep_every-th of "
        f"train.iterations) x "
        f"{gib(each)} ({'adapter' if lora else 'weights'} + AdamW moments) = {gib(total)};"
        f" free at {config.output_dir}: {gib(free)}{short}",
    )


def plan_timeouts(plan: Plan, config: RunConfig, world_size: int) -> None:
    """The timeouts, shortest first, and the orders that must hold: a cell within a rollout;
    with several learners, a rollout within their wait for rank 0's rollouts. Rank 0's server
    start within the others' collective wait is loop/checks.py's rule (`check_run`, which
    `train.py --preflight` runs first): printed here, refused there."""
    t, gen = config.train, config.generator
    named = {
        "sandbox.cell_timeout_s": config.sandbox.cell_timeout_s,
        "agent.rollout_timeout_s": config.agent.rollout_timeout_s,
    }
    orders = [("sandbox.cell_timeout_s", "agent.rollout_timeout_s")]
    if world_size > 1:
        named["train.collective_timeout_s"] = t.collective_timeout_s
        named["train.rollout_wait_timeout_s"] = t.rollout_wait_timeout_s
        orders.append(("agent.rollout_timeout_s", "train.rollout_wait_timeout_s"))
        if started_servers(config):
            named["generator.server_start_timeout_s"] = gen.server_start_timeout_s
    for key, value in sorted(named.items(), key=lambda kv: kv[1]):
        plan.add("timeouts", f"{key} = {value:g} s")
    for short, long in orders:
        if named[short] >= named[long]:
            plan.refusals.append(
                f"{short}={named[short]:g} must be below {long}={named[long]:g}: "
                "the longer wait never ends first"
            )
