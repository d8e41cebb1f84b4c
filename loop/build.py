"""The one place that turns a `RunConfig` into objects: suite, sandbox pool, tokenizer, generator.

Components take plain arguments (STYLE.md habit 5); only this module reads the config to build
them, and only the two CLIs import it: `build_training` makes the `TrainParts` that
`loop.trainer.train` runs on, `build_evaluation` the `EvalParts` of `loop.evaluation.evaluate`.
The `hf` backend loads the policy model (and samples with that very object); `vllm_server`
and `openai` need only the tokenizer on our side, so no second copy of the weights is loaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import logging
import resource
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loop.checks import backend, check_splits, having, sandbox_limits
from loop.config import ConfigError, RunConfig
from loop.config_types import SuiteOptions
from loop.generators.base import Generator, GeneratorError, GeneratorStats
from loop.generators.tokenizer import Tokenizer
from loop.model.aliases import resolve_model
from loop.model.heap import bound_heap
from loop.model.policy import LoraSettings, Policy
from loop.model.recompute import recompute
from loop.parts import TrainParts
from loop.rollout.collect import SandboxPool
from loop.run.rundir import RunDir
from sandbox import KernelPool
from tasks import RunSettings, SuiteSetupError, TaskSuite, suite_for_run

log = logging.getLogger(__name__)


@dataclass
class EvalParts:
    """What `loop.evaluation.evaluate` runs on; `pool` is entered by the evaluation."""

    suite: TaskSuite
    generator: Generator
    tokenizer: Tokenizer
    pool: contextlib.AbstractContextManager[SandboxPool]


def build_suite(config: RunConfig) -> TaskSuite:
    """The task suite named by `config.suite`, from the run's plain values (each suite's
    registry entry takes what it uses, tasks/registry.py). A suite that cannot run here (no
    AppWorld root or venv) is a one-line ConfigError naming the fix."""
    settings = RunSettings(
        seed=config.seed,
        pool_size=config.sandbox.pool_size,
        timeout_s=config.sandbox.cell_timeout_s,
        max_output_chars=config.sandbox.max_output_chars,
        options=suite_options(config),
    )
    try:
        return suite_for_run(config.suite, settings)
    except KeyError as exc:
        raise ConfigError(f"suite: {exc.args[0] if exc.args else config.suite}") from None
    except SuiteSetupError as exc:
        raise ConfigError(f"suite {config.suite}: {exc}") from None


def suite_options(config: RunConfig) -> dict[str, Any]:
    """The suite's own section as plain values: the `SuiteOptions` section named after the
    suite (`openenv:` for suite openenv); none for a suite without one."""
    section = getattr(config, config.suite, None)
    return dataclasses.asdict(section) if isinstance(section, SuiteOptions) else {}


def build_evaluation(config: RunConfig, checkpoint: Path | None = None) -> EvalParts:
    """The suite (splits checked), the generator with `checkpoint` applied, and a sandbox pool
    sized for `eval.max_concurrent_rollouts` (not entered yet)."""
    raise_open_file_limit()
    suite = build_suite(config)
    check_splits(config, suite, training=False)
    generator, tokenizer = build_generator(config, checkpoint)
    size = min(config.sandbox.pool_size, config.eval.max_concurrent_rollouts)
    return EvalParts(suite, generator, tokenizer, build_sandboxes(config, suite, size))


def build_sandboxes(
    config: RunConfig, suite: TaskSuite, size: int
) -> contextlib.AbstractContextManager[SandboxPool]:
    """The pool of `size` sandboxes `suite`'s rollouts run their code in (not entered yet), or
    none for a suite that runs the agent's code itself (`uses_sandbox` False, AppWorld: its
    128 idle kernels would hold ~6.6 GiB and ~1,500 descriptors for nothing)."""
    if suite.uses_sandbox:
        return build_pool(config, size=size)
    reason = f"suite {config.suite} runs the agent's code itself: no sandboxes were started"
    return contextlib.nullcontext(_IdlePool(reason))


def build_pool(config: RunConfig, size: int | None = None) -> KernelPool:
    """A warm pool of sandboxes sized for the run."""
    return KernelPool(
        size=config.sandbox.pool_size if size is None else size,
        timeout_s=config.sandbox.cell_timeout_s,
        max_output_chars=config.sandbox.max_output_chars,
        limits=sandbox_limits(config),
    )


def raise_open_file_limit() -> None:
    """Raise this process's soft open-file limit (RLIMIT_NOFILE) to its hard limit, as vLLM's
    entry point does. Each warm sandbox holds about a dozen descriptors (its pipes, the bridge,
    its scratch files) and a large run keeps hundreds alive (sandbox.pool_size 256 in
    configs/qwen2.5-32b-8gpu.yaml) beside the servers' connections, past the 1,024 a node's
    soft `ulimit -n` often is: sandbox starts would fail with EMFILE. Children (the kernels,
    the servers) inherit the raised limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:  # e.g. macOS, whose hard limit may be unlimited
        log.warning("could not raise the open-file limit from %d to %d: %s", soft, hard, exc)


def build_tokenizer(config: RunConfig) -> Any:
    """The policy's tokenizer (the chat template and the ids the trajectories are made of)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model(config.model.name))


def build_generator(config: RunConfig, checkpoint: Path | None = None) -> tuple[Generator, Any]:
    """The generator and the tokenizer, with `checkpoint` (a LoRA adapter dir, or a checkpoint
    holding one) applied: into the policy a backend shares, else loaded as the backend's
    adapter."""
    name, can = config.generator.backend, backend(config)
    _set_cpu_runtime(config)
    if checkpoint is not None and not can.trains:
        raise ConfigError(
            f"--checkpoint cannot be used with generator.backend {name} (no weights of ours): "
            f"use {having(lambda b: b.trains)}"
        )
    if checkpoint is not None:
        from loop.model.checkpoint import adapter_dir

        checkpoint = adapter_dir(checkpoint)
    policy = None
    if can.shares_weights:
        from loop.model.policy import load_policy

        policy = load_policy(
            config.model.name,
            dtype=config.model.dtype,
            device=config.model.device,
            attn_implementation=config.model.attn_implementation,
        )
        if checkpoint is not None:
            from peft import PeftModel

            policy.model = PeftModel.from_pretrained(policy.model, str(checkpoint))
    tokenizer = policy.tokenizer if policy is not None else build_tokenizer(config)
    generator = BUILDERS[name](config, policy, tokenizer, enable_lora=checkpoint is not None)
    if checkpoint is not None and not can.shares_weights:
        generator.load_adapter(checkpoint)
    return generator, tokenizer


@contextlib.contextmanager
def build_training(config: RunConfig) -> Iterator[TrainParts]:
    """Everything `loop.trainer.train` runs on, with the sandbox pool open; closes it all."""
    import torch

    from loop.model import checkpoint, distributed
    from loop.model.policy import LoraSettings, load_policy

    raise_open_file_limit()
    distributed.init_from_env(  # under torchrun / accelerate launch; before the model loads
        collective_timeout_s=config.train.collective_timeout_s,
        wait_timeout_s=config.train.rollout_wait_timeout_s,
    )
    _set_cpu_runtime(config)
    if config.train.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(config.seed)
    suite = build_suite(config)
    check_splits(config, suite)
    lora = None
    if config.model.lora_rank > 0:
        lora = LoraSettings(
            rank=config.model.lora_rank,
            alpha=config.model.lora_alpha,
            dropout=config.model.lora_dropout,
            target_modules=config.model.lora_target_modules,
        )
    load = functools.partial(
        load_policy,
        config.model.name,
        dtype=config.model.dtype,
        attn_implementation=config.model.attn_implementation,
        lora=lora,
        load_in_4bit=config.model.load_in_4bit,
        gradient_checkpointing=config.model.gradient_checkpointing,
    )
    if distributed.is_distributed():
        if lora is not None:
            checkpoint.check_sharded_lora_loads()  # before a run it could not resume
        # FSDP2, lean: every process builds the model on the meta device, rank 0 alone reads
        # the weights (on the CPU) and sends each process its shards.
        policy = load(device=config.model.device, empty=True)
        weights = load(device="cpu").model.state_dict() if distributed.is_main() else None
        distributed.shard_model(policy.model, weights)
        del weights
    else:
        policy = load(device=config.model.device)
    if config.model.recompute != "none":  # activations (loop/model/recompute.py)
        recompute(policy.model, config.model.recompute)
    # Only rank 0 samples rollouts: one generator and one sandbox pool per run, not per process.
    size = min(config.sandbox.pool_size, config.train.max_concurrent_rollouts)
    generator: Generator = _IdleGenerator()
    pool: contextlib.AbstractContextManager[SandboxPool] = contextlib.nullcontext(
        _IdlePool("only the rank-0 process runs sandboxes")
    )
    if distributed.is_main():
        generator = _training_generator(config, policy, lora)
        pool = build_sandboxes(config, suite, size)
    try:
        with pool as entered:
            yield TrainParts(policy, generator, policy.tokenizer, suite, entered)
    finally:
        _close(generator)
        distributed.shutdown()


def _training_generator(config: RunConfig, policy: Policy, lora: LoraSettings | None) -> Generator:
    """The config's backend on the policy being trained (`loop.checks.check_run` refused a
    backend that cannot train before anything was built)."""
    build = BUILDERS[config.generator.backend]
    return build(config, policy, policy.tokenizer, enable_lora=lora is not None)


def _hf_generator(
    config: RunConfig, policy: Policy | None, tokenizer: Any, *, enable_lora: bool
) -> Generator:
    """Samples with `policy` itself (its adapter, if any, is the policy's)."""
    from loop.generators.hf.generator import HFGenerator

    assert policy is not None  # loaded for a backend that shares weights
    settings = config.generator
    return HFGenerator(
        policy,
        max_batch_size=settings.max_batch_size,
        kv_reuse=settings.kv_reuse,
        kv_cache_mb=settings.kv_cache_mb,
        kv_rows_mb=settings.kv_rows_mb,
        torch_threads=settings.torch_threads,
        max_context_tokens=config.agent.max_context_tokens,
    )


def _vllm_server_generator(
    config: RunConfig, policy: Policy | None, tokenizer: Any, *, enable_lora: bool
) -> Generator:
    """`generator.servers` attached, or `generator.num_servers` started with their devices,
    with LoRA slots when adapters will come."""
    from loop.generators.vllm.process import ServerProcess
    from loop.generators.vllm.server import VLLMServerGenerator

    settings = config.generator
    base_model = settings.served_model or config.model.name
    processes = []
    if not settings.servers:
        on_gpu = config.model.device != "cpu"
        share = (
            settings.tensor_parallel_size
            if on_gpu
            else len(settings.devices) // settings.num_servers
        )
        args = vllm_server_args(config, base_model, enable_lora=enable_lora)
        for index in range(settings.num_servers):
            port = settings.server_port + index if settings.server_port else 0
            devices = settings.devices[index * share : (index + 1) * share]
            log_path = config.run_dir / "servers" / f"server-{index}.log"
            server = ServerProcess(
                args, port=port, log_path=log_path, devices=devices, on_gpu=on_gpu,
                name=f"vLLM server {index}",
            )  # fmt: skip
            processes.append(server)
    # training (a policy to publish) names its adapters with the run's nonce, kept for a resume;
    # an evaluation draws its own, never touching a training run's adapters on a shared server
    nonce = RunDir(config.run_dir).adapter_nonce() if policy is not None else secrets.token_hex(4)
    return VLLMServerGenerator(
        base_model=base_model, adapter_prefix=f"{config.name}-{nonce}", processes=processes,
        urls=settings.servers, start_timeout_s=settings.server_start_timeout_s,
        request_timeout_s=settings.request_timeout_s,
        publish_timeout_s=settings.publish_timeout_s,
        health_timeout_s=settings.health_timeout_s,
        keep_versions=config.train.overlap.max_staleness + 1, tokenizer=tokenizer,
    )  # fmt: skip


def _openai_generator(
    config: RunConfig, policy: Policy | None, tokenizer: Any, *, enable_lora: bool
) -> Generator:
    """A client of the endpoint at `generator.base_url` (evaluation only)."""
    from loop.generators.openai import OpenAIGenerator

    assert config.generator.base_url and config.generator.served_model  # checked by load_config
    return OpenAIGenerator(
        config.generator.base_url,
        config.generator.served_model,
        tokenizer=tokenizer,
        mode=config.generator.openai_mode,
    )


class _Builder(Protocol):
    def __call__(
        self, config: RunConfig, policy: Policy | None, tokenizer: Any, *, enable_lora: bool
    ) -> Generator: ...


# Each `generator.backend` (loop.checks.BACKENDS) to its constructor: the policy where the
# backend shares the learner's weights, the tokenizer, and LoRA slots when adapters will come.
BUILDERS: dict[str, _Builder] = {
    "hf": _hf_generator,
    "vllm_server": _vllm_server_generator,
    "openai": _openai_generator,
}


def vllm_server_args(config: RunConfig, base_model: str, *, enable_lora: bool) -> list[str]:
    """The started servers' arguments: the model and its length, token-exact log-probs of the
    sampling distribution, prefix caching, LoRA slots for the current and the previous version
    (and the S before it that groups collected ahead may still sample,
    `train.overlap.max_staleness`)."""
    from loop.generators.vllm.process import stale_gguf_override, whole_prompts

    settings = config.generator
    model = resolve_model(config.model.name)
    args = [
        "--model", model, "--served-model-name", base_model, "--dtype", config.model.dtype,
        "--max-model-len", str(settings.max_model_len), "--seed", str(config.seed),
        "--gpu-memory-utilization", str(settings.gpu_memory_utilization),
        "--tensor-parallel-size", str(settings.tensor_parallel_size),
        "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", "1", "--generation-config", "vllm", "--uvicorn-log-level", "warning",
        "--enable-prompt-tokens-details",  # cached prompt tokens in each answer's usage
    ]  # fmt: skip
    if config.model.device == "cpu":
        args.append("--enforce-eager")  # no graphs to capture on CPU
        whole = whole_prompts(settings.max_model_len)  # seeded CPU sampling: no split prompt
        args += ["--no-enable-chunked-prefill",
                 "--max-num-batched-tokens", str(whole["max_num_batched_tokens"])]  # fmt: skip
    if enable_lora:  # vLLM's ranks are powers of two from 8 (and 1)
        rank = next(
            r for r in (1, 8, 16, 32, 64, 128, 256, 320, 512) if r >= config.model.lora_rank
        )
        # the versions groups may still sample
        slots = max(2, config.train.overlap.max_staleness + 1)
        args += ["--enable-lora", "--max-lora-rank", str(rank), "--max-loras", str(slots)]
    if overrides := stale_gguf_override(model).get("hf_overrides"):
        args += ["--hf-overrides", json.dumps(overrides)]
    return args + list(settings.server_args)


def _set_cpu_runtime(config: RunConfig) -> None:
    """Cap torch's CPU threads where configured (sandboxes and vLLM's worker share the cores);
    on a CPU, give freed tensors back to the OS (`bound_heap`, loop/model/heap.py): training and
    evaluation alike."""
    if config.model.device == "cpu":
        bound_heap()
    if config.model.torch_threads is not None:
        import torch

        torch.set_num_threads(config.model.torch_threads)


class _IdleGenerator:
    """The generator of a learner process other than rank 0, which never samples."""

    name = "idle"
    shares_weights = False
    version = "idle"

    async def generate(self, *args: Any, **kwargs: Any) -> Any:
        raise GeneratorError("only the rank-0 process samples rollouts")

    def load_adapter(self, path: Path | None) -> None:
        """Nothing to load: this process has no engine."""

    def release_memory(self) -> None:
        """Nothing to free: this process has no engine."""

    def stats(self) -> GeneratorStats:
        """No counters: this process has no engine."""
        return GeneratorStats()

    async def close(self) -> None:
        """Nothing to release."""


class _IdlePool:
    """The sandbox pool where none is started: a learner process other than rank 0, which never
    collects, or a suite that runs the agent's code itself; `reason` says which."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def acquire_async(self) -> Any:
        raise RuntimeError(self.reason)

    async def release_async(self, sandbox: Any) -> None:
        """Nothing was acquired."""


def _close(generator: Generator) -> None:
    """Close a generator from synchronous code (its own event loop may be gone)."""
    import asyncio

    with contextlib.suppress(Exception):  # already closed by the trainer's own loop
        asyncio.run(generator.close())
