"""A request of the `hf` generator on its way between the caller's event loop and the worker
thread: what was asked (`Request`, checked and capped to the context by `check_prompt` and
`capped` before it is queued), the row decoding it (`Active`), and its result handed back to
the caller's loop (`deliver`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from loop.generators.base import FinishReason, Generation, GeneratorError, SamplingParams
from loop.generators.hf.engine import Row


@dataclass(eq=False)
class Request:
    """One `generate` call: its prompt and settings, and the future its caller awaits."""

    prompt_token_ids: list[int]
    params: SamplingParams
    future: asyncio.Future[Generation]
    loop: asyncio.AbstractEventLoop
    waited: bool = False  # it waited for room for its keys and values (kv_rows_mb)


@dataclass(eq=False)
class Active:
    """A request being decoded: its row in the engine and what it sampled so far."""

    request: Request
    row: Row
    rng: torch.Generator | None
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: FinishReason | None = None


def deliver(request: Request, outcome: Generation | Exception) -> None:
    """Complete the request's future on its own event loop (from the worker thread)."""

    def settle() -> None:
        if request.future.done():
            return
        if isinstance(outcome, Exception):
            request.future.set_exception(outcome)
        else:
            request.future.set_result(outcome)

    with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
        request.loop.call_soon_threadsafe(settle)


def check_prompt(prompt_token_ids: list[int], vocab_size: int) -> None:
    """Refuse an empty prompt or one with ids outside [0, `vocab_size`)."""
    if not prompt_token_ids:
        raise GeneratorError("empty prompt: at least one token id is needed")
    bad = [t for t in prompt_token_ids if not 0 <= t < vocab_size]
    if bad:
        raise GeneratorError(f"prompt token ids outside [0, {vocab_size}): {bad[:5]}")


def capped(
    prompt_length: int, params: SamplingParams, max_context_tokens: int | None
) -> SamplingParams:
    """`params` with `max_new_tokens` cut so that prompt + output fit `max_context_tokens`
    (a row's slot then never grows past it); a prompt that leaves no room is an error."""
    if max_context_tokens is None:
        return params
    room = max_context_tokens - prompt_length
    if room < 1:
        raise GeneratorError(
            f"prompt of {prompt_length} tokens leaves no room under "
            f"max_context_tokens={max_context_tokens}"
        )
    if params.max_new_tokens <= room:
        return params
    return dataclasses.replace(params, max_new_tokens=room)
