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

# `draw_tokens` searches blocks of this many tokens, then a block (any size works; 256 keeps
# both levels' arrays small at a 49K-152K vocabulary)
DRAW_BLOCK = 256


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
    rngs = [seeded_rng(p.seed) for p in params]
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

    Each sampled row draws one uniform number from its own seeded generator, a CPU one
    (`seeded_rng`), so a rollout's tokens do not depend on the rows beside it nor on the
    device; the uniforms go to the device in one transfer and the tokens are found for all
    rows at once by inverse transform (`draw_tokens`): one draw, one gather and one transfer
    back per step, where a per-row draw launched kernels per row on a GPU (66 host-device
    waits a step at 32 rows before the transfers were batched, benchmarks/bench_gpu.py).
    The (B, V) work is three passes: the row maxima, one exp (the unnormalised
    probabilities, which the draw and the normaliser share) and their sums; a token's
    log-prob is its shifted logit minus the log of its row's sum, as a log-softmax gives it.
    """
    device = logits.device
    active = [row for row, reason in enumerate(finish) if reason is None]
    if not active:
        return torch.tensor([ids[-1] for ids in sampled], device=device)
    scores = logits.float()
    if len(active) < len(params):
        scores = scores.index_select(0, torch.tensor(active, device=device))
    temperatures = [params[row].temperature or 1.0 for row in active]  # greedy: at 1
    if any(t != 1.0 for t in temperatures):
        scores = scores / torch.tensor(temperatures, device=device)[:, None]
    greedy = [params[row].temperature == 0 for row in active]
    nucleus = [
        (index, params[row].top_p)
        for index, row in enumerate(active)
        if not greedy[index] and params[row].top_p < 1.0
    ]
    if nucleus:  # the rows' top-p distributions, as log-probs (-inf outside the nucleus)
        scores = scores.clone() if scores is logits else scores
        for index, top_p in nucleus:
            scores[index] = top_p_logprobs(torch.log_softmax(scores[index], -1), top_p)
    shifted = scores - scores.max(-1, keepdim=True).values  # (N, V), each row's max at 0
    weights = shifted.exp()
    if all(greedy):
        draws = shifted.argmax(-1)
    else:
        uniforms = torch.cat([
            torch.zeros(1, dtype=torch.float64) if is_greedy
            else torch.rand(1, generator=rngs[row], dtype=torch.float64)
            for row, is_greedy in zip(active, greedy, strict=True)
        ]).to(device)  # fmt: skip
        draws = draw_tokens(weights, uniforms)
        if any(greedy):
            draws = torch.where(torch.tensor(greedy, device=device), shifted.argmax(-1), draws)
    chosen = shifted.gather(1, draws[:, None]).squeeze(1) - weights.sum(-1).log()
    # one transfer: the tokens (exact in float64) and their log-probs
    both = torch.cat([draws.double(), chosen.double()]).tolist()
    broken = [
        row for row, logprob in zip(active, both[len(active) :], strict=True) if logprob != logprob
    ]
    if broken:  # NaN: the model gave NaN or only -inf logits (its weights, not the draw)
        raise ValueError(f"non-finite next-token logits in rows {broken[:5]} of {len(params)}")
    for row, token_f, logprob in zip(active, both[: len(active)], both[len(active) :], strict=True):
        token, p = int(token_f), params[row]
        sampled[row].append(token)
        logprobs[row].append(logprob)
        if token in p.stop_token_ids:
            finish[row] = "stop"
        elif len(sampled[row]) >= p.max_new_tokens:
            finish[row] = "length"
    return torch.tensor([ids[-1] for ids in sampled], device=device)


def draw_tokens(weights: Tensor, uniforms: Tensor) -> Tensor:
    """(N, V) non-negative weights (a distribution up to a factor per row) and (N,) uniforms
    in [0, 1) -> (N,) token ids, by inverse transform.

    Token v is drawn when u * total falls in [cdf[v-1], cdf[v]). One uniform and one
    vectorised search per row, where `torch.multinomial` draws an exponential per vocabulary
    entry (1.35 ms a row on a CPU core, benchmarks/README.md). The search runs in two levels:
    blocks of DRAW_BLOCK tokens, whose masses (float32 sums of 256 values, relative error
    about 1e-7) are accumulated in float64 to find the block, then the block's own float64
    cumulative sums to find the token (a float32 cumulative sum over 49,152 entries drifts by
    about 1e-4 of the mass, more than the least likely tokens hold). No (N, V) float64 array
    is made: one cost 5 ms a step at 8 rows on a CPU. A token of weight zero (outside a
    top-p nucleus) has an empty interval and is never drawn; each target stays below its
    total (rounding could reach it), so the search always lands on a token.
    """
    rows, vocab = weights.shape
    if vocab % DRAW_BLOCK:
        weights = torch.nn.functional.pad(weights, (0, DRAW_BLOCK - vocab % DRAW_BLOCK))
    blocks = weights.view(rows, -1, DRAW_BLOCK)  # (N, blocks, DRAW_BLOCK)
    block_cdf = blocks.sum(-1).double().cumsum(-1)  # (N, blocks)
    targets = _below(uniforms.double() * block_cdf[:, -1], block_cdf[:, -1])
    block = torch.searchsorted(block_cdf, targets[:, None], right=True)  # (N, 1)
    # clamped here and below: a row of NaN weights must still index inside the arrays (on a GPU
    # an index outside is a device-side assert); pick_tokens then refuses its NaN log-prob
    block = block.clamp(max=block_cdf.shape[1] - 1)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), 0.0)
    inside = blocks.gather(1, block[:, :, None].expand(-1, -1, DRAW_BLOCK)).squeeze(1)
    inside_cdf = inside.double().cumsum(-1)  # (N, DRAW_BLOCK)
    rest = _below(targets - before.squeeze(1), inside_cdf[:, -1])
    offset = torch.searchsorted(inside_cdf, rest[:, None], right=True).squeeze(1)
    return (block.squeeze(1) * DRAW_BLOCK + offset).clamp(max=vocab - 1)


def _below(values: Tensor, limits: Tensor) -> Tensor:
    """`values` capped just below `limits` (both float64, elementwise)."""
    return torch.minimum(values, torch.nextafter(limits, torch.zeros_like(limits)))


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


def seeded_rng(seed: int | None) -> torch.Generator | None:
    """A CPU generator seeded for one request (None: torch's global one); `pick_tokens` draws
    a row's uniforms from it on the CPU whatever the model's device."""
    return None if seed is None else torch.Generator().manual_seed(seed)
