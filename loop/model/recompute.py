"""Activations recomputed in the backward pass instead of kept (`model.recompute`).

Of what a learner's forward pass keeps for its backward pass, the MLPs' are most: per token
and layer, the gate and up projections, the activation and their product, each
`intermediate_size` wide (SmolLM2-135M: 4 x 1,536 floats against 576 for the layer's input),
60% of the 1.27 GiB a 1,100-token rollout keeps; the attention's norms, projections, rotated
queries and keys and its output make most of the rest.

- `mlp`: `recompute_mlps` wraps each MLP's forward in non-reentrant activation checkpointing:
  the MLP keeps only its input and runs again in the backward pass (about a fifth more of a
  step's arithmetic).
- `layers`: `recompute_layers` does the same for each whole decoder layer: a layer keeps only
  its input (576 floats a token), and the step's peak is one layer's activations on top
  (SmolLM2-135M, 1,100 tokens: 79 MiB kept against 497 with `mlp`). Unlike
  `model.gradient_checkpointing` (transformers' own), it keeps the layers' key-value cache
  working, so the learner's shared prefix (loop/learner/prefix.py) still runs once a step:
  the cache's layer is put back as it was before the forward before it runs again, so the
  recompute sees what the forward saw (the cache grows by concatenation, never in place).

The recompute runs the same operations on the same inputs, so the gradients are the same
numbers (bit for bit on a CPU; tests/loop/test_recompute.py). Without grad (sampling, the
recompute of old log-probs) the modules run as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from loop.model.aliases import causal_lm

KINDS = ("none", "mlp", "layers")


def recompute(model: Any, kind: str) -> int:
    """Recompute `kind` (one of KINDS) in `model`'s backward passes; how many modules."""
    if kind not in KINDS:
        raise ValueError(f"model.recompute must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "mlp":
        return recompute_mlps(model)
    if kind == "layers":
        return recompute_layers(model)
    return 0


def recompute_mlps(model: Any) -> int:
    """Wrap the MLP of every decoder layer of `model` (peft-wrapped or not); returns how many."""
    layers = causal_lm(model).model.layers
    for layer in layers:
        layer.mlp.forward = functools.partial(_recomputed, layer.mlp.forward)
    return len(layers)


def recompute_layers(model: Any) -> int:
    """Wrap every decoder layer of `model` (peft-wrapped or not); returns how many."""
    layers = causal_lm(model).model.layers
    for layer in layers:
        layer.forward = functools.partial(
            _recomputed_layer, layer.forward, layer.self_attn.layer_idx
        )
    return len(layers)


def _recomputed(forward: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return checkpoint(forward, x, use_reentrant=False)
    return forward(x)


def _recomputed_layer(
    forward: Callable[..., Any], index: int, hidden: Tensor, *args: Any, **kwargs: Any
) -> Any:
    if not torch.is_grad_enabled():  # (the first layer's input needs no grad under LoRA)
        return forward(hidden, *args, **kwargs)
    cache = kwargs.get("past_key_values")
    before = _cache_layer_state(cache, index)

    def run(hidden: Tensor, *args: Any, **kwargs: Any) -> Any:
        _restore_cache_layer(cache, index, before)  # the recompute sees what the forward saw
        return forward(hidden, *args, **kwargs)

    return checkpoint(run, hidden, *args, use_reentrant=False, **kwargs)


def _cache_layer_state(cache: Any, index: int) -> tuple[int, dict[str, Any] | None]:
    """How many layers `cache` has, and a shallow copy of layer `index`'s attributes."""
    if cache is None:
        return 0, None
    layers = cache.layers
    return len(layers), dict(vars(layers[index])) if index < len(layers) else None


def _restore_cache_layer(cache: Any, index: int, state: tuple[int, dict[str, Any] | None]) -> None:
    if cache is None:
        return
    count, attributes = state
    del cache.layers[count:]  # a layer the forward appended lazily
    if attributes is not None:
        layer = cache.layers[index]
        vars(layer).clear()
        vars(layer).update(attributes)
