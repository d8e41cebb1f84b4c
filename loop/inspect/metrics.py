"""Behaviour metrics of rollouts (pure functions; no I/O), after the LOOP paper's section 5.

Per rollout, `rollout_metrics` counts what the agent did (`RolloutMetrics`); `aggregate` turns a
group of those into the numbers the paper reports (loop_spec.md section 5, Appendix A.1):

    turns / rollout              assistant turns
    API calls / rollout          calls that reached the environment (`Trajectory.api_calls`)
    failed API calls / rollout   of those, the ones that returned an error
    show_api_doc / rollout       occurrences of `apis.api_docs.show_api_doc` in the agent's code
    multi-cell turns / turn      turns with more than one ```python block, over all turns
    execution errors / turn      turns whose cell failed (error, timeout, crash), over all turns
    give-up rate                 (failed - recovered) / failed endpoints, `give_up_counts`
    'assume' / rollout           assume / assumed / assuming in the agent's text ("assumed" once)
    'dummy' / rollout            "dummy" in the agent's text (also inside `dummy_password`)
    code characters / rollout    characters inside the agent's ```python blocks
    distinct sequences / task    distinct API-call sequences (app.api in call order) per task

Ratios over turns are pooled (sums over the group, then divided), as in the paper; per-rollout
quantities are means over rollouts. Success and reward count an unscored rollout as 0.

`change_intervals` gives each after / before a percentile bootstrap interval over tasks: the
tasks both groups ran are drawn with replacement, each draw taking every rollout of a drawn task
before and after (paired), so an interval that excludes 1 is a change beyond which tasks
happened to be evaluated.

`MetricSpec.paper` is the factor the LOOP paper reports for the metric (after / before, base
Qwen2.5-32B -> its LOOP checkpoint, loop_spec.md section 5 [P]: 1.6x more `show_api_doc`, 3x
lower give-up rate, 6x fewer multi-cell turns, 30x fewer "assume", 6x fewer "dummy"; only these
factors are in the paper's text), so `--compare` prints each change beside the paper's and
`direction` says whether they agree.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np

from loop.rollout.codeblocks import code_blocks
from loop.rollout.trajectory import Trajectory, Turn

SHOW_API_DOC = re.compile(r"apis\.api_docs\.show_api_doc\b")
ASSUME = re.compile(r"assum(?:ing|ed|e)", re.IGNORECASE)  # "assumed" matches once, as "assumed"
DUMMY = re.compile(r"dummy", re.IGNORECASE)  # no word boundary: `dummy_venmo_pass` counts
EXECUTION_FAILED = "Execution failed"  # the first line of a failed cell's observation


@dataclass(frozen=True)
class MetricSpec:
    """One aggregated metric: its key, its label in tables, how to print it, what it means."""

    key: str
    label: str
    kind: Literal["count", "mean", "rate"]
    doc: str
    paper: float | None = None  # the LOOP paper's after / before [P]; None: not in its text


METRICS: tuple[MetricSpec, ...] = (
    MetricSpec("rollouts", "rollouts", "count", "number of rollouts"),
    MetricSpec("success_rate", "success rate", "rate", "share of rollouts whose tests all pass"),
    MetricSpec("reward_mean", "reward", "rate", "mean fraction of tests passed"),
    MetricSpec("turns", "turns / rollout", "mean", "assistant turns per rollout"),
    MetricSpec("api_calls", "API calls / rollout", "mean", "API calls that reached the apps"),
    MetricSpec("failed_api_calls", "failed API calls / rollout", "mean", "calls that erred"),
    MetricSpec(
        "show_api_doc", "show_api_doc / rollout", "mean",
        "occurrences of apis.api_docs.show_api_doc in the agent's code", 1.6,
    ),
    MetricSpec(
        "multi_cell_turns", "multi-cell turns / turn", "rate",
        "turns with more than one ```python block, over all turns", 1 / 6,
    ),
    MetricSpec(
        "execution_errors", "execution errors / turn", "rate",
        "turns whose cell failed (exception, timeout or crash), over all turns",
    ),
    MetricSpec(
        "give_up_rate", "give-up rate (failed calls)", "rate",
        "(failed - recovered) / failed endpoints, the paper's algorithm; empty with no failures",
        1 / 3,
    ),
    MetricSpec(
        "assume", "'assume' / rollout", "mean", "assume/assumed/assuming in agent text", 1 / 30
    ),
    MetricSpec("dummy", "'dummy' / rollout", "mean", "occurrences of 'dummy' in agent text", 1 / 6),
    MetricSpec("code_chars", "code chars / rollout", "mean", "characters in ```python blocks"),
    MetricSpec(
        "distinct_sequences", "distinct call sequences / task", "mean",
        "distinct API-call sequences (app.api in order) per task, averaged over tasks",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class RolloutMetrics:
    """What one rollout did, as counts (aggregate them with `aggregate`)."""

    task_id: str
    turns: int
    api_calls: int
    failed_api_calls: int
    show_api_doc: int
    multi_cell_turns: int
    execution_errors: int  # turns whose cell failed
    give_up_failed: int  # endpoints added to the failed set (give_up_counts)
    give_up_recovered: int  # endpoints later retried in a turn without an execution error
    assume: int
    dummy: int
    code_chars: int
    success: bool
    reward: float
    sequence: tuple[str, ...]  # "app.api" of every call, in order


def is_execution_error(turn: Turn) -> bool:
    """The environment's reply to this turn says its cell failed (exception, timeout, crash)."""
    if turn.error is not None or turn.timed_out or turn.crashed:
        return True
    return (turn.observation or "").startswith(EXECUTION_FAILED)


def endpoint(call: dict[str, Any]) -> str:
    """`app.api` of a recorded call."""
    return f"{call.get('app', '?')}.{call.get('api', '?')}"


def give_up_counts(turns: Sequence[Turn]) -> tuple[int, int]:
    """(failed, recovered) endpoint counts of one rollout, the paper's give-up algorithm.

    Walk the turns keeping the set of endpoints that failed and were not yet retried
    successfully. A turn whose reply is an execution error adds every endpoint it called
    (`failed` += the newly added ones); any other turn removes the endpoints it called
    (`recovered` += the removed ones). The give-up rate of a group is
    (sum failed - sum recovered) / sum failed. "Called" means reached the environment
    (`Turn.api_calls`): an endpoint written after the line that raised was never attempted.
    """
    pending: set[str] = set()
    failed = recovered = 0
    for turn in turns:
        endpoints = {endpoint(call) for call in turn.api_calls}
        if is_execution_error(turn):
            added = endpoints - pending
            failed += len(added)
            pending |= added
        else:
            removed = endpoints & pending
            recovered += len(removed)
            pending -= removed
    return failed, recovered


def rollout_metrics(traj: Trajectory) -> RolloutMetrics:
    """Count one rollout's behaviour (the inputs of `aggregate`)."""
    calls = traj.api_calls
    blocks = [code_blocks(turn.text) for turn in traj.turns]
    texts = [turn.text for turn in traj.turns]
    failed, recovered = give_up_counts(traj.turns)
    return RolloutMetrics(
        task_id=traj.task_id,
        turns=len(traj.turns),
        api_calls=len(calls),
        failed_api_calls=sum(not call.get("ok", False) for call in calls),
        show_api_doc=sum(len(SHOW_API_DOC.findall(b)) for bs in blocks for b in bs),
        multi_cell_turns=sum(len(bs) > 1 for bs in blocks),
        execution_errors=sum(is_execution_error(turn) for turn in traj.turns),
        give_up_failed=failed,
        give_up_recovered=recovered,
        assume=sum(len(ASSUME.findall(text)) for text in texts),
        dummy=sum(len(DUMMY.findall(text)) for text in texts),
        code_chars=sum(len(b) for bs in blocks for b in bs),
        success=bool(traj.success),
        reward=traj.reward or 0.0,
        sequence=tuple(endpoint(call) for call in calls),
    )


def distinct_sequences(rows: Sequence[RolloutMetrics]) -> dict[str, int]:
    """Number of distinct API-call sequences among each task's rollouts."""
    seen: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for row in rows:
        seen[row.task_id].add(row.sequence)
    return {task: len(sequences) for task, sequences in seen.items()}


# What `aggregate` sums over a group's rows, in the order of `_sums`' vector: the rollouts, the
# tasks and their distinct call sequences (summed over tasks), then each count of a rollout.
_COUNTS = tuple(f.name for f in fields(RolloutMetrics) if f.name not in ("task_id", "sequence"))
_SUMS = ("rollouts", "tasks", "distinct_sequences", *_COUNTS)


def aggregate(rows: Sequence[RolloutMetrics]) -> dict[str, float | None]:
    """The metrics of `METRICS` over a group of rollouts; None where a ratio is undefined."""
    if not rows:
        raise ValueError("no rollouts to aggregate")
    finished = _finish(_sums(rows))
    values = {key: None if math.isnan(v) else float(v) for key, v in finished.items()}
    return values | {"rollouts": len(rows)}  # a count stays an int (JSON, tables)


def _sums(rows: Sequence[RolloutMetrics]) -> np.ndarray:
    """The sums `_finish` turns into metrics (`_SUMS`), over `rows`; sums of disjoint tasks add
    up to the sums of their union, which lets a bootstrap draw add up task vectors."""
    sequences = distinct_sequences(rows)
    counts = np.array([[getattr(r, name) for name in _COUNTS] for r in rows], dtype=float)
    return np.concatenate(([len(rows), len(sequences), sum(sequences.values())], counts.sum(0)))


def _finish(sums: np.ndarray) -> dict[str, np.ndarray]:
    """The metrics of `METRICS` from sums (`_SUMS` along the last axis, any leading axes, as
    many draws at once); NaN where a ratio is undefined."""
    column = dict(zip(_SUMS, np.moveaxis(sums, -1, 0), strict=True))
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 / 0: an undefined rate, NaN
        per_rollout = {key: column[key] / column["rollouts"] for key in _COUNTS}
        per_turn = {key: column[key] / column["turns"] for key in _COUNTS}
        failed, recovered = column["give_up_failed"], column["give_up_recovered"]
        return {
            "rollouts": column["rollouts"],
            "success_rate": per_rollout["success"],
            "reward_mean": per_rollout["reward"],
            **{key: per_rollout[key] for key in ("turns", "api_calls", "failed_api_calls")},
            "show_api_doc": per_rollout["show_api_doc"],
            "multi_cell_turns": per_turn["multi_cell_turns"],
            "execution_errors": per_turn["execution_errors"],
            "give_up_rate": (failed - recovered) / failed,  # NaN when nothing failed
            **{key: per_rollout[key] for key in ("assume", "dummy", "code_chars")},
            "distinct_sequences": column["distinct_sequences"] / column["tasks"],
        }


def direction(change: float | None, paper: float | None) -> str:
    """Whether a measured after / before goes the paper's way: "as paper", "against" or "-"
    (no factor in the paper, an undefined change, or no change)."""
    if change is None or paper is None or change == 1:
        return "-"
    return "as paper" if (change > 1) == (paper > 1) else "against"


def ratio(before: float | None, after: float | None) -> float | None:
    """after / before for `--compare`; None where it is undefined (a missing value or 0 / 0)."""
    if before is None or after is None:
        return None
    change = float(_ratios(np.asarray(before, dtype=float), np.asarray(after, dtype=float)))
    return None if math.isnan(change) else change


def _ratios(before: np.ndarray, after: np.ndarray) -> np.ndarray:
    """`ratio`'s rules on arrays (NaN for undefined, in and out): x / 0 is inf, 0 / 0 NaN."""
    with np.errstate(divide="ignore", invalid="ignore"):
        change = np.where(before == 0, np.where(after == 0, np.nan, np.inf), after / before)
    return np.where(np.isnan(before) | np.isnan(after), np.nan, change)


# A change's interval: the share of bootstrap draws it covers, the draws (a percentile interval's
# ends move by about 0.01 between seeds at 2,000 draws of 36 tasks) and the seed.
INTERVAL_LEVEL = 0.95
BOOTSTRAP_DRAWS = 2000


def change_intervals(
    before: Sequence[RolloutMetrics],
    after: Sequence[RolloutMetrics],
    *,
    level: float = INTERVAL_LEVEL,
    draws: int = BOOTSTRAP_DRAWS,
    seed: int = 0,
) -> dict[str, tuple[float, float] | None]:
    """Each metric's after / before as a percentile bootstrap interval over the tasks both
    groups ran (see the module docstring), over the draws where it is defined; None where more
    draws than the interval leaves out have none (nothing before and after, or a rate
    undefined in a draw). A draw adds up its tasks' sums (`_sums`; a task drawn twice counts
    twice): 2,000 draws of 1,000 rollouts a side take 0.2 s, against 20 s aggregating each
    draw's rows."""
    if not 0 < level < 1 or draws < 1:
        raise ValueError(f"bad bootstrap: level {level}, draws {draws}")
    rows_before, rows_after = _by_task(before), _by_task(after)
    tasks = sorted(rows_before.keys() & rows_after.keys())
    if not tasks:
        raise ValueError("no task in both groups: nothing to pair")
    rng = np.random.default_rng(seed)
    # Each draw's sums: the drawn tasks' vectors, a task counted as often as it was drawn.
    drawn = rng.integers(len(tasks), size=(draws, len(tasks)))
    times = np.stack([np.bincount(row, minlength=len(tasks)) for row in drawn])
    first = _finish(times @ np.stack([_sums(rows_before[task]) for task in tasks]))
    second = _finish(times @ np.stack([_sums(rows_after[task]) for task in tasks]))
    tail = (1 - level) / 2
    out: dict[str, tuple[float, float] | None] = {}
    for spec in METRICS:
        change = _ratios(first[spec.key], second[spec.key])
        values = np.sort(change[~np.isnan(change)])
        if len(values) < (1 - tail) * draws:
            out[spec.key] = None
            continue
        last = len(values) - 1
        low, high = values[math.floor(tail * last)], values[math.ceil((1 - tail) * last)]
        out[spec.key] = (float(low), float(high))
    return out


def _by_task(rows: Sequence[RolloutMetrics]) -> dict[str, list[RolloutMetrics]]:
    grouped: dict[str, list[RolloutMetrics]] = defaultdict(list)
    for row in rows:
        grouped[row.task_id].append(row)
    return grouped
