"""Activations recomputed in the backward pass (loop/model/recompute.py): the same gradients,
fewer activations kept, with the learner's shared prefix too.

Run: python -m pytest tests/loop/test_recompute.py -q
"""

from __future__ import annotations

import pytest
import torch

from loop.learner.logprobs import logprobs_from_hidden, token_logprobs
from loop.learner.prefix import SharedPrefix
from loop.model.policy import LoraSettings, policy_from_model
from loop.model.recompute import recompute
from tests.loop.conftest import tiny_llama, tiny_tokenizer


def lora_policy(kind: str):
    torch.manual_seed(0)
    policy = policy_from_model(
        tiny_llama(), tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(rank=4, alpha=8)
    )
    layers = len(policy.model.base_model.model.model.layers)
    assert recompute(policy.model, kind) == (0 if kind == "none" else layers)
    with torch.no_grad():
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.1)
    return policy.model.train()


def kept_while(run) -> tuple[int, torch.Tensor]:
    """The bytes autograd keeps for the backward pass while `run()` runs (parameters aside)."""
    kept: dict[int, int] = {}

    def keep(tensor: torch.Tensor) -> torch.Tensor:
        if not isinstance(tensor, torch.nn.Parameter):
            kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        out = run()
    return sum(kept.values()), out


def gradients(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters() if p.requires_grad]


IDS = torch.randint(3, 100, (2, 24), generator=torch.Generator().manual_seed(1))


def whole(kind: str) -> tuple[list[torch.Tensor], int]:
    model = lora_policy(kind)
    kept, logprobs = kept_while(lambda: token_logprobs(model, IDS))
    logprobs.sum().backward()
    with torch.no_grad():  # without grad the modules run as before
        assert torch.equal(token_logprobs(model, IDS), logprobs.detach())
    return gradients(model), kept


def over_a_shared_prefix(kind: str) -> tuple[list[torch.Tensor], int]:
    """Two sequences sharing their first 10 ids, the prefix run once (loop/learner/prefix.py)."""
    model = lora_policy(kind)
    ids = IDS.clone()
    ids[1, :10] = ids[0, :10]
    kept = 0
    prefix = SharedPrefix.build(model, ids[0, :10])
    for row in ids:
        size, hidden = kept_while(lambda row=row: prefix.hidden(model, row[None], None))
        logprobs = logprobs_from_hidden(model, hidden, row[None], chunk_size=8, temperature=1.0)
        logprobs[:, 10:].sum().backward()
        kept = max(kept, size)
    prefix.backward()
    return gradients(model), kept


@pytest.mark.parametrize("kind", ["mlp", "layers"])
@pytest.mark.parametrize("run", [whole, over_a_shared_prefix])
def test_recomputed_activations_give_the_same_gradients_and_keep_less(kind, run) -> None:
    plain, kept_plain = run("none")
    recomputed, kept_recomputed = run(kind)
    assert all(torch.equal(a, b) for a, b in zip(plain, recomputed, strict=True))
    assert kept_recomputed < {"mlp": 0.8, "layers": 0.2}[kind] * kept_plain, (
        kept_recomputed,
        kept_plain,
    )


def test_an_unknown_kind_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"model\.recompute must be one of none, mlp, layers"):
        recompute(tiny_llama(), "everything")
