"""`loop.learner.logprobs`: the chunked log-prob computation against its full-logits reference, by
hand, under padding, through peft, with tied embeddings, and its memory bound (chunks only).

Run: python -m pytest tests/loop/test_logprobs.py -q        (the SmolLM2 test is `slow`)
"""

from __future__ import annotations

import math

import pytest
import torch

from loop.learner.logprobs import logprobs_from_hidden, token_logprobs, token_logprobs_naive
from tests.loop.conftest import TINY_VOCAB, chat_prompt_ids, tiny_llama


def random_ids(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    """(batch, length) token ids of the tiny vocabulary."""
    return torch.randint(
        3, TINY_VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed)
    )


def test_uniform_head_gives_minus_log_vocab_by_hand() -> None:
    model = tiny_llama()
    torch.nn.init.zeros_(model.lm_head.weight)  # every logit 0: p = 1 / V for every token
    logprobs = token_logprobs(model, random_ids(2, 6), chunk_size=4)
    assert logprobs.shape == (2, 6) and logprobs.dtype == torch.float32
    assert torch.all(logprobs[:, 0] == 0.0), "position 0 has no context: 0.0 by convention"
    assert torch.allclose(logprobs[:, 1:], torch.full((2, 5), -math.log(TINY_VOCAB)))


@pytest.mark.parametrize("chunk_size", [1, 7, 64, 4096])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_equals_naive(chunk_size: int, temperature: float) -> None:
    model, input_ids = tiny_llama(), random_ids(3, 40)
    with torch.no_grad():
        chunked = token_logprobs(model, input_ids, chunk_size=chunk_size, temperature=temperature)
        naive = token_logprobs_naive(model, input_ids, temperature=temperature)
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)


def test_tied_embeddings_chunked_equals_naive() -> None:
    model, input_ids = tiny_llama(tie_word_embeddings=True), random_ids(2, 30)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    with torch.no_grad():
        chunked = token_logprobs(model, input_ids, chunk_size=9)
        naive = token_logprobs_naive(model, input_ids)
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)


def test_left_padding_does_not_change_real_tokens() -> None:
    model, row = tiny_llama(), random_ids(1, 12)
    padded = torch.cat([torch.full((1, 5), 2), row], dim=1)
    mask = torch.cat([torch.zeros(1, 5, dtype=torch.long), torch.ones(1, 12, dtype=torch.long)], 1)
    with torch.no_grad():
        alone = token_logprobs(model, row)
        in_batch = token_logprobs(model, padded, mask, chunk_size=4)
        naive = token_logprobs_naive(model, padded, mask)
    # the first real token has padding (masked) before it: compare from the second one on
    torch.testing.assert_close(in_batch[:, 6:], alone[:, 1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(in_batch[:, 6:], naive[:, 6:], atol=1e-5, rtol=0)


def test_peft_model_chunked_equals_naive_and_lora_matters() -> None:
    from peft import LoraConfig, get_peft_model

    base = tiny_llama()
    input_ids = random_ids(2, 25)
    with torch.no_grad():
        before = token_logprobs(base, input_ids)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    peft_model = get_peft_model(base, config)
    with torch.no_grad():
        chunked = token_logprobs(peft_model, input_ids, chunk_size=11)
        naive = token_logprobs_naive(peft_model, input_ids)
    torch.testing.assert_close(chunked, naive, atol=1e-5, rtol=0)
    assert (chunked - before).abs().max() > 1e-3, "the LoRA update must be applied"


def test_gradients_equal_naive() -> None:
    model, input_ids = tiny_llama(), random_ids(2, 20)
    token_logprobs(model, input_ids, chunk_size=6).sum().backward()
    chunked_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    token_logprobs_naive(model, input_ids).sum().backward()
    for name, param in model.named_parameters():
        torch.testing.assert_close(chunked_grads[name], param.grad, atol=1e-4, rtol=1e-4)


def test_positions_give_the_same_values_and_gradients_there_and_zero_elsewhere() -> None:
    model, input_ids = tiny_llama(), random_ids(2, 30)
    positions = torch.rand(2, 30, generator=torch.Generator().manual_seed(1)) < 0.4
    positions[:, 0] = False
    body = model.model
    rows_seen: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows_seen.append(args[0].shape[0]))

    def run(where: torch.Tensor | None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad()
        hidden = body(input_ids=input_ids).last_hidden_state
        out = logprobs_from_hidden(
            model, hidden, input_ids, chunk_size=5, temperature=1.0, positions=where
        )
        (out * positions).sum().backward()
        return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    full, full_grads = run(None)
    rows_seen.clear()
    picked, picked_grads = run(positions)
    assert sum(rows_seen) == 2 * int(positions.sum())  # the head saw only those rows
    torch.testing.assert_close(picked[positions], full[positions], atol=1e-5, rtol=0)
    assert torch.all(picked[~positions] == 0.0)
    for name, grad in full_grads.items():
        torch.testing.assert_close(picked_grads[name], grad, atol=1e-4, rtol=1e-4)


def test_head_only_ever_sees_one_chunk() -> None:
    model, chunk_size = tiny_llama(), 8
    rows_seen: list[int] = []
    model.lm_head.register_forward_hook(lambda _m, args, _out: rows_seen.append(args[0].shape[0]))
    token_logprobs(model, random_ids(4, 50), chunk_size=chunk_size).sum().backward()
    assert rows_seen and max(rows_seen) <= chunk_size, rows_seen  # forward and recomputation
    assert len(rows_seen) == 2 * math.ceil(4 * 49 / chunk_size)  # each chunk recomputed once


def test_single_token_sequence_is_all_zero() -> None:
    assert torch.equal(token_logprobs(tiny_llama(), random_ids(2, 1)), torch.zeros(2, 1))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"input_ids": torch.zeros(5, dtype=torch.long)}, r"input_ids must be \(B, T\)"),
        ({"attention_mask": torch.ones(2, 3)}, "attention_mask"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"temperature": 0.0}, "temperature"),
    ],
)
def test_bad_inputs_are_one_line_errors(kwargs: dict, message: str) -> None:
    args = {"input_ids": random_ids(2, 4)} | kwargs
    with pytest.raises(ValueError, match=message) as excinfo:
        token_logprobs(tiny_llama(), **args)
    assert "\n" not in str(excinfo.value)


@pytest.mark.slow
def test_smollm2_chunked_equals_naive(smollm2_policy) -> None:
    prompt = chat_prompt_ids(smollm2_policy.tokenizer, "Write a Python function adding 2 numbers.")
    input_ids = torch.tensor([prompt])
    with torch.no_grad():
        chunked = token_logprobs(smollm2_policy.model, input_ids, chunk_size=16)
        naive = token_logprobs_naive(smollm2_policy.model, input_ids)
    torch.testing.assert_close(chunked, naive, atol=1e-4, rtol=0)
