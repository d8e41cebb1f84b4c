"""The `vllm` generator: an in-process vLLM engine (`AsyncLLM`), fed token-id prompts only.

Token in, token out. Each call sends the prompt as token ids (`tokens_input`, never text) and
gets back the ids vLLM sampled, as sampled: detokenisation is off (`detokenize=False`), so no
text is produced or stripped, and the stop id that ended the turn is the last id (vLLM keeps a
`stop_token_ids` match in `CompletionOutput.token_ids`; only stop *strings* would be cut).
Only `SamplingParams.stop_token_ids` end a turn: the model's own EOS is ignored unless listed
(`ignore_eos=True`, as the `hf` generator does), so every backend stops on the same set.

What the log-probs are. The engine runs with `logprobs_mode="processed_logprobs"` and each
request asks for `logprobs=0`, i.e. only the sampled token's entry. vLLM then reports
`log_softmax` of the logits after temperature and top-p/top-k masking, computed in float32
(`Sampler.sample` -> `TopKTopPSampler.forward_cpu`): exactly `log q(token)` under the
distribution it sampled from, renormalised over the nucleus. At temperature 0 (greedy) vLLM
substitutes temperature 1, so the value is the model's untempered log-prob. (The default
mode, "raw_logprobs", would give the untempered log-prob at every temperature.)

LoRA: `load_adapter(path)` makes every later request carry a `LoRARequest` for that directory
under a fresh integer id, so vLLM loads the new weights even when the trainer overwrites the
same directory each iteration; requests already running keep the adapter they started with.

The engine core and its worker run in child processes (vLLM's multiprocessing client),
started without the launcher's variables and on `devices` when given
(loop/generators/vllm/launch_env.py: under torchrun they would otherwise hang in their own
rendezvous, or take the learners' GPUs), and tied to this process's life
(loop/generators/vllm/lifeline.py: killed, even by SIGKILL, it takes them with it; they would
otherwise live on holding the model); `close()` shuts them down and reaps them. The
first `generate` binds the engine's output handler to the running event loop: use one event
loop per generator. vLLM is imported inside the class, so this module imports without it
(`pip install 'loop-trainer[vllm]'`).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import multiprocessing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loop.config_types import one_line
from loop.generators.base import (
    FinishReason,
    Generation,
    GeneratorError,
    GeneratorStats,
    SamplingParams,
)
from loop.generators.vllm.launch_env import launcher_free_environ
from loop.generators.vllm.lifeline import Lifeline, child_pids

log = logging.getLogger(__name__)


class VLLMGenerator:
    """An in-process vLLM engine behind the `Generator` interface (see the module docstring)."""

    name = "vllm"
    shares_weights = False  # the engine holds its own copy; adapters are loaded

    def __init__(
        self,
        model: str,
        *,
        dtype: str = "float32",
        max_model_len: int = 8192,
        gpu_memory_utilization: float = 0.4,
        enable_lora: bool = False,
        max_lora_rank: int = 16,
        seed: int = 0,
        enforce_eager: bool = True,
        devices: Sequence[int] = (),
        **engine_kwargs: Any,
    ):
        """Start the engine (tens of seconds on CPU); failures become `GeneratorError`.

        `gpu_memory_utilization` also sizes the KV cache of the CPU build. `devices`: the GPUs
        the engine's workers use (`CUDA_VISIBLE_DEVICES` for its processes; empty: those this
        process sees). `engine_kwargs` go to `vllm.AsyncEngineArgs` unchanged and override the
        defaults set here.
        """
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise GeneratorError(
                f"the vllm generator needs vLLM (pip install 'loop-trainer[vllm]'): {exc}"
            ) from None
        self.model = model
        self.enable_lora = enable_lora
        self.max_lora_rank = max_lora_rank
        settings: dict[str, Any] = {
            "model": model,
            "dtype": dtype,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": gpu_memory_utilization,
            "enable_lora": enable_lora,
            "max_lora_rank": max_lora_rank,
            "seed": seed,
            "enforce_eager": enforce_eager,
            # rollouts share the system prompt and extend their own previous turn: both reused
            "enable_prefix_caching": True,
            "logprobs_mode": "processed_logprobs",  # log q(token) after temperature and top-p
            "max_logprobs": 1,  # we only ever ask for the sampled token's log-prob
            "generation_config": "vllm",  # no sampling defaults from generation_config.json
            "disable_log_stats": True,
        }
        settings.update(stale_gguf_override(model))
        if _on_cpu():
            settings.update(whole_prompts(max_model_len))
        settings.update(engine_kwargs)
        try:
            before = child_pids()
            with launcher_free_environ(devices):
                self._engine: Any = AsyncLLM.from_engine_args(AsyncEngineArgs(**settings))
            self._lifeline = Lifeline(child_pids() - before)  # they end when we are killed
        except Exception as exc:
            raise GeneratorError(
                f"vLLM engine failed to start ({model}): {one_line(exc, typed=True)}"
            ) from exc
        self._request_ids = itertools.count()
        self._adapter_ids = itertools.count(1)  # vLLM LoRA ids must be >= 1
        self._lora_request: Any = None

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """Sample one continuation of `prompt_token_ids` (`messages` is ignored)."""
        from vllm.inputs import tokens_input

        if self._engine is None:
            raise GeneratorError("vllm generator is closed")
        if not prompt_token_ids:
            raise GeneratorError("empty prompt: at least one token id is needed")
        request_id = f"loop-{next(self._request_ids)}"
        final = None
        try:
            async for output in self._engine.generate(
                tokens_input([int(t) for t in prompt_token_ids]),
                _vllm_sampling_params(params),
                request_id,
                lora_request=self._lora_request,
            ):
                final = output  # FINAL_ONLY: one output, when the request has finished
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise GeneratorError(f"vLLM request failed: {one_line(exc, typed=True)}") from exc
        if final is None or not final.outputs:
            raise GeneratorError(f"vLLM returned no output for request {request_id}")
        return _to_generation(final, params)

    @property
    def version(self) -> str:
        """The loaded adapter's name ("adapter-<k>"), or "base" without one."""
        return self._lora_request.lora_name if self._lora_request is not None else "base"

    def load_adapter(self, path: Path | None) -> None:
        """Sample with the LoRA adapter saved in `path` from the next request on (None: base)."""
        if path is None:
            self._lora_request = None
            return
        if not self.enable_lora:
            raise ValueError("load_adapter(path) needs a vllm generator with enable_lora=True")
        config_file = Path(path) / "adapter_config.json"
        if not config_file.is_file():
            raise ValueError(f"no LoRA adapter in {path} (adapter_config.json missing)")
        rank = json.loads(config_file.read_text()).get("r")
        if isinstance(rank, int) and rank > self.max_lora_rank:
            raise ValueError(f"adapter {path} has rank {rank} > max_lora_rank {self.max_lora_rank}")
        from vllm.lora.request import LoRARequest

        adapter_id = next(self._adapter_ids)
        self._lora_request = LoRARequest(
            lora_name=f"adapter-{adapter_id}", lora_int_id=adapter_id, lora_path=str(path)
        )

    def stats(self) -> GeneratorStats:
        """No counters: vLLM's engine keeps its own."""
        return GeneratorStats()

    def release_memory(self) -> None:
        """Nothing to free: the engine's memory is its own, sized by gpu_memory_utilization."""

    async def close(self, timeout_s: float = 30.0) -> None:
        """Shut the engine's processes down (waiting up to `timeout_s`) and reap them.

        Blocks the event loop for the few seconds vLLM's teardown takes (~6 s on CPU). Only
        Python's own multiprocessing resource tracker stays (one per process, reused)."""
        engine, self._engine = self._engine, None
        if engine is None:
            return
        engine.shutdown(timeout=timeout_s)
        await asyncio.sleep(0)  # let the cancelled output-handler task finish
        multiprocessing.active_children()  # joins (reaps) children vLLM had to kill
        self._lifeline.release()


def _vllm_sampling_params(params: SamplingParams) -> Any:
    """Our `SamplingParams` as vLLM's: token ids only, the sampled id's log-prob, final output."""
    from vllm import SamplingParams as VLLMSamplingParams
    from vllm.sampling_params import RequestOutputKind

    return VLLMSamplingParams(
        max_tokens=params.max_new_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        seed=params.seed,
        stop_token_ids=list(params.stop_token_ids),
        ignore_eos=True,  # only our stop ids end a turn
        logprobs=0,  # the sampled token's log-prob only
        detokenize=False,  # ids are the output; no text to decode or strip
        skip_special_tokens=False,
        output_kind=RequestOutputKind.FINAL_ONLY,
    )


def _to_generation(final: Any, params: SamplingParams) -> Generation:
    """vLLM's finished `RequestOutput` as a `Generation`, checking it is what we asked for."""
    output = final.outputs[0]
    token_ids = [int(t) for t in output.token_ids]
    if output.finish_reason not in ("stop", "length"):
        raise GeneratorError(f"vLLM request ended with finish_reason={output.finish_reason!r}")
    finish_reason: FinishReason = output.finish_reason
    if finish_reason == "stop" and (not token_ids or token_ids[-1] not in params.stop_token_ids):
        raise GeneratorError(f"vLLM stopped without a stop id: last ids {token_ids[-3:]}")
    if output.logprobs is None or len(output.logprobs) != len(token_ids):
        raise GeneratorError(f"vLLM gave no log-prob for some of the {len(token_ids)} sampled ids")
    logprobs = [
        float(entry[token].logprob) for entry, token in zip(output.logprobs, token_ids, strict=True)
    ]
    cached = final.num_cached_tokens or 0
    return Generation(token_ids, logprobs, finish_reason, cached_tokens=cached)


def stale_gguf_override(model: str) -> dict[str, Any]:
    """Hide a GGUF `quantization_config` left in a converted model's config.json.

    A directory converted from GGUF (e.g. an early `smollm2-135m` cache) holds dequantised
    safetensors but may still declare `quant_method: gguf`, which vLLM refuses. Only when the
    directory has no .gguf file is the key overridden away; anything else is left to vLLM.
    """
    directory = Path(model)
    config_file = directory / "config.json"
    if not config_file.is_file() or any(directory.glob("*.gguf")):
        return {}
    try:
        quantization = json.loads(config_file.read_text()).get("quantization_config")
    except (ValueError, AttributeError):  # not a JSON object: vLLM will say so
        return {}
    if not isinstance(quantization, dict) or quantization.get("quant_method") != "gguf":
        return {}
    log.warning("%s: ignoring a stale GGUF quantization_config (weights are safetensors)", model)
    return {"hf_overrides": {"quantization_config": None}}


def whole_prompts(max_model_len: int) -> dict[str, Any]:
    """Engine settings of vLLM's CPU build: no prompt's prefill split across engine steps.

    A split prefill discards the sample of its partial step and rewinds the request's seeded
    generator (`set_offset`), which a CPU `torch.Generator` does not support: the step fails
    ("CPU Generator does not use offset") and with it every request in the batch, which the
    trainer's seeded rollouts hit as soon as enough of them arrive together. vLLM makes the
    same change on CPU itself for MLA models (vllm/platforms/cpu.py): chunked prefill off, and
    a step budget that holds the longest prompt."""
    return {"enable_chunked_prefill": False, "max_num_batched_tokens": max(max_model_len, 2048)}


def _on_cpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())
