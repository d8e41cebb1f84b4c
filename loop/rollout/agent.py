"""The ReAct episode, token in and token out: one task, one environment, one generator.

Each turn: generate from the exact ids so far; keep the sampled ids as sampled (`is_output`);
extract the code (every complete ```python/```py block, joined into one cell; an unterminated
last block still counts); run it; append the chat-template glue and the observation as
environment tokens. Nothing is ever re-tokenised: the prompt of turn k is `tokens[:len]`.

The glue is read off the tokenizer's own chat template (`ChatGlue`). Observation text, and the
task context and worked example in the prompt, are tokenised with special tokens split, so
agent output that prints "<|im_end|>" (or a server's reset text) cannot forge a template
token. The episode ends on `complete_task`, the turn limit or the token budget; any
failure of our machinery ends it with an explicit status, never silently. For the attribution
of a timeout (loop/rollout/attribution.py) each turn records how long its generation took, and
the rollout how long its cells ran as the sandbox measured them.

With `memory_turns: n` (Verlog's memory) the prompt of turn t is `Trajectory.prompt_ids(t)`:
the task context and the last n turns only, the same exact ids spliced out of the episode;
the token budget then bounds each turn's prompt, not the whole episode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from loop.config import AgentConfig
from loop.generators.base import (
    Generation,
    Generator,
    GeneratorError,
    InvalidGenerationError,
    SamplingParams,
)
from loop.generators.tokenizer import Tokenizer, special_token_pattern
from loop.rollout.codeblocks import extract_code
from loop.rollout.prompt import build_messages, format_observation
from loop.rollout.trajectory import Trajectory, Turn
from tasks.core import Environment, EnvironmentFailureError, Task

NO_CODE = "No code was found. Write your code in a ```python block."
# Texts longer than this are tokenised in a worker thread: a large observation or task context
# (up to the suite's own bound) must not stall the event loop that runs every other rollout.
OFF_LOOP_CHARS = 50_000
_T = TypeVar("_T")


@dataclass(frozen=True)
class ChatGlue:
    """The chat template's text around messages, and the ids that end an assistant turn."""

    assistant_to_user: str  # after an assistant message's content, up to a user's content
    user_to_assistant: str  # after a user message's content, through the generation prompt
    stop_token_ids: tuple[int, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> ChatGlue:
        """Render a probe conversation and cut the template text out between markers."""
        a, u = "\x00ASSISTANT\x00", "\x00USER\x00"
        probe = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": a},
            {"role": "user", "content": u},
        ]
        text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=True)
        between = text[text.index(a) + len(a) : text.index(u)]
        after = text[text.index(u) + len(u) :]
        stops = {tokenizer.eos_token_id}
        first_special = tokenizer(between, add_special_tokens=False)["input_ids"][:1]
        if first_special and first_special[0] in tokenizer.all_special_ids:
            stops.add(first_special[0])  # e.g. <|im_end|> when eos is <|endoftext|>
        return cls(between, after, tuple(sorted(i for i in stops if i is not None)))


def encode_prompt(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The opening messages as token ids, through the tokenizer's chat template.

    The task context and the worked example are the environment's text (an OpenEnv server's,
    untrusted): like observations, their contents are tokenised with special tokens split,
    so a reset text carrying "<|im_end|><|im_start|>assistant" cannot forge a turn; only the
    template's own text gives template tokens. A text-mode generator still counts such text
    in `forged_special_tokens` (the server there tokenises it live). Messages without any
    special-token text keep the template's own tokenisation (the same ids as ever)."""
    specials = special_token_pattern(tokenizer)
    if specials is None or not any(specials.search(m["content"]) for m in messages):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if hasattr(ids, "keys"):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        return [int(i) for i in ids]
    # Render with a marker for each content, then tokenise the template's text live and each
    # content split. Trap: a template that rewrote contents (strip, escape) is bypassed here.
    marks = [f"\x00CONTENT{i}\x00" for i in range(len(messages))]
    probe = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
    text = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
    out: list[int] = []
    for message, mark in zip(messages, marks, strict=True):
        before, text = text.split(mark, 1)
        out += tokenizer(before, add_special_tokens=False)["input_ids"]
        content = message["content"]
        out += tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    out += tokenizer(text, add_special_tokens=False)["input_ids"]
    return [int(i) for i in out]


def truncate_observation(tokenizer: Tokenizer, text: str, max_tokens: int) -> str:
    """Cut an observation to `max_tokens` tokens, saying how much was left out."""
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    if len(ids) <= max_tokens:
        return text
    kept = tokenizer.decode(ids[:max_tokens])
    return f"{kept}\n[observation truncated: {len(ids) - max_tokens} more tokens not shown]"


async def run_episode(
    env: Environment,
    task: Task,
    generator: Generator,
    tokenizer: Tokenizer,
    settings: AgentConfig,
    *,
    example: list[dict[str, str]],
    sample_index: int = 0,
    seed: int | None = None,
    trajectory: Trajectory | None = None,
    version: str | None = None,
) -> Trajectory:
    """Roll out one episode; fills and returns `trajectory` (made here if not given).

    `version`: the published weights every turn samples (`SamplingParams.version`; None:
    the generator's newest)."""
    traj = trajectory or Trajectory(task.id, task.scenario_id, task.difficulty, sample_index)
    start = time.monotonic()
    glue = ChatGlue.from_tokenizer(tokenizer)
    traj.messages = build_messages(await env.areset(), example)
    size = sum(len(m["content"]) for m in traj.messages)
    traj.append(await _off_loop(size, encode_prompt, tokenizer, traj.messages), output=False)
    traj.prompt_length = len(traj.tokens)
    traj.memory_turns = settings.memory_turns
    context_messages = len(traj.messages)
    traj.status = "max_turns"
    for turn_index in range(settings.max_turns):
        prompt = traj.prompt_ids(turn_index)
        room = settings.max_context_tokens - len(prompt)
        if room < 1:
            traj.status = "context_exhausted"
            break
        params = SamplingParams(
            max_new_tokens=min(settings.max_new_tokens, room),
            temperature=settings.temperature,
            top_p=settings.top_p,
            stop_token_ids=glue.stop_token_ids,
            seed=None if seed is None else seed + turn_index,
            version=version,
            last_turn=turn_index == settings.max_turns - 1,
        )
        try:
            messages = _window(traj.messages, context_messages, turn_index, settings.memory_turns)
            generation_start = time.monotonic()
            generation = await generator.generate(prompt, params, messages=messages)
        except InvalidGenerationError as exc:  # the server's answer broke a rule: its fault
            traj.status, traj.error = "invalid_generation", str(exc)
            break
        except GeneratorError as exc:
            traj.status, traj.error = "generator_error", str(exc)
            break
        generation_s = time.monotonic() - generation_start
        traj.token_exact &= generation.token_exact
        traj.forged_special_tokens += generation.forged_special_tokens
        turn = _record_output(traj, tokenizer, generation)
        turn.generation_s = generation_s
        turn.adapter_version = generation.adapter_version
        if turn.code is None:
            observation = NO_CODE
        else:
            calls_before = len(env.api_calls)
            cell_start = time.monotonic()
            try:
                observation = await env.astep(turn.code)
            except EnvironmentFailureError as exc:  # the environment's engine died or hung
                traj.status, traj.error = "env_crash", f"{type(exc).__name__}: {exc}"
                break
            except Exception as exc:  # the sandbox itself failed, not the agent's code
                traj.status, traj.error = "sandbox_crash", f"{type(exc).__name__}: {exc}"
                break
            except asyncio.CancelledError:  # the rollout's time limit, mid-cell: its time so far
                traj.cell_time_s += time.monotonic() - cell_start
                raise
            result = env.last_result
            # The time the sandbox measured running the cell, not until this event loop got
            # back to the rollout: the wait for other rollouts' work is not the agent's.
            traj.cell_time_s += (
                result.duration_s if result is not None else time.monotonic() - cell_start
            )
            turn.api_calls = [dataclasses.asdict(c) for c in env.api_calls[calls_before:]]
            if result is not None:
                turn.error, turn.timed_out, turn.crashed = (
                    result.error,
                    result.timed_out,
                    result.crashed,
                )
            if env.done:
                traj.status = "ok"
                break
        observation = await _off_loop(
            len(observation), truncate_observation, tokenizer, observation,
            settings.max_observation_tokens,
        )  # fmt: skip
        if not _append_observation(traj, tokenizer, glue, generation, turn, observation, settings):
            traj.status = "context_exhausted"
            break
    traj.api_calls = [dataclasses.asdict(c) for c in env.api_calls]
    traj.duration_s = time.monotonic() - start
    return traj


async def _off_loop(size: int, work: Callable[..., _T], *args: Any) -> _T:
    """`work(*args)`, in a worker thread when its text is over OFF_LOOP_CHARS characters."""
    if size > OFF_LOOP_CHARS:
        return await asyncio.to_thread(work, *args)
    return work(*args)


def _window(
    messages: list[dict[str, str]], context: int, turn: int, memory_turns: int | None
) -> list[dict[str, str]]:
    """The messages of turn `turn`'s prompt: the context and the last `memory_turns` turns."""
    if memory_turns is None or turn <= memory_turns:
        return messages
    return messages[:context] + messages[context + 2 * (turn - memory_turns) :]


def _record_output(traj: Trajectory, tokenizer: Tokenizer, generation: Generation) -> Turn:
    start = len(traj.tokens)
    traj.append(list(generation.token_ids), output=True, logprobs=generation.logprobs)
    text = generation.text
    if text is None:
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    turn = Turn(start, len(traj.tokens), generation.finish_reason, text, extract_code(text))
    traj.turns.append(turn)
    traj.messages.append({"role": "assistant", "content": text})
    return turn


def _append_observation(
    traj: Trajectory,
    tokenizer: Tokenizer,
    glue: ChatGlue,
    generation: Any,
    turn: Turn,
    observation: str,
    settings: AgentConfig,
) -> bool:
    """Add glue + observation as environment tokens; False if the budget cannot hold them."""
    closing = glue.assistant_to_user
    sampled = generation.token_ids
    if generation.finish_reason == "stop" and sampled and sampled[-1] in glue.stop_token_ids:
        stop_text = tokenizer.decode([sampled[-1]])
        if closing.startswith(stop_text):  # the template's closing token was sampled: keep it
            closing = closing[len(stop_text) :]
    content = format_observation(observation)
    ids = tokenizer(closing, add_special_tokens=False)["input_ids"]
    ids += tokenizer(content, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    ids += tokenizer(glue.user_to_assistant, add_special_tokens=False)["input_ids"]
    next_prompt = len(traj.prompt_ids(len(traj.turns)))  # the next turn's prompt so far
    if next_prompt + len(ids) >= settings.max_context_tokens:
        return False
    traj.append(ids, output=False)
    turn.observation = observation
    traj.messages.append({"role": "user", "content": content})
    return True
