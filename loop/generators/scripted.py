"""The `scripted` generator: replays given assistant messages as if the policy had sampled them.

Turn k of an episode returns the token ids of message k, followed by the chat template's stop
id, so the episode loop records it exactly as a sampled turn (`is_output`, turn boundaries,
glue). This is how demonstrations become token-exact agent episodes (loop/demos.py) and how the
inspector's demo and the tests play scripted rollouts through the real loop and sandbox.

A message is text, or a function of the conversation so far (the `messages` the episode loop
passes), so a scripted thought can quote what the environment just answered. Past the last
message the last one repeats. Log-probs are `logprob` for every id (a number, or a function
called once per id), or None (unknown) by default.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from loop.generators.base import FinishReason, Generation, GeneratorStats, SamplingParams
from loop.generators.tokenizer import Tokenizer

Message = str | Callable[[list[dict[str, str]]], str]


class ScriptedGenerator:
    """Plays one episode's script, one message per turn (see the module docstring)."""

    name = "scripted"
    shares_weights = False
    version = "scripted"  # the script is the policy

    def __init__(
        self,
        tokenizer: Tokenizer,
        messages: Sequence[Message],
        *,
        logprob: float | Callable[[], float] | None = None,
    ) -> None:
        if not messages:
            raise ValueError("a script needs at least one message")
        self.tokenizer, self.messages, self.logprob = tokenizer, list(messages), logprob
        self.turn = 0

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """The next message's ids (cut to `max_new_tokens`), ending with the stop id."""
        message = self.messages[min(self.turn, len(self.messages) - 1)]
        self.turn += 1
        text = message(list(messages or [])) if callable(message) else message
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        reason: FinishReason = "length"
        if params.stop_token_ids and len(ids) < params.max_new_tokens:
            ids, reason = [*ids, params.stop_token_ids[0]], "stop"
        ids = ids[: params.max_new_tokens]
        logprobs = None
        if self.logprob is not None:
            draw = self.logprob
            logprobs = [draw() if callable(draw) else draw for _ in ids]
        return Generation(ids, logprobs, reason)

    def load_adapter(self, path: Path | None) -> None:
        """Nothing to load: the script is the policy."""

    def stats(self) -> GeneratorStats:
        """No counters: it replays a script."""
        return GeneratorStats()

    def release_memory(self) -> None:
        """Nothing to free."""

    async def close(self) -> None:
        """Nothing to release."""
