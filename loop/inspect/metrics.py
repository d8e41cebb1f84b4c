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
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import mean
from typing import Any, Literal

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


def give_up_rate(failed: int, recovered: int) -> float | None:
    """(failed - recovered) / failed; None when nothing failed (the rate is undefined)."""
    return (failed - recovered) / failed if failed else None


def distinct_sequences(rows: Sequence[RolloutMetrics]) -> dict[str, int]:
    """Number of distinct API-call sequences among each task's rollouts."""
    seen: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for row in rows:
        seen[row.task_id].add(row.sequence)
    return {task: len(sequences) for task, sequences in seen.items()}


def aggregate(rows: Sequence[RolloutMetrics]) -> dict[str, float | None]:
    """The metrics of `METRICS` over a group of rollouts; None where a ratio is undefined."""
    if not rows:
        raise ValueError("no rollouts to aggregate")
    turns = sum(r.turns for r in rows)

    def per_turn(count: int) -> float | None:
        return count / turns if turns else None

    return {
        "rollouts": len(rows),
        "success_rate": mean(r.success for r in rows),
        "reward_mean": mean(r.reward for r in rows),
        "turns": mean(r.turns for r in rows),
        "api_calls": mean(r.api_calls for r in rows),
        "failed_api_calls": mean(r.failed_api_calls for r in rows),
        "show_api_doc": mean(r.show_api_doc for r in rows),
        "multi_cell_turns": per_turn(sum(r.multi_cell_turns for r in rows)),
        "execution_errors": per_turn(sum(r.execution_errors for r in rows)),
        "give_up_rate": give_up_rate(
            sum(r.give_up_failed for r in rows), sum(r.give_up_recovered for r in rows)
        ),
        "assume": mean(r.assume for r in rows),
        "dummy": mean(r.dummy for r in rows),
        "code_chars": mean(r.code_chars for r in rows),
        "distinct_sequences": mean(distinct_sequences(rows).values()),
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
    if before == 0:
        return None if after == 0 else float("inf")
    return after / before


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
    undefined in a draw)."""
    if not 0 < level < 1 or draws < 1:
        raise ValueError(f"bad bootstrap: level {level}, draws {draws}")
    rows_before, rows_after = _by_task(before), _by_task(after)
    tasks = sorted(rows_before.keys() & rows_after.keys())
    if not tasks:
        raise ValueError("no task in both groups: nothing to pair")
    rng = random.Random(seed)
    ratios: dict[str, list[float]] = {spec.key: [] for spec in METRICS}
    for _ in range(draws):
        drawn = rng.choices(tasks, k=len(tasks))
        first = aggregate([row for task in drawn for row in rows_before[task]])
        second = aggregate([row for task in drawn for row in rows_after[task]])
        for key, values in ratios.items():
            change = ratio(first[key], second[key])
            if change is not None:
                values.append(change)
    tail = (1 - level) / 2
    out: dict[str, tuple[float, float] | None] = {}
    for key, values in ratios.items():
        if len(values) < (1 - tail) * draws:
            out[key] = None
            continue
        values.sort()
        last = len(values) - 1
        out[key] = (values[math.floor(tail * last)], values[math.ceil((1 - tail) * last)])
    return out


def _by_task(rows: Sequence[RolloutMetrics]) -> dict[str, list[RolloutMetrics]]:
    grouped: dict[str, list[RolloutMetrics]] = defaultdict(list)
    for row in rows:
        grouped[row.task_id].append(row)
    return grouped
