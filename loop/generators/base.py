"""The one interface every generation backend honours: token ids in, sampled ids and log-probs out.

Token in, token out: a generator never sees text it must re-tokenise. It receives the exact
prompt token ids of a trajectory prefix and returns the ids it sampled, exactly as sampled
(the stop token included when one was sampled), with the log-probability of each sampled id
under the sampling distribution (temperature applied). Many rollouts call `generate`
concurrently; a backend batches those calls as it sees fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

FinishReason = Literal["stop", "length"]
PromptAs = Literal["token_ids", "text", "messages"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one turn."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()  # any of these ends the turn (it is kept as sampled)
    seed: int | None = None  # per-request seed where the backend supports it
    # the published weights to sample, as the generator names them (`Generator.version` when
    # the rollout's group was dispatched); None: the newest. Only a backend that keeps several
    # versions (vllm_server) honours an older one; the trainer pins only with such a backend.
    version: str | None = None
    # True on a rollout's last turn: no later prompt extends this one, so a generator that
    # keeps a turn's keys and values for the rollout's next turn (hf) keeps none
    last_turn: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"bad temperature/top_p: {self.temperature}, {self.top_p}")


@dataclass(frozen=True)
class Generation:
    """What a backend sampled for one prompt."""

    token_ids: list[int]  # as sampled; ends with the stop token when finish_reason == "stop"
    logprobs: list[float] | None  # one per token_ids entry; None where the backend gives none
    finish_reason: FinishReason
    text: str | None = None  # decoded text, where the backend gives it (openai)
    # False when token_ids were not sampled as such: the server's text re-tokenised, or a text
    # prompt that carried forged special tokens (openai's text modes); the rollout is marked
    token_exact: bool = True
    # special-token texts the agent's text carried into a text-mode prompt (openai)
    forged_special_tokens: int = 0
    # the published weights this request sampled (vllm_server: `Generator.version` names)
    adapter_version: str | None = None
    server: int | None = None  # which of several servers answered (vllm_server)
    cached_tokens: int | None = None  # prompt tokens the engine found cached, where it says
    prompt_as: PromptAs | None = None  # how the prompt went to an endpoint (openai)


@dataclass
class EngineWork:
    """Where an engine's time went, cumulative (the hf engine counts it; the trainer logs each
    stage's share)."""

    decode_s: float = 0.0  # decode steps, their sampling included
    decode_steps: int = 0
    decoded_rows: int = 0  # rows summed over the decode steps (/ steps: the mean batch)
    prefill_s: float = 0.0  # prompts, glue and observations run before a row decodes
    prefill_tokens: int = 0

    def since(self, before: EngineWork, prefix: str) -> dict[str, float]:
        """The work done since `before` as `<prefix>decode_s` and so on."""
        steps = self.decode_steps - before.decode_steps
        return {
            f"{prefix}decode_s": self.decode_s - before.decode_s,
            f"{prefix}prefill_s": self.prefill_s - before.prefill_s,
            f"{prefix}prefill_tokens": float(self.prefill_tokens - before.prefill_tokens),
            f"{prefix}decode_rows_mean": (self.decoded_rows - before.decoded_rows) / max(steps, 1),
        }


@dataclass(frozen=True)
class GeneratorStats:
    """A generator's cumulative counters at one moment (`Generator.stats()`): the trainer logs
    the difference between two readings. None where the backend has no such counter."""

    engine: EngineWork | None = None  # hf: its engine's decode and prefill work
    server_idle_s: float | None = None  # vllm_server: seconds no request was in flight (mean)
    server_failures: int | None = None  # vllm_server: servers that left routing (died, refused)
    server_restarts: int | None = None  # vllm_server: started servers restarted
    requests_resent: int | None = None  # vllm_server: requests re-sent after their server died
    server_stalls: int | None = None  # vllm_server: servers that stopped answering (left routing)
    adapters_republished: int | None = None  # vllm_server: servers that lost their adapters

    def work_since(self, before: GeneratorStats, prefix: str) -> dict[str, float]:
        """The engine's work since `before` as `<prefix>decode_s` and so on ({}: none counted)."""
        if self.engine is None or before.engine is None:
            return {}
        return self.engine.since(before.engine, prefix)

    def servers_since(self, before: GeneratorStats, elapsed_s: float) -> dict[str, float]:
        """The servers' counters since `before`: `time/server_idle_s` and its share of
        `elapsed_s`, `servers/failures`, `servers/restarts`, `servers/resent_requests`,
        `servers/stalls`, `servers/republished` ({}: not counted)."""
        if self.server_idle_s is None or before.server_idle_s is None:
            return {}
        idle = self.server_idle_s - before.server_idle_s
        metrics = {"time/server_idle_s": idle, "time/server_idle_share": idle / elapsed_s}
        counters = {
            "servers/failures": (self.server_failures, before.server_failures),
            "servers/restarts": (self.server_restarts, before.server_restarts),
            "servers/resent_requests": (self.requests_resent, before.requests_resent),
            "servers/stalls": (self.server_stalls, before.server_stalls),
            "servers/republished": (self.adapters_republished, before.adapters_republished),
        }
        for key, (now, then) in counters.items():
            if now is not None and then is not None:
                metrics[key] = float(now - then)
        return metrics


class GeneratorError(RuntimeError):
    """A backend failed to generate (the rollout ends with status `generator_error`)."""


class InvalidGenerationError(GeneratorError):
    """A server's answer broke a rule of loop/generators/validate.py: the server's fault, so
    the rollout ends with status `invalid_generation` (excluded, counted), never the run.
    `rule` names the rule, `server` the answering endpoint, `value` the offending value."""

    def __init__(self, server: str, rule: str, value: object, detail: str):
        super().__init__(f"{server} answered an invalid generation ({rule}): {detail}")
        self.server, self.rule, self.value = server, rule, value


@runtime_checkable
class Generator(Protocol):
    """An async, batched token-level sampler."""

    name: str
    # True when it samples with the training model's own parameters (hf: one copy), so new
    # weights need no publication; False when it keeps its own copy and loads adapters.
    shares_weights: bool

    @property
    def version(self) -> str:
        """The name of the weights a request without `SamplingParams.version` samples now: a
        new name after each `load_adapter` where the backend keeps versions (vllm_server,
        whose `Generation.adapter_version` names the one a request used)."""
        ...

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """Sample one continuation of `prompt_token_ids`.

        `messages` is the same prefix as chat messages, for backends that only take chat
        (a hosted OpenAI-compatible model); token-level backends ignore it.
        """
        ...

    def load_adapter(self, path: Path | None) -> None:
        """Sample from the base weights plus this LoRA adapter from now on (None: base only)."""
        ...

    def release_memory(self) -> None:
        """Free what sampling holds between requests (caches) for the learner's step, which
        the trainer calls before; sampling rebuilds what it needs (a no-op for a backend
        whose memory is not the learner's)."""
        ...

    def stats(self) -> GeneratorStats:
        """Its counters now (cumulative; a copy): the trainer logs `gen/*` (the engine's work
        while collecting, `gen/eval_*` while evaluating) and `time/server_idle_*` from them."""
        ...

    async def close(self) -> None:
        """Release the backend's resources."""
        ...
