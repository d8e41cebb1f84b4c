"""Each decoder layer's MLP recomputed in the backward pass: the learner's largest activations
kept for no layer (`model.recompute_mlp`).

Of what a learner's forward pass keeps for its backward pass, the MLPs' are most: per token
and layer, the gate and up projections, the activation and their product, each
`intermediate_size` wide (SmolLM2-135M: 4 x 1,536 floats against 576 for the layer's input),
60% of the 1.27 GiB a 1,100-token rollout keeps. `recompute_mlps` wraps each MLP's forward in
non-reentrant activation checkpointing: the MLP keeps only its input and runs again in the
backward pass. The recompute runs the same operations on the same inputs, so the gradients are
the same numbers (bit for bit on a CPU); the cost is one more MLP forward per layer (about a
fifth of a step's arithmetic). Unlike `model.gradient_checkpointing` (transformers' own, every
whole layer), it keeps the attention's keys and values, so the learner's shared prefix
(loop/learner/prefix.py) still works. Without grad (sampling, the recompute of old log-probs)
the MLP runs as before.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from loop.model.aliases import causal_lm


def recompute_mlps(model: Any) -> int:
    """Wrap the MLP of every decoder layer of `model` (peft-wrapped or not); returns how many."""
    layers = causal_lm(model).model.layers
    for layer in layers:
        layer.mlp.forward = functools.partial(_recomputed, layer.mlp.forward)
    return len(layers)


def _recomputed(forward: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    if torch.is_grad_enabled() and x.requires_grad:
        return checkpoint(forward, x, use_reentrant=False)
    return forward(x)
