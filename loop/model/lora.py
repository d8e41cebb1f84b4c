"""The learner's LoRA layers: each adapted layer as one matrix product, in the model's dtype.

peft's LoRA `Linear` computes `base(x) + B(A(dropout(x))) * scaling` with x first cast to the
adapters' dtype. A bfloat16 model's adapters are float32 (peft upcasts them: the optimiser's
master weights), so every adapted layer of a bfloat16 model casts its input to float32, runs
both adapter products in float32, and writes three (tokens, out) float32 tensors (B's product,
its scaled copy, the sum) before casting the sum back: elementwise traffic of about 24 bytes
per output element, forward and again backward, on every linear layer of every decoder layer.
On Qwen2.5-7B that is about 40 MB a token through memory, which is why a LoRA step ran at
half the MFU of a full fine-tuning step on the same shapes (benchmarks/README.md, "On a GPU").

`fuse_lora_products` gives every plain adapted layer (one active adapter, no variant such as
DoRA, no adapter bias, not merged, adapters enabled) a forward that casts the two small
factors to the model's dtype instead (r x in and out x r: nothing next to the activations)
and adds the update inside one GEMM, `addmm(base(x), A x, B^T, alpha=scaling)`, whose
epilogue does the sum. The factors stay float32 parameters (the optimiser's master weights;
their gradients come back through the cast in float32), which is what FSDP2's mixed
precision (`param_dtype` = the model's dtype, loop/model/distributed.py) computes under
torchrun: one process and several now take the same products. A float32 model takes the same
products as before, the scaling applied inside the GEMM (rounding aside). Any other call (a
mixed batch's `adapter_names`, adapters disabled or merged, a variant) goes to peft's own
forward, unchanged. The hf engine's decoding has its own fused projections (hf/fused.py);
this is the learner's path and the engine's prefill.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from loop.model.forwards import give_forwards, restore_forwards


def fuse_lora_products(model: Any) -> int:
    """Give every peft LoRA `Linear` in `model` the one-product forward; how many there were.

    Idempotent. Layers of other peft classes (a 4-bit base's `Linear4bit`, embeddings,
    convolutions) keep peft's forward.
    """
    from peft.tuners.lora.layer import Linear

    return give_forwards(
        model,
        _one_product_forward,
        lambda m: isinstance(m, Linear) and not _is_subclass_layer(m, Linear),
    )


def unfuse_lora_products(model: Any) -> None:
    """Back to peft's own forward on every layer (benchmarks compare the two)."""
    restore_forwards(model, _one_product_forward)


def _is_subclass_layer(module: Any, linear: Any) -> bool:
    """True for peft classes derived from its LoRA `Linear` with their own forward (quantized
    bases); a class that FSDP2 derives to shard the layer keeps `Linear.forward`."""
    return type(module).forward is not linear.forward


def _one_product_forward(self: Any, x: Tensor, *args: Any, **kwargs: Any) -> Tensor:
    name = _plain_adapter(self)
    if name is None or args or kwargs:
        return type(self).forward(self, x, *args, **kwargs)  # peft's own
    result = self.base_layer(x)
    dtype = result.dtype
    down = torch.nn.functional.linear(
        self.lora_dropout[name](x).to(dtype), self.lora_A[name].weight.to(dtype)
    )
    up = self.lora_B[name].weight.to(dtype)
    flat = torch.addmm(
        result.reshape(-1, result.shape[-1]),
        down.reshape(-1, down.shape[-1]),
        up.t(),
        alpha=self.scaling[name],
    )
    return flat.view(result.shape)


def _plain_adapter(layer: Any) -> str | None:
    """The one active adapter of `layer` when it is plain LoRA, else None (peft's forward)."""
    if layer.disable_adapters or layer.merged:
        return None
    active = [name for name in layer.active_adapters if name in layer.lora_A]
    if len(active) != 1:
        return None
    name = active[0]
    if name in getattr(layer, "lora_variant", {}) or getattr(layer, "lora_bias", {}).get(name):
        return None
    return name
