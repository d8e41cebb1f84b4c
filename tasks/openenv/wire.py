"""What crosses the wire between our OpenEnv server and its clients: one code cell in, the
cell's observation out (and, on the last step, the grader's report).

Any OpenEnv client speaks it as JSON: the action `{"code": "..."}` (or `{"submit": true}` to end
the episode and be graded now), the observation's `text` is what the agent sees, exactly the
string our environments return locally.
"""

from __future__ import annotations

from typing import Any

from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field

# The longest cell a step takes, in characters: far past any cell an agent writes in one turn
# (the paper's 1,500 new tokens per turn are about 6,000 characters); a longer one is refused
# before it reaches a kernel.
MAX_CODE_CHARS = 100_000


class CellAction(Action):
    """One cell of agent code, or `submit` to end the episode and be graded."""

    # Checked by the server's step, which names the sizes in its error (a schema limit would
    # answer only "Invalid message"); published in the schema all the same.
    code: str = Field(
        default="", description="a Python cell", json_schema_extra={"maxLength": MAX_CODE_CHARS}
    )
    submit: bool = Field(default=False, description="end the episode now and grade it")


class CellObservation(Observation):
    """What a reset or a step returns (`reward` and `done` come with every observation)."""

    text: str = Field(default="", description="what the agent sees: task context or output")
    task_id: str = Field(default="", description="the task of this session's episode")
    error: str | None = Field(default=None, description="the cell's uncaught exception")
    timed_out: bool = Field(default=False, description="the cell ran past its time limit")
    crashed: bool = Field(default=False, description="the cell killed its kernel")
    duration_s: float = Field(default=0.0, description="the cell's run time in the kernel")
    api_calls: list[dict[str, Any]] = Field(default_factory=list, description="this step's")
    start_fingerprint: str | None = Field(default=None, description="on reset: the start state")
    report: dict[str, Any] | None = Field(default=None, description="on the last step: tests")


class SuiteState(State):
    """The session's episode as the `state` message reports it."""

    task_id: str | None = Field(default=None, description="the episode's task")
    done: bool = Field(default=False, description="the episode ended and was graded")
