"""The MLPs recomputed in the backward pass (loop/model/recompute.py): the same gradients,
fewer activations kept.

Run: python -m pytest tests/loop/test_recompute.py -q
"""

from __future__ import annotations

import torch

from loop.learner.logprobs import token_logprobs
from loop.model.policy import LoraSettings, policy_from_model
from loop.model.recompute import recompute_mlps
from tests.loop.conftest import tiny_llama, tiny_tokenizer


def gradients_and_kept(recompute: bool) -> tuple[list[torch.Tensor], int]:
    torch.manual_seed(0)
    policy = policy_from_model(
        tiny_llama(), tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(rank=4, alpha=8)
    )
    if recompute:
        assert recompute_mlps(policy.model) == len(policy.model.base_model.model.model.layers)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    ids = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    policy.model.train()
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        logprobs = token_logprobs(policy.model, ids)
    logprobs.sum().backward()
    grads = [p.grad for p in policy.model.parameters() if p.requires_grad]
    with torch.no_grad():  # without grad the MLP runs as before
        assert torch.equal(token_logprobs(policy.model, ids), logprobs.detach())
    return grads, sum(kept.values())


def test_recomputed_mlps_give_the_same_gradients_and_keep_less() -> None:
    plain, kept_plain = gradients_and_kept(False)
    recomputed, kept_recomputed = gradients_and_kept(True)
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed, strict=True))
    assert kept_recomputed < 0.8 * kept_plain, (kept_recomputed, kept_plain)
