"""The `hf` generator: samples with the training model object itself, batching concurrent calls.

Exactly one copy of the weights: the generator runs the policy's own model, so it always
samples from the current learner weights (LoRA included).

1. `generate` checks the prompt and queues a request; a background asyncio task (the batcher)
   takes up to `max_batch_size` requests, waiting at most `batch_wait_s` for more.
2. The batch runs in one worker thread, so the event loop stays free: left-padded prompts,
   position ids counting only real tokens, one prefill, then one decode step per token with
   the KV cache. The model is in eval mode under `torch.no_grad()` with `use_cache=True`
   (transformers skips gradient checkpointing in eval mode); each module's training flag is
   restored afterwards.
3. Our own sampling loop treats each row with its own temperature, top_p, stop ids and seed,
   so each log-prob is exactly `log q(token)` under the distribution sampled from
   (log-softmax of logits / temperature, renormalised over the top-p nucleus). At
   temperature 0 (greedy) it is the model's log-prob at temperature 1.
4. A row ends at its first sampled stop id (kept) or at `max_new_tokens`; nothing after the
   stop id and no padding is returned.

If a batch fails, each of its requests is retried alone, so only requests that fail on their
own get a `GeneratorError`; the batcher keeps serving. Batching is static: requests arriving
during a batch wait for the next. Use one event loop at a time per generator.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from loop.generators.base import FinishReason, Generation, GeneratorError, SamplingParams
from loop.policy import Policy


@dataclass
class _Request:
    prompt_token_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]


class HFGenerator:
    """An async, batched sampler over the policy's own model (see the module docstring)."""

    name = "hf"

    def __init__(self, policy: Policy, *, max_batch_size: int = 8, batch_wait_s: float = 0.01):
        if max_batch_size < 1 or batch_wait_s < 0:
            raise ValueError(f"bad batching: max_batch_size={max_batch_size}, wait={batch_wait_s}")
        self.policy = policy
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.batches_run = 0  # batched sampling runs (one prefill + decode steps each)
        self.requests_served = 0
        self.tokens_generated = 0
        self._vocab_size = policy.model.get_input_embeddings().num_embeddings
        self._pad_id = _pad_token_id(policy)
        self._model_lock = threading.Lock()  # one user of the weights at a time (load_adapter)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-generator")
        self._queue: asyncio.Queue[_Request] | None = None
        self._batcher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """Sample one continuation of `prompt_token_ids` (`messages` is ignored)."""
        if self._closed:
            raise GeneratorError("hf generator is closed")
        self._check_prompt(prompt_token_ids)
        queue = self._ensure_batcher()
        future: asyncio.Future[Generation] = asyncio.get_running_loop().create_future()
        await queue.put(_Request(list(prompt_token_ids), params, future))
        return await future

    def load_adapter(self, path: Path | None) -> None:
        """None: no-op (the learner trains this very model, so its weights are already current).

        A path: copy that peft adapter directory's LoRA weights into the policy's peft model,
        which is also the learner's model (one copy). Waits for a running batch to finish.
        """
        if path is None:
            return
        if not self.policy.is_lora:
            raise ValueError("load_adapter(path) needs a LoRA policy: load_policy(..., lora=...)")
        if not Path(path).is_dir():
            raise ValueError(f"adapter directory {path} does not exist")
        from peft.utils import load_peft_weights, set_peft_model_state_dict

        weights = load_peft_weights(str(path), device=str(self.policy.device))
        with self._model_lock:
            try:
                result: Any = set_peft_model_state_dict(self.policy.model, weights)
            except RuntimeError as exc:  # shape mismatch: another rank or base model
                raise ValueError(f"adapter {path} does not fit: {_one_line(exc)}") from None
        missing = [k for k in result.missing_keys if "lora_" in k]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"adapter {path} does not match this model's LoRA: "
                f"{len(result.unexpected_keys)} unexpected, {len(missing)} missing tensors"
            )

    async def close(self) -> None:
        """Stop the batcher; queued and running requests get a `GeneratorError`."""
        self._closed = True
        batcher, self._batcher = self._batcher, None
        if batcher is not None and not batcher.done():
            with contextlib.suppress(RuntimeError):  # its loop may be closed already
                batcher.cancel()
            if self._loop is asyncio.get_running_loop():
                with contextlib.suppress(asyncio.CancelledError):
                    await batcher
        if self._queue is not None:
            while not self._queue.empty():
                _fail(self._queue.get_nowait(), GeneratorError("hf generator closed"))
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _check_prompt(self, prompt_token_ids: list[int]) -> None:
        if not prompt_token_ids:
            raise GeneratorError("empty prompt: at least one token id is needed")
        bad = [t for t in prompt_token_ids if not 0 <= t < self._vocab_size]
        if bad:
            raise GeneratorError(f"prompt token ids outside [0, {self._vocab_size}): {bad[:5]}")

    def _ensure_batcher(self) -> asyncio.Queue[_Request]:
        """The queue of the batcher on the running loop, starting one if needed."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._batcher is None or self._loop is not loop:
            self._loop, self._queue = loop, asyncio.Queue()
            self._batcher = loop.create_task(self._run_batcher(self._queue), name="hf-batcher")
        return self._queue

    async def _run_batcher(self, queue: asyncio.Queue[_Request]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._collect_batch(queue)
            batch = [request for request in batch if not request.future.done()]  # cancelled
            if not batch:
                continue
            try:
                outcomes = await loop.run_in_executor(self._executor, self._serve, batch)
            except asyncio.CancelledError:
                for request in batch:
                    _fail(request, GeneratorError("hf generator closed during generation"))
                raise
            for request, outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, Generation):
                    if not request.future.done():
                        request.future.set_result(outcome)
                else:
                    _fail(request, outcome)

    async def _collect_batch(self, queue: asyncio.Queue[_Request]) -> list[_Request]:
        batch = [await queue.get()]
        deadline = asyncio.get_running_loop().time() + self.batch_wait_s
        while len(batch) < self.max_batch_size:
            if not queue.empty():
                batch.append(queue.get_nowait())
                continue
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                break
            try:
                batch.append(await asyncio.wait_for(queue.get(), remaining))
            except TimeoutError:
                break
        return batch

    def _serve(self, batch: list[_Request]) -> list[Generation | GeneratorError]:
        """Worker thread: the batch at once; if that fails, each request alone."""
        try:
            return list(self._sample_batch(batch))
        except Exception as exc:
            if len(batch) == 1:
                return [GeneratorError(f"hf generation failed: {_one_line(exc)}")]
        return [outcome for request in batch for outcome in self._serve([request])]

    def _sample_batch(self, batch: list[_Request]) -> list[Generation]:
        with self._model_lock, _sampling_mode(self.policy.model):
            generations = sample_batch(
                self.policy.model,
                [request.prompt_token_ids for request in batch],
                [request.params for request in batch],
                pad_token_id=self._pad_id,
                device=self.policy.device,
            )
        self.batches_run += 1
        self.requests_served += len(batch)
        self.tokens_generated += sum(len(g.token_ids) for g in generations)
        return generations


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
    input_ids, attention_mask = _left_pad(prompts, pad_token_id, device)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=True,
        logits_to_keep=1,
    )
    rngs = [_rng(p.seed, device) for p in params]
    sampled: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    finish: list[FinishReason | None] = [None for _ in prompts]
    next_position = position_ids[:, -1:] + 1  # (B, 1)
    while True:
        tokens = _pick_tokens(out.logits[:, -1], params, rngs, sampled, logprobs, finish)
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


def _left_pad(
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


def _pick_tokens(
    logits: Tensor,
    params: list[SamplingParams],
    rngs: list[torch.Generator | None],
    sampled: list[list[int]],
    logprobs: list[list[float]],
    finish: list[FinishReason | None],
) -> Tensor:
    """logits: (B, V) of the next token. Samples each unfinished row, records token, log-prob
    and finish reason in place; returns (B,) token ids to feed back (done rows repeat their
    last token, whose outputs are ignored)."""
    temperatures = torch.tensor([p.temperature or 1.0 for p in params], device=logits.device)
    row_logprobs = torch.log_softmax(logits.float() / temperatures[:, None], dim=-1)  # (B, V)
    tokens = []
    for row, p in enumerate(params):
        if finish[row] is not None:
            tokens.append(sampled[row][-1])
            continue
        dist = _top_p(row_logprobs[row], p.top_p) if p.temperature > 0 else row_logprobs[row]
        if p.temperature > 0:
            token = int(torch.multinomial(dist.exp(), 1, generator=rngs[row]))
        else:
            token = int(dist.argmax())
        sampled[row].append(token)
        logprobs[row].append(float(dist[token]))
        if token in p.stop_token_ids:
            finish[row] = "stop"
        elif len(sampled[row]) >= p.max_new_tokens:
            finish[row] = "length"
        tokens.append(token)
    return torch.tensor(tokens, device=logits.device)


def _top_p(logprobs: Tensor, top_p: float) -> Tensor:
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


@contextlib.contextmanager
def _sampling_mode(model: Any) -> Iterator[None]:
    """Eval mode and no grad while sampling; each module's training flag restored after."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for module, training in flags:
            module.training = training


def _rng(seed: int | None, device: torch.device) -> torch.Generator | None:
    return None if seed is None else torch.Generator(device=device).manual_seed(seed)


def _pad_token_id(policy: Policy) -> int:
    """Padded positions are masked, so any id works; the tokenizer's pad (or eos) id if any."""
    pad = getattr(policy.tokenizer, "pad_token_id", None)
    pad = getattr(policy.tokenizer, "eos_token_id", None) if pad is None else pad
    return int(pad) if pad is not None else 0


def _fail(request: _Request, error: Exception) -> None:
    if not request.future.done():
        request.future.set_exception(error)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
