"""One rollout as the trainer and the inspector see it: a flat token sequence plus its story.

Token in, token out. `tokens` is every token of the rollout in order: the prompt, then for each
turn the ids the policy sampled (exactly as sampled, its stop token included) and the tokens the
environment added (chat-template glue and the observation). Parallel arrays:

    is_output[i]         True only for ids the policy sampled (the loss mask)
    sampler_logprobs[i]  the sampler's log-prob of tokens[i] where is_output[i]; NaN elsewhere

`turns` records where each turn's sampled span lies, so decoding `tokens[t.output_start:
t.output_end]` gives that turn's assistant message. The status says how the rollout ended;
`INFRA_STATUSES` are failures of our machinery, excluded from advantages and counted.

Failure attribution, the one rule (DESIGN.md section 4): what the agent's own code causes is
the agent's and is scored on the final state, never excluded: a cell that crashes or hangs its
kernel, junk it leaves for the next kernel, arguments an API refuses, a rollout that runs out of
time because its cells did (`timeout`). Only failures of our machinery are infrastructure
statuses: the generator failing or being too slow (`generator_error`, `generation_timeout`) or
answering what no sampler could have (`invalid_generation`: loop/generators/validate.py), a
sandbox that cannot be had or restarted (`sandbox_crash`), the environment's engine or grader
failing (`env_crash`, `env_error`), an environment that started the rollout from another state
than the task's other rollouts (`start_state_mismatch`: a leave-one-out baseline over them
would compare different problems). Time is charged the same way: to the agent, its cells (as
the sandbox measured them) and the generation of the tokens it chose to emit; to us, the rest
(loop/rollout/attribution.py). A grader made slow by the state the agent left fails a test of
the report (tasks/apptown/env.py), so that too is scored.

Verlog's memory window (`agent.memory_turns: n`): turn t is generated from the task context
(`tokens[:prompt_length]`) followed by the last n turns (each turn: the ids the policy sampled,
then the environment's ids up to the next turn). `prompt_ids(t)` gives those exact ids, for
the agent when it samples and for the learner when it trains on the turn, so token in, token
out holds per turn while `tokens` keeps the whole episode for the rollouts file and the report.

API calls are stored once, per turn (`Turn.api_calls`); `Trajectory.api_calls` is every call in
order, derived from the turns. Only calls that belong to no turn (a step whose sandbox crashed
after some calls ran) make the rollout keep its own list, written as the top-level
`api_calls` key; older files that repeat every call there read the same.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal

RolloutStatus = Literal[
    "ok",  # the agent called complete_task
    "max_turns",  # the turn limit came first
    "context_exhausted",  # the token budget came first
    "timeout",  # the rollout's wall-clock limit came while its own cells used most of it
    "generation_timeout",  # the wall-clock limit came while generation used most of it
    "sandbox_crash",  # the sandbox could not go on (not a crash the agent's code caused)
    "env_crash",  # the environment's engine process died or hung (e.g. AppWorld's)
    "generator_error",  # the generation backend failed
    "invalid_generation",  # a server's answer broke a rule of loop/generators/validate.py
    "env_error",  # the environment or its grader failed
    "start_state_mismatch",  # it started from another state than its task's other rollouts
]
INFRA_STATUSES: frozenset[str] = frozenset(
    {
        "generation_timeout", "sandbox_crash", "env_crash", "generator_error", "env_error",
        "start_state_mismatch", "invalid_generation",
    }
)  # fmt: skip


@dataclass
class Turn:
    """One assistant turn and what the environment answered."""

    output_start: int  # tokens[output_start:output_end] are the ids sampled this turn
    output_end: int
    finish_reason: str  # "stop" or "length"
    text: str  # the assistant message, decoded from the sampled ids
    code: str | None  # the cell extracted from the message (None: no code block)
    observation: str | None = None  # what the agent was shown (None after the last turn)
    error: str | None = None  # the cell's uncaught exception, if any
    timed_out: bool = False
    crashed: bool = False
    api_calls: list[dict[str, Any]] = field(default_factory=list)
    generation_s: float = 0.0  # wall time of the turn's generate call (for attribution)
    adapter_version: str | None = None  # the weights that sampled it, by the generator's name


@dataclass
class Trajectory:
    """A finished rollout of one task."""

    task_id: str
    scenario_id: str
    difficulty: int
    sample_index: int  # which of the task's K rollouts this is
    tokens: list[int] = field(default_factory=list)
    is_output: list[bool] = field(default_factory=list)
    sampler_logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)
    # Set only when the rollout's calls are not exactly its turns' calls (see `api_calls`).
    own_api_calls: list[dict[str, Any]] | None = field(default=None, repr=False)
    tests: list[dict[str, Any]] = field(default_factory=list)
    reward: float | None = None  # fraction of tests passed; None when not scored
    success: bool | None = None
    # The final state differs from the initial one (`TestReport.state_changed`; None: unknown)
    state_changed: bool | None = None
    status: RolloutStatus = "ok"
    error: str | None = None  # why an infrastructure status was given
    token_exact: bool = True  # False when a backend returned text that had to be re-tokenised
    # Special-token texts the agent's text carried into a text-mode prompt, which the server
    # tokenised as real special tokens (loop/generators/openai.py); 0 in token-id modes
    forged_special_tokens: int = 0
    memory_turns: int | None = None  # the prompts' memory window (None: the whole history)
    # The environment's fingerprint of the state the rollout started from (None: unknown)
    start_fingerprint: str | None = None
    duration_s: float = 0.0
    cell_time_s: float = 0.0  # time the agent's cells ran, as the sandbox measured it
    # The policy version its group sampled: the updates published when the group was
    # dispatched (the iteration, in the synchronous loop; older when collected ahead)
    policy_version: int | None = None

    @property
    def api_calls(self) -> list[dict[str, Any]]:
        """Every API call of the rollout in order: the turns' calls, unless set otherwise.

        A new list when derived from the turns: assign to it, do not append to it.
        """
        if self.own_api_calls is not None:
            return self.own_api_calls
        return [call for turn in self.turns for call in turn.api_calls]

    @api_calls.setter
    def api_calls(self, calls: list[dict[str, Any]]) -> None:
        """Keep `calls` only where they differ from the turns' calls (stored once otherwise)."""
        calls = list(calls)
        derived = [call for turn in self.turns for call in turn.api_calls]
        self.own_api_calls = None if calls == derived else calls

    def prompt_ids(self, turn: int) -> list[int]:
        """The exact ids turn `turn` was generated from (or, for turn == len(turns), the next).

        The whole history without a memory window; with one of n turns, the task context and
        the tokens from the start of turn `turn - n` up to the start of turn `turn`.
        """
        ranges = self.prompt_ranges(turn)
        return [i for start, end in ranges for i in self.tokens[start:end]]

    def prompt_ranges(self, turn: int) -> list[tuple[int, int]]:
        """Where `prompt_ids(turn)` lies in `tokens`: one or two [start, end) ranges."""
        if not 0 <= turn <= len(self.turns):
            raise IndexError(f"turn {turn} of a rollout with {len(self.turns)} turns")
        end = self.turns[turn].output_start if turn < len(self.turns) else len(self.tokens)
        n = self.memory_turns
        if n is None or turn <= n:
            return [(0, end)]
        return [(0, self.prompt_length), (self.turns[turn - n].output_start, end)]

    @property
    def infra_failure(self) -> bool:
        """Excluded from advantages and counted (the group is re-baselined without it)."""
        return self.status in INFRA_STATUSES

    def append(self, ids: list[int], *, output: bool, logprobs: list[float] | None = None) -> None:
        """Add tokens; sampled ones carry their sampler log-probs (NaN if the backend gave none)."""
        self.tokens.extend(ids)
        self.is_output.extend([output] * len(ids))
        if output and logprobs is not None:
            assert len(logprobs) == len(ids), f"{len(logprobs)} log-probs for {len(ids)} ids"
            self.sampler_logprobs.extend(float(x) for x in logprobs)
        else:
            self.sampler_logprobs.extend([math.nan] * len(ids))

    def to_json(self) -> dict[str, Any]:
        """Plain data for rollouts files (NaN log-probs become None)."""
        data = dataclasses.asdict(self)
        own_calls = data.pop("own_api_calls")
        if own_calls is not None:  # calls outside the turns; otherwise they live in the turns
            data["api_calls"] = own_calls
        data["sampler_logprobs"] = [None if math.isnan(x) else x for x in self.sampler_logprobs]
        data["num_tokens"] = len(self.tokens)
        data["num_output_tokens"] = sum(self.is_output)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Trajectory:
        """The inverse of `to_json`."""
        data = dict(data)
        data.pop("num_tokens", None)
        data.pop("num_output_tokens", None)
        calls = data.pop("api_calls", None)  # old files repeat the turns' calls here
        data["turns"] = [Turn(**t) for t in data.get("turns", [])]
        data["sampler_logprobs"] = [
            math.nan if x is None else x for x in data.get("sampler_logprobs", [])
        ]
        traj = cls(**data)
        if calls is not None:
            traj.api_calls = calls
        return traj
