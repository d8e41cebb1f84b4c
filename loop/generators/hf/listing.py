"""What the `hf` generator reads of the model it samples with: the model's modules and
parameters, listed once a burst (`ModelListing`), and the sampling mode set through that
listing (`sampling_mode`: eval mode, no grad, the sampler's torch threads)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass(frozen=True)
class ModelListing:
    """A model's modules and parameters, listed once and reused for every decode step of a
    burst: walking them costs about what a fifth of a step does (SmolLM2-135M with LoRA: 2,499
    modules and 692 parameters, 3 ms to list the modules, 4 ms the parameters, 6 ms to set
    their training flags through `nn.Module.__setattr__`, against well under 1 ms from the
    lists). The generator lists again when a burst of work starts (no row active: the learner
    may have trained or replaced weights since) and after `load_adapter`."""

    modules: tuple[Any, ...]
    parameters: tuple[Tensor, ...]

    @classmethod
    def of(cls, model: Any) -> ModelListing:
        return cls(tuple(model.modules()), tuple(model.parameters()))

    def fingerprint(self) -> tuple[tuple[int, int], ...]:
        """Each parameter's storage address and in-place version: any weight update (an
        optimiser step, a copy into it, its `.data` rebound) changes it."""
        return tuple((p.data_ptr(), p._version) for p in self.parameters)


@contextlib.contextmanager
def sampling_mode(listing: ModelListing, threads: int | None) -> Iterator[None]:
    """Eval mode (every module's training flag off), no grad and `threads` torch threads while
    sampling; restored after (the learner, which trains this same model between rollouts,
    keeps its own mode and thread count). The flags are set directly, as `Module.train` sets
    them, without its recursion and per-module `__setattr__`."""
    training = [module for module in listing.modules if module.training]
    before = torch.get_num_threads()
    for module in training:
        object.__setattr__(module, "training", False)
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(before)
        for module in training:
            object.__setattr__(module, "training", True)
