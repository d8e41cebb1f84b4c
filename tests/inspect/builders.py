"""Hand-built trajectories for the inspector's tests: turns with the calls and errors we say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from loop.rollout.trajectory import Trajectory, Turn


def call(endpoint: str, ok: bool = True) -> dict[str, Any]:
    """A recorded API call to "app.api"."""
    app, api = endpoint.split(".")
    return {
        "app": app,
        "api": api,
        "arguments": {},
        "ok": ok,
        "error": None if ok else "401: You are not logged in",
        "latency_s": 0.001,
    }


def turn(
    text: str = "",
    calls: tuple[dict[str, Any], ...] = (),
    *,
    error: str | None = None,
    timed_out: bool = False,
    observation: str | None = "Execution successful.",
) -> Turn:
    """One turn; a failed cell gets an "Execution failed." observation unless one is given."""
    if (error or timed_out) and observation == "Execution successful.":
        observation = "Execution failed.\n" + (error or "timed out")
    return Turn(0, 0, "stop", text, None, observation, error, timed_out, api_calls=list(calls))


def rollout(
    task_id: str,
    turns: list[Turn],
    *,
    sample: int = 0,
    difficulty: int = 1,
    success: bool | None = True,
    reward: float | None = None,
    status: str = "ok",
) -> Trajectory:
    """A scored trajectory of `task_id` made of `turns`."""
    traj = Trajectory(task_id, task_id.rsplit("_", 1)[0], difficulty, sample, turns=turns)
    traj.success = success
    traj.reward = (1.0 if success else 0.0) if reward is None else reward
    traj.status = status  # type: ignore[assignment]
    return traj


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    """Rollout records, one JSON object a line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


# Two rollouts of t_1 whose metrics are worked out by hand in test_metrics.py.
FENCE = "```"


def rollout_a() -> Trajectory:
    """Reads a doc, fails a dummy login in a two-cell turn, then logs in (recovers)."""
    return rollout(
        "t_1",
        [
            turn(
                f"I assume docs help.\n{FENCE}python\napis.api_docs.show_api_doc(app_name='phone')"
                f"\n{FENCE}",
                (call("api_docs.show_api_doc"),),
            ),
            turn(
                f"A dummy password.\n{FENCE}python\napis.phone.login(password='dummy_pw')\n{FENCE}"
                f"\n{FENCE}py\nx = 1\n{FENCE}",
                (call("phone.login", ok=False),),
                error="ApiError: 401",
            ),
            turn(
                f"{FENCE}python\napis.phone.login(password=p)\n{FENCE}",
                (call("phone.login"), call("phone.search_contacts")),
            ),
        ],
        sample=0,
        success=True,
    )


def rollout_b() -> Trajectory:
    """Fails two endpoints, retries one of them and fails again, then gives up."""
    return rollout(
        "t_1",
        [
            turn(
                f"{FENCE}python\nc = 1\n{FENCE}",
                (call("phone.search_contacts", ok=False),),
                error="ApiError: 401",
            ),
            turn(
                "I assume I am logged in; I assumed so before. Assuming it works.",
                (call("phone.send_text_message", ok=False),),
                error="ApiError: 401",
            ),
            turn("", (call("phone.search_contacts", ok=False),), timed_out=True),
            turn(f"{FENCE}python\nok\n{FENCE}", (call("supervisor.complete_task"),)),
        ],
        sample=1,
        success=False,
        reward=0.5,
    )
