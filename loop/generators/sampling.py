"""Sampling math shared by the `hf` generator's paths, and its reference path.

`pick_tokens` samples each row of a batch of next-token logits with its own temperature, top_p,
stop ids and seed, recording `log q(token)` under the distribution sampled from (log-softmax of
logits / temperature, renormalised over the top-p nucleus; at temperature 0, greedy, the
model's log-prob at temperature 1). `sample_batch` is the reference path: one static,
left-padded batch through the plain transformers forward with its own KV cache. The engine
(`engine.py`) must give the same tokens and log-probs (tests/loop/test_kv_reuse.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from loop.generators.base import FinishReason, Generation, SamplingParams


def sample_batch(
    model: Any,
    prompts: list[list[int]],
    params: list[SamplingParams],
    *,
    pad_token_id: int,
    device: torch.device,
) -> list[Generation]:
    """Sample a continuation of each prompt; rows are independent (left padding is masked).

    One prefill over the (B, L) left-padded prompts (logits of the last position only), then
    one (B, 1) decode step per token with the KV cache. Call under `torch.no_grad()` in eval
    mode. Rows that are done keep decoding (their tokens are dropped) until all are done.
    """
    input_ids, attention_mask = left_pad(prompts, pad_token_id, device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
    )
    rngs = [seeded_rng(p.seed, device) for p in params]
    sampled: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    finish: list[FinishReason | None] = [None for _ in prompts]
    next_position = position_ids[:, -1:] + 1  # (B, 1)
    while True:
        tokens = pick_tokens(out.logits[:, -1], params, rngs, sampled, logprobs, finish)
        if all(reason is not None for reason in finish):
            break
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones(len(prompts), 1)], 1)
        out = model(
            input_ids=tokens[:, None],
            attention_mask=attention_mask,
            position_ids=next_position,
            past_key_values=out.past_key_values,
            use_cache=True,
        )
        next_position = next_position + 1
    return [
        Generation(token_ids=ids, logprobs=lps, finish_reason=reason or "length")
        for ids, lps, reason in zip(sampled, logprobs, finish, strict=True)
    ]


def left_pad(
    prompts: list[list[int]], pad_token_id: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """(B, L) input ids and attention mask, each prompt right-aligned (L = longest prompt)."""
    width = max(len(prompt) for prompt in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def pick_tokens(
    logits: Tensor,
    params: list[SamplingParams],
    rngs: list[torch.Generator | None],
    sampled: list[list[int]],
    logprobs: list[list[float]],
    finish: list[FinishReason | None],
) -> Tensor:
    """logits: (B, V) of the next token. Samples each unfinished row, records token, log-prob
    and finish reason in place; returns (B,) token ids to feed back (done rows repeat their
    last token, whose outputs are ignored).

    Each row draws from its own seeded generator (so a rollout's tokens do not depend on the
    rows beside it), but the draws and the log-prob lookups stay on the device and come back
    in one transfer per step: on a GPU a per-row `int()` would wait for the device twice a
    row (66 waits a step at 32 rows, measured by benchmarks/bench_gpu.py)."""
    temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
    row_logprobs = torch.log_softmax(logits.float() / temperatures[:, None], dim=-1)  # (B, V)
    active = [row for row, reason in enumerate(finish) if reason is None]
    draws: list[Tensor] = []
    chosen: list[Tensor] = []
    for row in active:
        p = params[row]
        if p.temperature > 0:
            dist = top_p_logprobs(row_logprobs[row], p.top_p)
            draw = torch.multinomial(dist.exp(), 1, generator=rngs[row])
        else:
            dist = row_logprobs[row]
            draw = dist.argmax().reshape(1)
        draws.append(draw)
        chosen.append(dist.gather(0, draw))
    if active:  # one transfer: the tokens (exact in float64) and their log-probs
        both = torch.cat([torch.cat(draws).double(), torch.cat(chosen).double()]).tolist()
        for row, token_f, logprob in zip(
            active, both[: len(active)], both[len(active) :], strict=True
        ):
            token, p = int(token_f), params[row]
            sampled[row].append(token)
            logprobs[row].append(logprob)
            if token in p.stop_token_ids:
                finish[row] = "stop"
            elif len(sampled[row]) >= p.max_new_tokens:
                finish[row] = "length"
    return torch.tensor([ids[-1] for ids in sampled], device=logits.device)


def top_p_logprobs(logprobs: Tensor, top_p: float) -> Tensor:
    """(V,) log-probs -> the nucleus distribution: the smallest set of most likely tokens whose
    mass reaches top_p, renormalised; -inf elsewhere. top_p == 1 returns the input."""
    if top_p >= 1.0:
        return logprobs
    sorted_logprobs, order = logprobs.sort(descending=True)
    mass_before = sorted_logprobs.exp().cumsum(0) - sorted_logprobs.exp()
    keep_sorted = mass_before < top_p  # the first token is always kept
    kept = torch.full_like(logprobs, float("-inf"))
    kept[order[keep_sorted]] = logprobs[order[keep_sorted]]
    return kept - torch.logsumexp(kept, dim=0)


def seeded_rng(seed: int | None, device: torch.device) -> torch.Generator | None:
    """A generator seeded for one request (None: torch's global one)."""
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)
