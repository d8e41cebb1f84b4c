"""The tokens every rollout of a step starts with, run through the model once for all of them.

Every rollout of the quickstart begins with the same system prompt (about 430 of its first 490
tokens), and so does every demonstration a step replays; the learner's forward and backward
passes ran it once per rollout. `SharedPrefix` runs the longest common start of a step's samples
once and gives each sample's forward pass its keys and values as a cache, so each sample runs
only its own tokens (its suffix):

1. `shared_length`: the common start, cut so that no trained token is predicted from it (a
   token's log-prob comes from the hidden state before it, so every trained token must lie
   past the prefix's last position).
2. `SharedPrefix.build`: one forward of the prefix, keeping each layer's keys and values. With
   grad on, the suffixes see detached copies (leaves), so each suffix's backward stops at them
   and accumulates their gradients; `backward()` then sends the sum through the prefix's graph
   once. The gradients equal the full forward's (the same sums, in another order).
3. `SharedPrefix.hidden`: a batch's last hidden states with the prefix's positions left at 0
   (the LM head runs only where tokens are trained, all of them past the prefix).

Not used (the caller runs each sequence whole) with gradient checkpointing (transformers drops
a cache in checkpointed layers), a sharded model (its parameters are gathered per forward and
the extra passes are not worth the traffic), or a value head (it reads every position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from transformers import DynamicCache

from loop.learner.batch import Sample
from loop.model.aliases import causal_lm


def shared_length(samples: Sequence[Sample]) -> int:
    """How many leading tokens every sample shares with no trained token predicted from them:
    at most the first trained token's position minus one, and one short of the shortest."""
    first = samples[0].tokens
    length = min(len(s.tokens) for s in samples) - 1
    for sample in samples:
        differ = (sample.tokens[:length] != first[:length]).nonzero()
        length = int(differ[0, 0]) if len(differ) else length
        trained = sample.is_output.nonzero()
        if len(trained):
            length = min(length, int(trained[0, 0]) - 1)
    return max(length, 0)


def can_share(model: Any) -> bool:
    """The model's forward keeps a cache in training (no gradient checkpointing)."""
    return not getattr(causal_lm(model), "is_gradient_checkpointing", False)


@dataclass
class SharedPrefix:
    """The keys and values of `length` tokens every sample of a step starts with."""

    length: int
    kv: list[tuple[Tensor, Tensor]]  # per layer (1, kv_heads, length, head_dim): the graph's
    leaves: list[tuple[Tensor, Tensor]]  # what the suffixes attend to (detached when training)

    @classmethod
    def build(cls, model: Any, ids: Tensor) -> SharedPrefix:
        """Run `ids` (length,) once; with grad on, `backward()` must follow the suffixes'."""
        out = causal_lm(model).base_model(input_ids=ids[None], use_cache=True)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        grad = torch.is_grad_enabled()
        leaves = [
            (k.detach().requires_grad_(), v.detach().requires_grad_()) if grad else (k, v)
            for k, v in kv
        ]
        return cls(len(ids), kv, leaves)

    def hidden(self, model: Any, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
        """The last hidden states (B, T, H) of sequences starting with the prefix, their own
        tokens run over its cached keys; the prefix's positions are 0."""
        batch, length = input_ids.shape[0], self.length
        cache = DynamicCache(
            ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                            for k, v in self.leaves]
        )  # fmt: skip
        positions = torch.arange(length, input_ids.shape[1], device=input_ids.device)
        out = causal_lm(model).base_model(
            input_ids=input_ids[:, length:],
            attention_mask=attention_mask,
            position_ids=positions.expand(batch, -1),
            past_key_values=cache,
            use_cache=True,
        )
        own = out.last_hidden_state
        return torch.cat([own.new_zeros(batch, length, own.shape[2]), own], dim=1)

    def backward(self) -> None:
        """Send the suffixes' gradients on the prefix's keys and values through its graph."""
        pairs = [
            (tensor, leaf.grad)
            for pair, leaf_pair in zip(self.kv, self.leaves, strict=True)
            for tensor, leaf in zip(pair, leaf_pair, strict=True)
            if leaf.grad is not None
        ]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])
