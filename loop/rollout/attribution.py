"""Whose a rollout's run-out of wall time is: the agent's (scored) or our machinery's (excluded).

The rule (DESIGN.md section 4, loop/rollout/trajectory.py): what the agent chose is the agent's.
When a rollout reaches `agent.rollout_timeout_s`, the agent is charged for

    its cells' time  +  for each turn, min(the turn's generation time, tokens emitted x c)

and the timeout is the agent's (`timeout`, scored on the final state) when that charge is at
least half the limit, else ours (`generation_timeout`, excluded). `c` is the backend's time per
emitted token: the agent chooses how many tokens it writes, so the time they take is its own,
just as a cell's sleep is; the rest of a generation's time (waiting behind other rollouts,
prefill, a stuck or failing backend) is ours. A generation still running at the limit emitted
nothing yet and is not charged.

`c` is measured, not guessed: a call that emits n tokens takes about a + c*n seconds (a: the
per-call part), so `c` is the slope of the least-squares line through (n, seconds) of every turn
generated so far in the collection, all rollouts together. The agent is charged at the slope's
upper bound, slope + z standard errors (`agent.token_time_z`, default 2: about 97.5% one-sided
under normal noise): doubt goes against exclusion, so writing more tokens can never move time
from the agent's account to ours. Where lengths barely vary (one rollout whose messages are all
padded to `max_new_tokens`) the bound is wide and the agent pays for all of its generation; a
backend slow whatever the length (a flat line over lengths that vary) costs it almost nothing.
With fewer than three turns, or all of one length, per-call and per-token time cannot be told
apart, and the agent pays for all its generation time (`c` is infinite).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from loop.rollout.trajectory import RolloutStatus, Turn


def token_time_bound(points: Iterable[tuple[int, float]], z: float) -> float:
    """An upper bound of the backend's seconds per emitted token, from (tokens, seconds) of
    generation calls: the least-squares slope plus `z` standard errors, at least 0; infinite
    when fewer than three calls or a single length leave it unknown."""
    points = list(points)
    n = len(points)
    if n < 3:
        return math.inf
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    if sxx == 0:
        return math.inf
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    residuals = sum((y - intercept - slope * x) ** 2 for x, y in points)
    standard_error = math.sqrt(residuals / (n - 2) / sxx)
    return max(0.0, slope + z * standard_error)


def generation_points(turns: Iterable[Turn]) -> list[tuple[int, float]]:
    """(tokens emitted, generation seconds) of each turn: what `token_time_bound` fits."""
    return [(t.output_end - t.output_start, t.generation_s) for t in turns]


def token_time_charged(turns: Iterable[Turn], token_time_s: float) -> float:
    """The generation time charged to the agent: per turn, its tokens at `token_time_s` each,
    never more than the turn's generation took."""
    return sum(min(s, n * token_time_s) for n, s in generation_points(turns) if n > 0)


def timeout_status(
    cell_time_s: float, limit_s: float, token_time_s: float = 0.0
) -> tuple[RolloutStatus, str]:
    """Whose a rollout's run-out of wall time is: the agent's when its cells and the generation
    of the tokens it emitted (`token_time_charged`) used at least half of the limit, else ours."""
    spent = f"rollout exceeded {limit_s:g} s, {cell_time_s:.0f} s of it in the agent's cells"
    if token_time_s > 0:
        spent += f" and {token_time_s:.0f} s generating the tokens it emitted"
    if cell_time_s + token_time_s >= limit_s / 2:
        return "timeout", spent
    return "generation_timeout", spent
