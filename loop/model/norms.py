"""RMSNorm as one kernel: transformers' Qwen2 and Llama norms, rounded as before.

transformers' `Qwen2RMSNorm` / `LlamaRMSNorm` compute `weight * (x.float() * rsqrt(mean(x.float()
** 2) + eps)).to(x.dtype)`: a float32 copy of the hidden states and five more elementwise kernels
forward, as many again in the backward, each a full pass over a (tokens, hidden) tensor, at two
norms per decoder layer. torch's `rms_norm` does the normalisation in one kernel, in float32
inside it, and writes it in the input's dtype: the same rounding as transformers' `.to(x.dtype)`
(the mean's summation order aside); the weight's product stays a separate multiply in the
model's dtype, so the result is rounded where transformers and vLLM's kernel round it (vLLM
casts the normalised value to the model's dtype before the weight, as transformers does).

On Qwen2.5-7B with LoRA at 8K tokens (one H200, gradient checkpointing) the learner's step ran
1.04x faster this way (0.936 -> 0.902 s), and without checkpointing it held 59.0 GiB against
62.1 (no float32 copies saved for the backward); the weight inside the kernel (one rounding)
ran 1.08x but rounds unlike the sampler (benchmarks/README.md, "On a GPU", 2026-11-30).
`fuse_rms_norms` gives every such norm of a model this forward; the policy does it on a GPU
(loop/model/policy.py); a CPU model keeps transformers' forward (the CPU runs' numbers).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from loop.model.forwards import give_forwards, restore_forwards

NORM_CLASSES = ("Qwen2RMSNorm", "LlamaRMSNorm")  # transformers' norms of the models we load


def fuse_rms_norms(model: Any) -> int:
    """Give every transformers RMSNorm of `model` the one-kernel forward; how many there were.

    Idempotent; a norm of another class keeps its forward."""
    return give_forwards(model, _one_kernel_forward, lambda m: type(m).__name__ in NORM_CLASSES)


def unfuse_rms_norms(model: Any) -> None:
    """Back to transformers' forward on every norm (benchmarks compare the two)."""
    restore_forwards(model, _one_kernel_forward)


def _one_kernel_forward(self: Any, hidden: Tensor) -> Tensor:
    normed = torch.nn.functional.rms_norm(hidden, hidden.shape[-1:], None, self.variance_epsilon)
    return self.weight * normed
