"""Rollouts grouped the ways a summary shows them: overall, per split, per difficulty, per
iteration and per task, each aggregated with `metrics.aggregate`.

A `Row` is what the summaries keep of a rollout: its metrics and the labels it is grouped by
(the trajectory itself is dropped once counted, so any number of rollouts fits in memory).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loop.inspect.metrics import RolloutMetrics, aggregate, change_intervals, rollout_metrics
from loop.run.records import Rollout

Aggregate = dict[str, float | None]
Intervals = dict[str, tuple[float, float] | None] | None  # change_intervals_of's
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Row:
    """One rollout, as the summaries see it."""

    metrics: RolloutMetrics
    split: str
    difficulty: int
    iteration: int | None
    status: str
    sample_index: int
    where: str  # file:line

    @property
    def task_id(self) -> str:
        return self.metrics.task_id


def to_row(rollout: Rollout) -> Row:
    """Count a rollout's behaviour and keep its labels."""
    traj = rollout.traj
    return Row(
        rollout_metrics(traj),
        rollout.split,
        traj.difficulty,
        rollout.iteration,
        traj.status,
        traj.sample_index,
        rollout.where,
    )


@dataclass
class Run:
    """The rollouts of one PATH (two with `--compare`): a label and the rows read."""

    label: str
    path: str
    rows: list[Row] = field(default_factory=list)


def group_by(rows: Sequence[Row], key: Callable[[Row], K]) -> dict[K, list[Row]]:
    """Rows grouped by `key`, groups in sorted key order (None first, numbers numerically)."""
    groups: dict[K, list[Row]] = defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    return dict(sorted(groups.items(), key=lambda kv: _sort_key(kv[0])))


def aggregate_rows(rows: Sequence[Row]) -> Aggregate:
    """`metrics.aggregate` over rows."""
    return aggregate([row.metrics for row in rows])


def change_intervals_of(before: Sequence[Row], after: Sequence[Row]) -> Intervals:
    """`metrics.change_intervals` of two groups of rows; None when they share no task."""
    first, second = [row.metrics for row in before], [row.metrics for row in after]
    if not {m.task_id for m in first} & {m.task_id for m in second}:
        return None
    return change_intervals(first, second)


def overview(rows: Sequence[Row]) -> list[tuple[str, Aggregate]]:
    """The columns of the main summary: all, then each split, then each difficulty (a split or
    difficulty column is left out when there is only one, as it would repeat "all")."""
    columns = [("all", aggregate_rows(rows))]
    for name, key in (("split", _split), ("difficulty", _difficulty)):
        groups = group_by(rows, key)
        if len(groups) > 1:
            columns += [(f"{name} {k}", aggregate_rows(g)) for k, g in groups.items()]
    return columns


def by_iteration(rows: Sequence[Row]) -> list[tuple[str, Aggregate]]:
    """One aggregate per (iteration, split), for runs with more than one iteration."""
    groups = group_by(rows, lambda r: (r.iteration, r.split))
    return [
        (f"{_iteration_label(it)} {split}", aggregate_rows(g)) for (it, split), g in groups.items()
    ]


def by_task(rows: Sequence[Row]) -> list[tuple[str, Aggregate]]:
    """One aggregate per task."""
    return [(str(task), aggregate_rows(g)) for task, g in group_by(rows, _task).items()]


def iterations(rows: Sequence[Row]) -> list[int | None]:
    """The distinct iterations among the rows (None: not from training)."""
    return sorted({row.iteration for row in rows}, key=_sort_key)


def _iteration_label(iteration: int | None) -> str:
    return "eval" if iteration is None else f"iter {iteration}"


def _split(row: Row) -> str:
    return row.split


def _difficulty(row: Row) -> int:
    return row.difficulty


def _task(row: Row) -> str:
    return row.task_id


def _sort_key(key: Any) -> tuple[Any, ...]:
    """None first, then numbers in numeric order, then text; tuples element by element."""
    if isinstance(key, tuple):
        return tuple(_sort_key(k) for k in key)
    if key is None:
        return (0, 0, "")
    if isinstance(key, int):
        return (1, key, "")
    return (2, 0, str(key))
