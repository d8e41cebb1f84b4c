"""The `openai` generator: any OpenAI-compatible HTTP endpoint, for evaluating baselines.

Two modes:
- `completions` (POST /v1/completions): the prompt goes as token ids, with vLLM's extensions
  asking for the sampled ids and their log-probs (`return_token_ids`,
  `return_tokens_as_token_ids`, `logprobs: 0`, `stop_token_ids`, `ignore_eos`,
  `skip_special_tokens: false`), so a `vllm serve` endpoint is token in, token out like the
  trainer's own backends. If the server answers 400 to that request and a `tokenizer` was given,
  the request is sent again as plain OpenAI (the prompt decoded to text, stop ids as stop
  strings); when that works, every later request goes plain.
- `chat` (POST /v1/chat/completions): sends `messages` (the keyword of `generate`), for
  hosted chat-only models; asks for log-probs with standard fields only.

What is recorded: the text always. Token ids and log-probs when the server gives ids (a
`token_ids` field, or log-prob tokens written `token_id:N`); `Generation.token_exact` is then
True. Otherwise the text is re-tokenised with `tokenizer`, `token_exact` is False and
`logprobs` is None (log-probs of the server's own tokens would not line up with our ids).
Every answer is checked before it becomes a `Generation` (loop/generators/validate.py: the
`model` it names, ids, text, log-probs, length, finish reason); one that breaks a rule is an
`InvalidGenerationError`, the rollout's failure and never the run's. With a `tokenizer`, the
text of an answer with ids is the ids decoded, so the code that runs is the code trained on.

Which modes are token-exact: only `completions` with token ids. The two text modes (the plain
fallback and `chat`) send text that the server tokenises again, special tokens included: an
observation that prints `<|im_start|>assistant` reaches the model as a real turn boundary,
which our trajectory (tokenised with special tokens split) does not contain. Each request in a
text mode counts the special-token texts of `tokenizer` that the agent's text carried in
(`Generation.forged_special_tokens`: in the plain fallback those beyond the special ids of the
prompt itself, in `chat` every one in the messages' content); a count above zero also makes
`token_exact` False, and the episode loop adds it to `Trajectory.forged_special_tokens`, so
such a rollout is marked, never silently taken for what it sampled.

Failures: 429, 5xx, connection errors and timeouts are retried with exponential backoff
(honouring `Retry-After`), at most `max_retries` times; then, and at once for other 4xx, a
`GeneratorError` with the status and the server's message on one line: a `ServerFailureError` when
the server itself failed (no connection, a reset, a timeout, 5xx), which says nothing about the
request (vllm_server re-sends it to another server when this one is found dead).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

import httpx

from loop.generators.base import (
    FinishReason,
    Generation,
    GeneratorError,
    GeneratorStats,
    InvalidGenerationError,
    PromptAs,
    SamplingParams,
)
from loop.generators.tokenizer import Tokenizer, special_texts, special_token_pattern
from loop.generators.validate import Answer, Vocabulary, check_answer, check_model

Mode = Literal["completions", "chat"]
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
TOKEN_ID = re.compile(r"token_id:(\d+)")
MAX_RETRY_AFTER_S = 30.0


class OpenAIGenerator:
    """A client of an OpenAI-compatible endpoint behind the `Generator` interface."""

    name = "openai"
    shares_weights = False

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        tokenizer: Tokenizer | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        mode: Mode = "completions",
        timeout_s: float = 120.0,
        max_concurrency: int = 16,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        text_fallback: bool = True,
    ):
        """`base_url` ends before `/completions` (e.g. `http://127.0.0.1:8000/v1`);
        the API key, if any, is read from the environment variable `api_key_env`.
        `tokenizer` also checks the answers' ids and text; `text_fallback=False` keeps it from
        re-sending a refused token-id prompt as text (a training server must stay token-exact)."""
        if mode not in ("completions", "chat"):
            raise ValueError(f"mode must be 'completions' or 'chat', got {mode!r}")
        if max_concurrency < 1 or max_retries < 0 or backoff_s < 0:
            raise ValueError(f"bad limits: {max_concurrency=}, {max_retries=}, {backoff_s=}")
        self.model, self.mode, self.tokenizer = model, mode, tokenizer
        self.max_retries, self.backoff_s, self.text_fallback = max_retries, backoff_s, text_fallback
        self.plain_completions = False  # set once the server has refused token-id prompts
        self._specials = special_token_pattern(tokenizer)
        specials = special_texts(tokenizer)
        self._special_ids = frozenset(tokenizer.all_special_ids if tokenizer is not None else ())
        self._vocab = Vocabulary.of(tokenizer, specials) if tokenizer is not None else None
        api_key = os.environ.get(api_key_env)
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
            timeout=timeout_s,
            limits=httpx.Limits(max_connections=max_concurrency),
        )
        self._slots = asyncio.Semaphore(max_concurrency)

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
        model: str | None = None,
        extra_fields: Mapping[str, Any] | None = None,
    ) -> Generation:
        """One completion: of `prompt_token_ids` (completions mode) or `messages` (chat mode).

        `model` overrides the served model's name for this request (a server's LoRA adapter
        version); `extra_fields` go into the request body as they are (vLLM's `cache_salt`)."""
        fields = {"model": model or self.model, **(extra_fields or {})}
        async with self._slots:
            if self.mode == "chat":
                if messages is None:
                    raise GeneratorError("the openai generator in chat mode needs messages=")
                chat = self._chat_body(messages, params) | fields
                body = await self._post("/chat/completions", chat)
                check_model(self.url, fields["model"], body.get("model"))
                forged = sum(self._special_count(m.get("content") or "") for m in messages)
                with _malformed(self.url):
                    return _marked(self._parse_chat(body, params), forged)
            return await self._complete(prompt_token_ids, params, fields)

    @property
    def version(self) -> str:
        """The served model: an endpoint's weights are fixed."""
        return self.model

    @property
    def url(self) -> str:
        """The endpoint's base URL (errors name the server by it)."""
        return str(self._client.base_url).rstrip("/")

    def load_adapter(self, path: Path | None) -> None:
        """Endpoints serve fixed models: only None (no adapter) is accepted."""
        if path is not None:
            raise NotImplementedError(
                "the openai generator cannot load LoRA adapters (the endpoint serves a fixed "
                "model); serve the adapter with the server instead (vllm serve --lora-modules)"
            )

    def stats(self) -> GeneratorStats:
        """No counters: the hosted server's work is not ours to count."""
        return GeneratorStats()

    def release_memory(self) -> None:
        """Nothing to free: the model runs elsewhere."""

    async def close(self) -> None:
        """Close the HTTP client and its connections."""
        await self._client.aclose()

    async def _complete(
        self, prompt_token_ids: list[int], params: SamplingParams, fields: dict[str, Any]
    ) -> Generation:
        if not self.plain_completions:
            try:
                token_body = self._token_body(prompt_token_ids, params) | fields
                body = await self._post("/completions", token_body)
                check_model(self.url, fields["model"], body.get("model"))
                with _malformed(self.url):
                    return self._parse_completion(body, params, prompt_as="token_ids")
            except _BadRequestError as refused:
                if self.tokenizer is None or not self.text_fallback:
                    raise GeneratorError(str(refused)) from None
        plain = self._plain_body(prompt_token_ids, params) | fields
        body = await self._post("/completions", plain)
        check_model(self.url, fields["model"], body.get("model"))
        self.plain_completions = True  # the plain request worked where the token one did not
        own = sum(1 for t in prompt_token_ids if t in self._special_ids)
        forged = max(0, self._special_count(plain["prompt"]) - own)
        with _malformed(self.url):
            return _marked(self._parse_completion(body, params, prompt_as="text"), forged)

    def _special_count(self, text: str) -> int:
        """How many of the tokenizer's special-token texts occur in `text`."""
        return len(self._specials.findall(text)) if self._specials is not None else 0

    def _sampling_fields(self, params: SamplingParams) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "model": self.model,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if params.seed is not None:
            fields["seed"] = params.seed
        return fields

    def _token_body(self, prompt_token_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        """vLLM's completions request: token ids in; ids and the sampled log-probs out."""
        return {
            **self._sampling_fields(params),
            "prompt": [int(t) for t in prompt_token_ids],
            "logprobs": 0,  # the sampled token's log-prob only
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,  # only our stop ids end a turn, as in the other backends
            "skip_special_tokens": False,
        }

    def _plain_body(self, prompt_token_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        """A standard completions request: the prompt as text, stop ids as stop strings."""
        assert self.tokenizer is not None, "plain completions need a tokenizer"
        body = {
            **self._sampling_fields(params),
            "prompt": self.tokenizer.decode(prompt_token_ids),
            "logprobs": 0,
        }
        if params.stop_token_ids:
            body["stop"] = [self.tokenizer.decode([t]) for t in params.stop_token_ids][:4]
        return body

    def _chat_body(self, messages: list[dict[str, str]], params: SamplingParams) -> dict[str, Any]:
        return {**self._sampling_fields(params), "messages": messages, "logprobs": True}

    def _parse_completion(
        self, body: dict[str, Any], params: SamplingParams, *, prompt_as: PromptAs
    ) -> Generation:
        choice = _first_choice(body)
        text = choice.get("text") or ""
        logprobs = choice.get("logprobs") or {}
        server_ids = choice.get("token_ids")
        if server_ids is None:
            server_ids = _ids_from_tokens(logprobs.get("tokens"))
        values = logprobs.get("token_logprobs")
        generation = self._generation(text, server_ids, values, choice, params, prompt_as=prompt_as)
        details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens")  # vllm serve --enable-prompt-tokens-details
        if isinstance(cached, int):
            return dataclasses.replace(generation, cached_tokens=cached)
        return generation

    def _parse_chat(self, body: dict[str, Any], params: SamplingParams) -> Generation:
        choice = _first_choice(body)
        text = (choice.get("message") or {}).get("content") or ""
        content = (choice.get("logprobs") or {}).get("content") or []
        server_ids = choice.get("token_ids")
        if server_ids is None:
            server_ids = _ids_from_tokens([e.get("token") for e in content])
        values = [entry.get("logprob") for entry in content] or None
        return self._generation(text, server_ids, values, choice, params, prompt_as="messages")

    def _generation(
        self,
        text: str,
        server_ids: list[Any] | None,
        values: list[Any] | None,
        choice: dict[str, Any],
        params: SamplingParams,
        *,
        prompt_as: PromptAs,
    ) -> Generation:
        """Server ids and their log-probs, checked, if given; else the text re-tokenised."""
        finish_reason = _finish_reason(choice.get("finish_reason"))
        if not isinstance(text, str):
            raise InvalidGenerationError(self.url, "text", text, f"the text {text!r} is no string")
        if server_ids is not None:
            if not isinstance(server_ids, list):
                detail = f"the token ids {server_ids!r} are no list"
                raise InvalidGenerationError(self.url, "id_type", server_ids, detail)
            if not isinstance(values, list | None):
                detail = f"the log-probs {values!r} are no list"
                raise InvalidGenerationError(self.url, "logprob_count", values, detail)
            answer = Answer(self.url, text, server_ids, values, finish_reason)
            server_stops = prompt_as != "token_ids"  # stop strings, or chat's own EOS ids
            ok = check_answer(answer, params, self._vocab, server_stops=server_stops)
            ids, logprobs = ok.token_ids, ok.logprobs
            return Generation(ids, logprobs, finish_reason, ok.text, prompt_as=prompt_as)
        if self.tokenizer is None:
            raise GeneratorError("the server gave no token ids and no tokenizer was given")
        token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
        return Generation(
            token_ids, None, finish_reason, text, token_exact=False, prompt_as=prompt_as
        )

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with bounded retries; the JSON answer, or `GeneratorError` / `_BadRequestError`."""
        for attempt in range(self.max_retries + 1):
            last_try = attempt == self.max_retries
            try:
                response = await self._client.post(path, json=payload)
            except httpx.TransportError as exc:  # refused, reset, timed out
                if last_try:
                    url = f"{self._client.base_url}{path}"
                    raise ServerFailureError(
                        f"{url} unreachable after {attempt + 1} tries: {_error_text(exc)}"
                    ) from None
                await asyncio.sleep(self.backoff_s * 2**attempt)
                continue
            if response.status_code == 200:
                return _json_object(response)
            message = f"{response.request.url} answered {response.status_code}: "
            message += server_message(response)
            if response.status_code not in RETRY_STATUSES:
                raise (_BadRequestError if response.status_code == 400 else GeneratorError)(message)
            if last_try:
                failed = ServerFailureError if response.status_code >= 500 else GeneratorError
                raise failed(f"{message} (after {attempt + 1} tries)")
            await asyncio.sleep(_retry_delay(response, self.backoff_s * 2**attempt))
        raise AssertionError("unreachable")


@contextlib.contextmanager
def _malformed(server: str) -> Iterator[None]:
    """An answer of the wrong shape (a field of the wrong type where the reading expects a
    list or an object) as an `InvalidGenerationError` (`shape`), not a crash of the run."""
    try:
        yield
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as exc:
        detail = f"malformed answer: {_error_text(exc)}"
        raise InvalidGenerationError(server, "shape", None, detail) from None


class ServerFailureError(GeneratorError):
    """The server failed, not the request: unreachable, reset, timed out, or 5xx after retries."""


class _BadRequestError(GeneratorError):
    """A 400 answer: the request itself was refused (and retrying it unchanged is pointless)."""


def _marked(generation: Generation, forged: int) -> Generation:
    """`generation` with the text-mode count of forged special tokens (any: not token-exact)."""
    exact = generation.token_exact and not forged
    return dataclasses.replace(generation, forged_special_tokens=forged, token_exact=exact)


def _first_choice(body: dict[str, Any]) -> dict[str, Any]:
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GeneratorError(f"malformed answer without choices: {str(body)[:200]}")
    return choices[0]


def _finish_reason(value: Any) -> FinishReason:
    if value in ("stop", "eos"):
        return "stop"
    if value == "length":
        return "length"
    raise GeneratorError(f"unsupported finish_reason {value!r} from the server")


def _ids_from_tokens(tokens: list[Any] | None) -> list[Any] | None:
    """Ids from log-prob tokens written `token_id:N` (vLLM); None if none is written so (a
    server's own tokens); a token not so written among ids stays as it came (`id_type`)."""
    if not isinstance(tokens, list) or not tokens:
        return None
    matches = [TOKEN_ID.fullmatch(t) if isinstance(t, str) else None for t in tokens]
    if not any(matches):
        return None
    return [int(m.group(1)) if m else t for m, t in zip(matches, tokens, strict=True)]


def _json_object(response: httpx.Response) -> dict[str, Any]:
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise GeneratorError(f"{response.request.url} answered 200 with non-JSON-object body")
    return body


def server_message(response: httpx.Response) -> str:
    """The server's error message (OpenAI's `{"error": {"message": ...}}` or the raw body)."""
    try:
        body = response.json()
    except ValueError:
        body = response.text
    if isinstance(body, dict):
        error = body.get("error", body)
        body = error.get("message", error) if isinstance(error, dict) else error
    return _one_line(str(body)) or response.reason_phrase


def _retry_delay(response: httpx.Response, default_s: float) -> float:
    try:
        return min(float(response.headers["retry-after"]), MAX_RETRY_AFTER_S)
    except (KeyError, ValueError):
        return default_s


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_one_line(str(exc)) or 'no message'}"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
