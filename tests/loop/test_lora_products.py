"""loop/model/lora.py: each adapted layer as one product in the model's dtype, against peft's
own forward.

Run: python -m pytest tests/loop/test_lora_products.py -q        (a few seconds)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from loop.model.lora import fuse_lora_products, unfuse_lora_products
from loop.model.policy import LoraSettings, policy_from_model
from tests.loop.conftest import tiny_llama, tiny_tokenizer

IDS = torch.tensor([[5, 9, 13, 2, 7, 31, 8, 4]])


def lora_model(dtype: torch.dtype, *, seed: int = 0) -> Any:
    """The tiny Llama with LoRA r4 on every linear layer and non-zero B (peft starts B at 0,
    which would hide a wrong update)."""
    model = tiny_llama().to(dtype)
    policy = policy_from_model(
        model, tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(rank=4, alpha=8)
    )
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return policy.model.train()


def logits_and_grads(model: Any) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad(set_to_none=True)
    logits = model(input_ids=IDS).logits
    logits.float().square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach().float(), grads


def test_float32_takes_peft_s_products() -> None:
    model = lora_model(torch.float32)
    fused, fused_grads = logits_and_grads(model)
    unfuse_lora_products(model)
    plain, plain_grads = logits_and_grads(model)
    assert fused_grads.keys() == plain_grads.keys() and len(fused_grads) == 2 * 7 * 2
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_bfloat16_computes_in_bfloat16_with_float32_master_weights() -> None:
    """One adapted layer of a bf16 model: its output is the update computed from the factors
    cast to bf16 (FSDP2's mixed precision), one rounding off the exact value; the factors and
    their gradients stay float32 and the whole model's gradients reach every factor."""
    model = lora_model(torch.bfloat16)
    _, grads = logits_and_grads(model)
    factors = [p for n, p in model.named_parameters() if "lora_" in n]
    assert factors and all(p.dtype == torch.float32 for p in factors)
    assert all(g.dtype == torch.float32 and g.abs().sum() > 0 for g in grads.values())
    layer = model.get_base_model().model.layers[0].mlp.up_proj
    x = torch.randn(8, layer.in_features, generator=torch.Generator().manual_seed(1))
    x = x.to(torch.bfloat16)
    a, b = (m["default"].weight.to(torch.bfloat16).double() for m in (layer.lora_A, layer.lora_B))
    exact = layer.base_layer(x).double() + layer.scaling["default"] * (x.double() @ a.T @ b.T)
    with torch.no_grad():
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), exact, rtol=2**-7, atol=1e-2)


def test_bfloat16_saves_no_float32_activation() -> None:
    """The update saves nothing in float32 for backward: peft's forward saves a float32 copy
    of every adapted layer's input and of A's product (14 layers here); what both save
    beside is the model's own (RMSNorm computes in float32)."""

    def float32_saved(model: Any) -> list[tuple[int, ...]]:
        found: list[tuple[int, ...]] = []

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.dtype == torch.float32 and tensor.dim() >= 2 and tensor.shape[-2] >= 8:
                found.append(tuple(tensor.shape))  # activations: (…, tokens, features)
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(input_ids=IDS).logits.float().sum().backward()
        return found

    model = lora_model(torch.bfloat16)
    saved = float32_saved(model)
    unfuse_lora_products(model)
    assert len(float32_saved(model)) >= len(saved) + 2 * 14  # its input and A's product


def test_other_calls_take_peft_s_forward() -> None:
    model = lora_model(torch.float32).eval()
    with torch.no_grad():
        base = model.get_base_model()
        with model.disable_adapter():
            off = model(input_ids=IDS).logits
        on = model(input_ids=IDS).logits
        unfuse_lora_products(model)
        with model.disable_adapter():
            plain_off = model(input_ids=IDS).logits
    torch.testing.assert_close(off, plain_off)
    assert (on - off).abs().max() > 1e-3  # the adapters do change the output
    assert fuse_lora_products(model) == fuse_lora_products(model) == 2 * 7
    with torch.no_grad():
        model.merge_adapter()
        merged = model(input_ids=IDS).logits
        model.unmerge_adapter()
    torch.testing.assert_close(merged, on, rtol=1e-4, atol=1e-4)  # W + s B A: other sums
    assert base is model.get_base_model()


@pytest.mark.parametrize("dropout", [0.0, 0.5])
def test_dropout_is_peft_s(dropout: float) -> None:
    """The adapter input's dropout draws the same mask as peft's (same module, same stream)."""
    model = tiny_llama()
    policy = policy_from_model(
        model, tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(4, 8, dropout=dropout)
    )
    peft_model = policy.model.train()
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.1)
    torch.manual_seed(3)
    fused = peft_model(input_ids=IDS).logits
    unfuse_lora_products(peft_model)
    torch.manual_seed(3)
    plain = peft_model(input_ids=IDS).logits
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
