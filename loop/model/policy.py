"""The policy: a Hugging Face causal LM and its tokenizer, optionally with LoRA and a 4-bit base.

`load_policy` is the one place that turns a model name and a few settings into the training
model object. The same object is trained by the learner and sampled by the `hf` generator
(exactly one copy of the weights).

    policy = load_policy("smollm2-135m", lora=LoraSettings(rank=16))
    policy.model      # a transformers model, wrapped by peft when `lora` is given
    policy.tokenizer  # always has a pad token (eos when the checkpoint defines none)

What it does, in order: resolve built-in aliases (`loop.model.aliases.resolve_model`), check the
dtype/device, load the tokenizer and the model (4-bit NF4 base through bitsandbytes if asked),
enable non-reentrant gradient checkpointing, then wrap with LoRA. Every bad input is a
one-line `ValueError` (or `RuntimeError` for a missing optional dependency) naming the fix.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from loop.config_types import one_line
from loop.model.aliases import is_peft_model, resolve_model
from loop.model.lora import fuse_lora_products
from loop.model.norms import fuse_rms_norms

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICES = ("cpu", "cuda", "auto")


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter on the base model (peft)."""

    rank: int = 16  # r: the rank of the low-rank update B @ A
    alpha: int = 32  # the update is scaled by alpha / rank
    dropout: float = 0.0  # dropout on the adapter input
    target_modules: str | tuple[str, ...] = "all-linear"  # peft names; all-linear skips lm_head

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha <= 0 or not 0 <= self.dropout < 1:
            raise ValueError(
                f"bad LoRA settings: rank={self.rank} (>= 1), alpha={self.alpha} (> 0), "
                f"dropout={self.dropout} (in [0, 1))"
            )


@dataclass
class Policy:
    """The training model object, its tokenizer and the device its inputs go to."""

    model: Any  # transformers PreTrainedModel, or a peft PeftModel wrapping one
    tokenizer: Any  # transformers tokenizer with a pad token
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_lora(self) -> bool:
        """True when the model is a peft model (the learner trains only the adapter)."""
        return is_peft_model(self.model)


def load_policy(
    model: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    attn_implementation: str | None = None,
    lora: LoraSettings | None = None,
    load_in_4bit: bool = False,
    gradient_checkpointing: bool = False,
    cache_dir: Path | None = None,
    empty: bool = False,
) -> Policy:
    """Load a causal LM by hub id, local path or built-in alias, ready to train and sample.

    `device="auto"` picks CUDA when present, else CPU. `attn_implementation` is passed to
    transformers as is (`"sdpa"`, `"eager"`, `"flash_attention_2"`; None: its default).
    `load_in_4bit` loads an NF4-quantised base (bitsandbytes, CUDA only) computing in `dtype`.
    `empty` reads no weights: the model is built from its config with every parameter on the
    meta device (buffers, such as rotary frequencies, are real), to be filled by
    `loop.model.distributed.shard_model` from rank 0's weights.
    """
    torch_dtype = _check_dtype(dtype)
    torch_device = _check_device(device)
    if empty and load_in_4bit:
        raise ValueError("load_in_4bit cannot build an empty model (it quantises while reading)")
    quantization = _bnb_4bit_config(torch_dtype, torch_device) if load_in_4bit else None
    path = resolve_model(model, cache_dir)
    _check_model_path(path)
    tokenizer = _load_tokenizer(path)
    if empty:  # no random draws (LoRA init included): the RNG stream is a loaded model's
        with torch.random.fork_rng(devices=[]):
            hf_model = _empty_model(path, torch_dtype, attn_implementation)
            return policy_from_model(
                hf_model, tokenizer, torch_device, lora=lora,
                gradient_checkpointing=gradient_checkpointing,
            )  # fmt: skip
    hf_model = _load_model(path, torch_dtype, torch_device, attn_implementation, quantization)
    if load_in_4bit:
        freeze_base(hf_model)
    return policy_from_model(
        hf_model, tokenizer, torch_device, lora=lora, gradient_checkpointing=gradient_checkpointing
    )


def policy_from_model(
    hf_model: Any,
    tokenizer: Any,
    device: torch.device,
    *,
    lora: LoraSettings | None = None,
    gradient_checkpointing: bool = False,
) -> Policy:
    """A `Policy` of a causal LM already built and on `device` (`load_policy`'s last steps;
    benchmarks use it on models built from a config with random weights)."""
    if gradient_checkpointing:
        # Non-reentrant checkpointing: works with frozen inputs and with LoRA; the generator
        # switches to eval mode, where transformers skips checkpointing and keeps the KV cache.
        hf_model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
        hf_model.config.use_cache = False
        if lora is not None:
            hf_model.enable_input_require_grads()
    if device.type == "cuda":  # one kernel per norm where the step is bound by memory traffic
        fuse_rms_norms(hf_model)
    if lora is not None:
        hf_model = _wrap_lora(hf_model, lora)
    return Policy(model=hf_model, tokenizer=tokenizer, device=device)


def freeze_base(model: Any) -> None:
    """Freeze every base weight in its own dtype (the 4-bit base's preparation for LoRA).

    Not peft's `prepare_model_for_kbit_training`: it upcasts every weight that is not 4-bit
    (embeddings, norms, LM head) to float32, so the residual stream and attention run in
    float32, where no fused SDPA kernel takes grouped-query heads and attention falls back to
    the quadratic math kernel: Qwen2.5-7B at 16K tokens peaked at 127 GiB on an H200 that way,
    against 25 GiB for the bf16 base (benchmarks/README.md, "On a GPU").
    """
    for parameter in model.parameters():
        parameter.requires_grad_(False)


def _check_dtype(dtype: str) -> torch.dtype:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _check_device(device: str) -> torch.device:
    """The torch device; CUDA with this process's index (cuda:LOCAL_RANK once
    loop/model/distributed.py `init_from_env` set it), since CUDA's current device is per
    thread: a worker thread (the overlap's learner, loop/rollout/ahead.py) starts on cuda:0."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}: use one of {', '.join(DEVICES)}")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' asked for but torch sees no CUDA GPU: use device='cpu'")
    if device == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device)


def _check_model_path(path: str) -> None:
    """A name that looks like a path must be a model directory; anything else is a hub id."""
    looks_local = path.startswith((".", "/", "~")) or Path(path).exists() or path.count("/") > 1
    if not looks_local:
        return
    local = Path(path).expanduser()
    if not local.is_dir():
        raise ValueError(f"model path {path} does not exist (give a hub id or a model directory)")
    if not (local / "config.json").is_file():
        raise ValueError(f"model path {path} has no config.json: not a Hugging Face model folder")


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot load the tokenizer of {path!r}: {one_line(exc)}") from None
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer of {path!r} has neither a pad nor an eos token")
        # Batching needs a pad id; padded positions are masked, so reusing eos is harmless.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_model(
    path: str,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str | None,
    quantization: Any,
) -> Any:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if quantization is not None:
        kwargs["quantization_config"] = quantization
        kwargs["device_map"] = {"": device.index or 0}
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        raise ValueError(f"cannot load model {path!r}: {one_line(exc)}") from None
    if quantization is None:
        model.to(device)
    return model


def _empty_model(path: str, dtype: torch.dtype, attn_implementation: str | None) -> Any:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs: dict[str, Any] = {"dtype": dtype}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        config = AutoConfig.from_pretrained(path)
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        raise ValueError(f"cannot build model {path!r}: {one_line(exc)}") from None
    # Tied as from_pretrained ties them (inside the context above a tie would make a new
    # meta parameter, not share one).
    model.tie_weights()
    return model


def _bnb_4bit_config(dtype: torch.dtype, device: torch.device) -> Any:
    if device.type != "cuda":
        raise ValueError("load_in_4bit needs a CUDA GPU (bitsandbytes): use device='cuda'")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise RuntimeError("load_in_4bit needs bitsandbytes: pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=dtype,
        bnb_4bit_use_double_quant=True,
    )


def _wrap_lora(model: Any, lora: LoraSettings) -> Any:
    from peft import LoraConfig, get_peft_model

    target = lora.target_modules
    config = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target if isinstance(target, str) else list(target),
        task_type="CAUSAL_LM",
    )
    try:
        wrapped = get_peft_model(model, config)
    except ValueError as exc:
        raise ValueError(f"cannot apply LoRA {lora}: {one_line(exc)}") from None
    fuse_lora_products(wrapped)  # one product per layer in the model's dtype (loop/model/lora.py)
    return wrapped
