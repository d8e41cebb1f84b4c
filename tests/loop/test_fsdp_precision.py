"""FSDP2's precision for LoRA: float32 master weights, computed in the model's dtype.

    python -m pytest tests/loop/test_fsdp_precision.py -q        (a few seconds, CPU)

One process in a gloo group of one, told it is distributed so that `shard_model` runs
`fully_shard` as it does under torchrun. peft stores a bfloat16 model's adapters in float32;
sharded, they stay float32 (the optimizer steps them there) and are gathered for forward in
bfloat16, as the reference's "params bf16, gradient reduce fp32" policy has them. A float32
model (the CPU runs, the golden curve) computes in float32 as before.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from loop.model import distributed
from loop.model.policy import LoraSettings, _wrap_lora
from tests.loop.conftest import tiny_llama


@pytest.fixture
def group_of_one(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)  # shard as under torchrun
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_lora_is_stored_in_float32_and_computed_in_the_model_dtype(
    group_of_one: None, dtype: torch.dtype
) -> None:
    model = _wrap_lora(tiny_llama().to(dtype), LoraSettings(rank=4, alpha=8))
    distributed.shard_model(model)
    computed: list[torch.dtype] = []
    adapted = [m for m in model.modules() if hasattr(m, "lora_A")]  # the factors as gathered
    hooks = [
        m.register_forward_pre_hook(lambda m, args: computed.append(m.lora_A.default.weight.dtype))
        for m in adapted
    ]
    logits = model(input_ids=torch.tensor([[1, 5, 7, 9]])).logits
    for hook in hooks:
        hook.remove()
    assert computed and set(computed) == {dtype}, f"LoRA computed in {set(computed)}"
    logits.float().square().mean().backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    stored = {p.dtype for p in trainable} | {p.grad.dtype for p in trainable if p.grad is not None}
    assert stored == {torch.float32}, f"the optimizer's LoRA weights and gradients: {stored}"
