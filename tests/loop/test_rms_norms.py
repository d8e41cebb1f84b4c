"""loop/model/norms.py: transformers' RMSNorm as torch's one-kernel `rms_norm`, rounded as before.

Run: python -m pytest tests/loop/test_rms_norms.py -q        (a few seconds)
"""

from __future__ import annotations

import pytest
import torch

from loop.model.norms import fuse_rms_norms, unfuse_rms_norms
from loop.model.policy import policy_from_model
from tests.loop.conftest import tiny_llama, tiny_tokenizer

IDS = torch.tensor([[5, 9, 13, 2, 7, 31, 8, 4]])


def norm_and_input(dtype: torch.dtype) -> tuple[torch.nn.Module, torch.Tensor]:
    """The tiny Llama's first norm with a weight far from ones, and hidden states of a wide
    range (a norm of ones on unit inputs would hide a misplaced rounding)."""
    norm = tiny_llama().model.layers[0].input_layernorm.to(dtype)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        norm.weight.copy_(1 + torch.randn(norm.weight.shape, generator=generator))
    hidden = 8 * torch.randn(3, 16, norm.weight.shape[0], generator=generator)
    return norm, hidden.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_one_kernel_norm_rounds_where_transformers_does(dtype: torch.dtype) -> None:
    """Output and both gradients as transformers' norm gives them: in float32 to float32's
    rounding; in bfloat16 the normalised value rounded to bf16 before the weight's product,
    as there (a product rounded once, in float32, would differ by up to one bf16 step in many
    elements), so at most an element or two in a thousand differ, by one step."""
    norm, hidden = norm_and_input(dtype)
    results = []
    for fuse in (False, True):
        if fuse:
            assert fuse_rms_norms(norm) == 1
        x = hidden.clone().requires_grad_(True)
        norm.zero_grad(set_to_none=True)
        out = norm(x)
        out.float().square().sum().backward()
        results.append((out.detach(), x.grad, norm.weight.grad))
    (plain, plain_dx, plain_dw), (fused, fused_dx, fused_dw) = results
    assert fused.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(fused, plain, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(fused_dx, plain_dx, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fused_dw, plain_dw, rtol=1e-5, atol=1e-4)
    else:
        differ = (fused != plain).float().mean().item()
        assert differ <= 2e-3, differ
        torch.testing.assert_close(fused.float(), plain.float(), rtol=2**-7, atol=0)
        torch.testing.assert_close(fused_dw.float(), plain_dw.float(), rtol=2e-2, atol=0.5)


def test_the_whole_model_is_unchanged_and_unfusing_restores_it() -> None:
    model = tiny_llama().eval()
    with torch.no_grad():
        plain = model(input_ids=IDS).logits
        assert fuse_rms_norms(model) == fuse_rms_norms(model) == 2 * 2 + 1  # idempotent
        fused = model(input_ids=IDS).logits
        unfuse_rms_norms(model)
        back = model(input_ids=IDS).logits
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    assert torch.equal(back, plain)
    assert not any("forward" in m.__dict__ for m in model.modules())


def test_a_cpu_policy_keeps_transformers_norms() -> None:
    """The one-kernel norm is the GPU's (policy_from_model on a CUDA device): a CPU run's
    numbers, the golden curve's, stay transformers'."""
    policy = policy_from_model(tiny_llama(), tiny_tokenizer(), torch.device("cpu"))
    assert not any("forward" in m.__dict__ for m in policy.model.modules())
