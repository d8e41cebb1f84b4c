"""Checkpoints: written atomically, the last n kept, the newest complete one found on resume.

Layout of `runs/<name>/checkpoints/iter-N/` (N = iterations completed):

    adapter/            the LoRA adapter in PEFT format (vLLM loads it as a LoRA module), or
    model/              the full weights in Hugging Face format (full fine-tuning)
    trainer_state.pt    optimizer, schedule, step counters, task sampler, RNG states, counters

A checkpoint is written to a hidden sibling directory and renamed into place, so `iter-N`
either exists complete or not at all; a SIGKILL mid-write leaves only a `.tmp-*` directory,
which the next save removes.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from loop.config_types import ConfigError, one_line
from loop.model.aliases import is_peft_model
from loop.run.rundir import ADAPTER, iter_name, iteration_of

# A LoRA adapter loads into FSDP2's sharded (DTensor) parameters only through peft's DTensor
# reshard in `set_peft_model_state_dict`: peft 0.21.1 ("enable Tensor Parallel to work properly
# with PEFT", peft PR #3614), which turns it on only with Transformers >= 5.17.0 (its DTensor
# API). Older, the resume of a sharded LoRA run fails (mixed Tensor and DTensor).
PEFT_DTENSOR = "0.21.1"
TRANSFORMERS_DTENSOR = "5.17.0"
STATE_FILE = "trainer_state.pt"
MODEL = "model"  # full weights in Hugging Face format (full fine-tuning)
ADAPTER_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"  # what makes a directory a PEFT adapter


def save_weights(model: Any, path: Path) -> None:
    """The trainable weights in Hugging Face / PEFT format under `path` (a new directory).

    With several processes (FSDP) every rank must call it: the shards are gathered to rank 0,
    which writes (only the adapter's tensors for a LoRA model); the others wait.
    """
    from transformers.utils import logging as hf_logging

    from loop.model import distributed

    state = None
    if distributed.is_distributed():
        state = distributed.full_state_dict(model, trainable_only=is_peft_model(model))
    hf_logging.disable_progress_bar()  # no "Writing model shards" bar between iteration lines
    try:
        if state is None:
            model.save_pretrained(str(path), safe_serialization=True)
        elif distributed.is_main():
            model.save_pretrained(str(path), state_dict=state, safe_serialization=True)
    finally:
        hf_logging.enable_progress_bar()
    distributed.barrier()


def load_weights(model: Any, checkpoint: Path) -> None:
    """Load what `save_weights` wrote in `checkpoint` into `model` (adapter or full weights)."""
    from safetensors.torch import load_file

    if (checkpoint / ADAPTER / ADAPTER_FILE).is_file():
        load_adapter(model, checkpoint / ADAPTER)
        return
    from loop.model import distributed

    full = checkpoint / MODEL / "model.safetensors"
    shards = [full] if full.is_file() else sorted((checkpoint / MODEL).glob("model-*.safetensors"))
    if shards:  # save_pretrained splits large models into shards
        for shard in shards:  # whole tensors; each process keeps its slice of them
            distributed.load_full_state_dict(model, load_file(str(shard)))
        return
    raise FileNotFoundError(f"{checkpoint}: neither adapter/ nor model/ weights found")


def adapter_dir(path: Path) -> Path:
    """The LoRA adapter `evaluate.py --checkpoint PATH` means: PATH itself when it is a PEFT
    adapter directory, else a checkpoint's `adapter/` (`runs/<name>/checkpoints/iter-N`).

    Raises ConfigError, naming what PATH holds instead."""
    for candidate in (path, path / ADAPTER):
        if (candidate / ADAPTER_CONFIG).is_file():
            return candidate
    if (path / MODEL).is_dir():
        raise ConfigError(
            f"{path}: holds full weights ({MODEL}/), not a LoRA adapter: --checkpoint takes "
            "an adapter"
        )
    raise ConfigError(f"{path}: neither a LoRA adapter directory nor a checkpoint with {ADAPTER}/")


def load_adapter(model: Any, adapter: Path) -> None:
    """A PEFT adapter directory's LoRA weights into `model`, a peft model with the same LoRA.

    Raises ValueError when the adapter's tensors and the model's LoRA do not match (another
    rank, other target modules, another base model), FileNotFoundError when it has no weights.
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    if not (adapter / ADAPTER_FILE).is_file():
        raise FileNotFoundError(f"{adapter}: no {ADAPTER_FILE} (not a PEFT adapter directory)")
    if not is_peft_model(model):
        raise ValueError(f"{adapter}: a LoRA adapter needs a LoRA policy (model.lora_rank > 0)")
    try:
        result = set_peft_model_state_dict(model, load_file(str(adapter / ADAPTER_FILE)))
    except RuntimeError as exc:  # shape mismatch: another rank or base model
        raise ValueError(f"{adapter}: adapter does not fit the model ({one_line(exc)})") from None
    unexpected = getattr(result, "unexpected_keys", [])
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if unexpected or missing:
        raise ValueError(
            f"{adapter}: adapter does not match the model's LoRA ({len(unexpected)} unexpected, "
            f"{len(missing)} missing tensors)"
        )


def check_sharded_lora_loads() -> None:
    """Refuse (one line) a LoRA run under FSDP2 whose peft or Transformers cannot load its own
    checkpoints back into the shards (`PEFT_DTENSOR`, `TRANSFORMERS_DTENSOR`): refused at the
    start, not at the first resume."""
    import peft
    import transformers
    from packaging.version import Version

    have = {"peft": peft.__version__, "transformers": transformers.__version__}
    need = {"peft": PEFT_DTENSOR, "transformers": TRANSFORMERS_DTENSOR}
    old = [name for name in need if Version(have[name]) < Version(need[name])]
    if old:
        raise ConfigError(
            "LoRA with several learner processes (FSDP2) resumes only with "
            + " and ".join(f"{n} >= {need[n]}" for n in old)
            + " (DTensor adapter loading), found "
            + ", ".join(f"{n} {have[n]}" for n in old)
        )


def save_checkpoint(
    root: Path, iteration: int, model: Any, state: dict[str, Any], keep: int, keep_every: int = 0
) -> Path:
    """Write `root/iter-<iteration>` atomically and keep only the newest `keep` checkpoints,
    and those of every `keep_every`-th iteration (iter-k, iter-2k, ...; 0: none).

    Collective with several processes: every rank calls it (the weights are gathered from the
    shards); only rank 0 touches the files.
    """
    from loop.model import distributed

    main = distributed.is_main()
    final = root / iter_name(iteration)
    tmp = root / f".tmp-{iter_name(iteration)}-{os.getpid()}"
    if main:
        root.mkdir(parents=True, exist_ok=True)
        for leftover in root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        tmp.mkdir()
    tmp = Path(distributed.broadcast_object(str(tmp)))
    is_lora = is_peft_model(model)
    save_weights(model, tmp / (ADAPTER if is_lora else MODEL))
    if main:
        torch.save({**state, "iteration": iteration, "rng": rng_state()}, tmp / STATE_FILE)
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(root)
        for old in list_checkpoints(root)[:-keep]:
            if not keep_every or (iteration_of(old.name) or 1) % keep_every:
                shutil.rmtree(old, ignore_errors=True)
    distributed.barrier()
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        iteration = iteration_of(path.name)
        if iteration is not None and path.is_dir() and (path / STATE_FILE).is_file():
            found.append((iteration, path))
    return [path for _, path in sorted(found)]


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    checkpoints = list_checkpoints(root)
    return checkpoints[-1] if checkpoints else None


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of `checkpoint` (RNG states restored by `restore_rng`)."""
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    """Python's and torch's global RNG states."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    """Put back what `rng_state` returned."""
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(path: Path) -> None:
    for item in path.rglob("*"):
        if item.is_file():
            with item.open("rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
