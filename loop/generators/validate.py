"""One check of every generation that crosses a wire, before it reaches a trajectory.

A server is a peer we do not control: a bug, a version skew or a proxy can answer anything, and
what it answers becomes training data. The ids are the tokens the loss is taken over (the
learner's embedding lookup stops the run on one outside the vocabulary), the log-probs feed the
importance weights and, with `old_logprobs: sampler`, the PPO ratio, and the text is the code
that runs and earns the reward. loop/generators/openai.py (and so vllm_server, whose clients it
makes) passes every answer through `check_answer`, which holds it to these rules, each named in
the `InvalidGenerationError` it raises (the rollout ends `invalid_generation`: excluded from
training, counted, never the run's end):

- `model`: the answer's `model` field is the requested model or adapter name (or a hosted
  endpoint's dated snapshot of it, `gpt-4o-2024-08-06` for `gpt-4o`): an answer from another
  version would be trained as the one requested.
- `id_type`: every id is an int (not a bool, a float or a string).
- `id_range`: 0 <= id < the tokenizer's vocabulary size, added tokens included.
- `text`: the server's text says what its ids print. The text a rollout keeps (the code that
  runs) is always re-derived from the ids, `decode(ids, skip_special_tokens=True)` as the hf
  backend does, so the code that runs is the code trained on whatever the server wrote; the
  server's text is a witness, compared with the ids' text with special-token texts, whitespace
  and U+FFFD left out on both sides (detokenisers differ there: vLLM omits a stop token's text,
  chat skips special tokens, a cut multi-byte character is held back). Any other difference
  means the server does not say what it sampled, and the answer is refused.
- `logprob_count`: exactly one log-prob per id (every request asks for them).
- `logprob_value`: each a real number (not a bool), finite, and <= `LOGPROB_TOLERANCE` (1e-4:
  a probability is at most 1; the slack covers a server's float32 rounding of log(1)).
- `length`: at most the request's `max_new_tokens` ids.
- `finish_reason`: `length` only with exactly `max_new_tokens` ids; `stop` only when the last
  id is one of the request's stop ids (token-id requests send them and `ignore_eos`), unless
  the request left stopping to the server (stop strings in the plain fallback, the model's own
  EOS ids in chat: the server cut the string off or its EOS ids are not ours to know).

An answer without ids (a text-only server) is re-tokenised by the client and marked not
token-exact; only `model` applies to it (its ids are our own tokenizer's). The client also
refuses an answer of the wrong shape: a text that is no string (`text`), ids or log-probs that
are no list (`id_type`, `logprob_count`), any other field of a type its reading cannot use
(`shape`). Without a tokenizer,
`id_range` and `text` cannot be checked and are skipped. Pure: no I/O, no state.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from loop.generators.base import FinishReason, InvalidGenerationError, SamplingParams
from loop.generators.tokenizer import Tokenizer

LOGPROB_TOLERANCE = 1e-4  # the largest log-prob accepted (float32 rounding of log(1))
REAL = frozenset({int, float})  # exact types: a bool is an int subclass, and no log-prob
SNAPSHOT = re.compile(r"-\d{4}-\d{2}-\d{2}")  # a hosted model's dated snapshot suffix


@dataclass(frozen=True)
class Vocabulary:
    """What the checks need of a tokenizer, read once: its size (added tokens included),
    `decode`, and its special-token texts."""

    size: int
    decode: Callable[..., Any]
    specials: tuple[str, ...]

    @classmethod
    def of(cls, tokenizer: Tokenizer, specials: Iterable[str]) -> Vocabulary:
        """The vocabulary of `tokenizer`, `specials` its special-token texts, longest first."""
        return cls(len(tokenizer), tokenizer.decode, tuple(specials))

    def printed(self, text: str) -> str:
        """`text` as the `text` rule compares it: no special-token text, whitespace or U+FFFD."""
        for special in self.specials:  # `in` first: most texts hold none, and it is a fast scan
            if special in text:
                text = text.replace(special, "")
        return "".join(text.replace("\ufffd", "").split())


@dataclass(frozen=True)
class Answer:
    """One server's sampled tokens as they came off the wire, nothing trusted yet."""

    server: str  # who answered (its URL), for the error
    text: str
    token_ids: list[Any]
    logprobs: list[Any] | None
    finish_reason: FinishReason


@dataclass(frozen=True)
class Checked:
    """An answer that passed: typed ids and log-probs, and the text the ids print."""

    token_ids: list[int]
    logprobs: list[float]
    text: str


def check_model(server: str, requested: str, answered: Any) -> None:
    """The `model` rule: `answered` (the response's field) names `requested`."""
    if answered == requested:
        return
    snapshot = isinstance(answered, str) and answered.startswith(requested)
    if not (snapshot and SNAPSHOT.fullmatch(answered[len(requested) :])):
        detail = f"asked for model {requested!r}, the answer names {answered!r}"
        raise InvalidGenerationError(server, "model", answered, detail)


def check_answer(
    answer: Answer, params: SamplingParams, vocab: Vocabulary | None, *, server_stops: bool
) -> Checked:
    """`answer` held to the rules of the module docstring; `InvalidGenerationError` names the
    first one broken. `server_stops`: the request left stopping to the server (a `stop` needs
    no stop id of ours)."""
    ids, server = answer.token_ids, answer.server
    # bool is a subclass of int: the set of exact types refuses it, as it refuses floats and str
    if ids and set(map(type, ids)) != {int}:
        at, value = next((i, t) for i, t in enumerate(ids) if type(t) is not int)
        detail = f"token id {value!r} ({type(value).__name__}) at position {at} is not an int"
        raise InvalidGenerationError(server, "id_type", value, detail)
    size = vocab.size if vocab is not None else math.inf
    if ids and not (min(ids) >= 0 and max(ids) < size):
        at, value = next((i, t) for i, t in enumerate(ids) if not 0 <= t < size)
        detail = f"token id {value} at position {at} is outside the vocabulary [0, {size})"
        raise InvalidGenerationError(server, "id_range", value, detail)
    logprobs = _checked_logprobs(server, answer.logprobs, len(ids))
    _check_length(answer, params, server_stops=server_stops)
    text = answer.text
    if vocab is not None:
        text = vocab.decode(ids, skip_special_tokens=True)
        said, printed = vocab.printed(answer.text), vocab.printed(text)
        if said != printed:
            pairs = zip(said, printed, strict=False)
            at = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(said), len(printed)))
            shown, ids_show = said[at : at + 40], printed[at : at + 40]
            detail = f"text and ids differ at printed character {at}: {shown!r} vs {ids_show!r}"
            raise InvalidGenerationError(server, "text", answer.text[:200], detail)
    return Checked(ids, logprobs, text)


def _checked_logprobs(server: str, values: list[Any] | None, count: int) -> list[float]:
    """The `logprob_count` and `logprob_value` rules; the values as floats."""
    given = len(values) if values is not None else 0
    if values is None or given != count:
        detail = f"{given} log-probs for {count} token ids (one per id was asked for)"
        raise InvalidGenerationError(server, "logprob_count", given, detail)
    if not set(map(type, values)) <= REAL:
        at, value = next((i, v) for i, v in enumerate(values) if type(v) not in REAL)
        detail = f"log-prob {value!r} at {at}: not a real number (a bool, a string, None)"
        raise InvalidGenerationError(server, "logprob_value", value, detail)
    floats = _floats(values)
    # one pass each: a sum is finite only without NaN and inf (short of overflow, which the
    # loop below lets pass), then the maximum; the loop only names the offender
    top = max(floats, default=0.0) if floats is not None else math.inf
    if floats is not None and math.isfinite(sum(floats)) and top <= LOGPROB_TOLERANCE:
        return floats
    for at, value in enumerate(values):
        number = _floats([value])
        if number is None or not -math.inf < number[0] <= LOGPROB_TOLERANCE:
            detail = f"log-prob {value!r} at {at}: not a finite real <= {LOGPROB_TOLERANCE}"
            raise InvalidGenerationError(server, "logprob_value", value, detail)
    assert floats is not None, "a value that overflows a float is refused above"
    return floats


def _floats(values: list[int | float]) -> list[float] | None:
    """`values` as floats; None when one is an int too large for a float (JSON ints are
    unbounded)."""
    try:
        return [float(v) for v in values]
    except OverflowError:
        return None


def _check_length(answer: Answer, params: SamplingParams, *, server_stops: bool) -> None:
    """The `length` and `finish_reason` rules."""
    count, limit, ids = len(answer.token_ids), params.max_new_tokens, answer.token_ids
    if count > limit:
        detail = f"{count} tokens for max_new_tokens={limit}"
        raise InvalidGenerationError(answer.server, "length", count, detail)
    if answer.finish_reason == "length" and count != limit:
        detail = f"finish_reason 'length' after {count} tokens of max_new_tokens={limit}"
        raise InvalidGenerationError(answer.server, "finish_reason", "length", detail)
    stops = params.stop_token_ids
    if answer.finish_reason == "stop" and not server_stops and not (ids and ids[-1] in stops):
        last = ids[-1] if ids else None
        detail = f"finish_reason 'stop' but the last token id {last} is no stop id {list(stops)}"
        raise InvalidGenerationError(answer.server, "finish_reason", "stop", detail)
