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


class GeneratorError(RuntimeError):
    """A backend failed to generate (the rollout ends with status `generator_error`)."""


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

    async def close(self) -> None:
        """Release the backend's resources."""
        ...
