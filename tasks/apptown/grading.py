"""State-based tests: what changed between a task's initial and final state, and the checks a
scenario makes on it (the requested change happened, nothing else changed, the answer is right).

`Grader` collects `TestResult`s into a `TestReport`; the same report gives the training reward
and what `evaluate.py` prints, so there is one scoring path. The report also says whether the
state changed at all (`TestReport.state_changed`: the diff is not empty), what `reward: acted`
reads.

The answer is the agent's, so everything that reads it runs in time linear in its size (no
backtracking pattern: `parse_number` reads a number in one pass); the API bounds its size
(tasks/apptown/api.py), and the environment grades off the event loop under a time limit
(tasks/apptown/env.py).
"""

from __future__ import annotations

import re
import sqlite3
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tasks.apptown.world import Snapshot
from tasks.core import TestReport, TestResult

_MAX_LISTED = 5  # changes quoted in a failure message


@dataclass(frozen=True)
class RowChange:
    """One row that differs between the initial and final state."""

    table: str
    row_id: int
    before: dict[str, Any] | None  # None: the row was added
    after: dict[str, Any] | None  # None: the row was removed

    def describe(self) -> str:
        name = f"{self.table}#{self.row_id}"
        if self.before is None:
            return f"{name} added {self.after}"
        if self.after is None:
            return f"{name} removed {self.before}"
        fields = [
            f"{k}: {v!r} -> {self.after[k]!r}" for k, v in self.before.items() if self.after[k] != v
        ]
        return f"{name} updated ({', '.join(fields)})"


class StateDiff:
    """Every row change of a rollout, read from the `_changes` log the triggers keep."""

    def __init__(self, changes: list[RowChange]):
        self.changes = changes
        self._by_table: dict[str, list[RowChange]] = defaultdict(list)
        for c in changes:
            self._by_table[c.table].append(c)

    @classmethod
    def compute(cls, initial: Snapshot, final: sqlite3.Connection) -> StateDiff:
        """Diff only the rows the log names; a row changed and changed back is no change."""
        touched: dict[str, set[int]] = defaultdict(set)
        for row in final.execute("SELECT DISTINCT tbl, row_id FROM _changes"):
            touched[row["tbl"]].add(row["row_id"])
        changes = []
        for table, ids in sorted(touched.items()):
            marks = ", ".join("?" for _ in ids)
            sql = f"SELECT * FROM {table} WHERE id IN ({marks})"
            before = {r["id"]: r for r in initial.rows(sql, tuple(ids))}
            after = {dict(r)["id"]: dict(r) for r in final.execute(sql, tuple(ids))}
            for row_id in sorted(ids):
                if before.get(row_id) != after.get(row_id):
                    changes.append(RowChange(table, row_id, before.get(row_id), after.get(row_id)))
        return cls(changes)

    def added(self, table: str) -> list[dict[str, Any]]:
        return [c.after for c in self._by_table[table] if c.before is None and c.after]

    def removed(self, table: str) -> list[dict[str, Any]]:
        return [c.before for c in self._by_table[table] if c.after is None and c.before]

    def updated(self, table: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        return [(c.before, c.after) for c in self._by_table[table] if c.before and c.after]


Allowed = Mapping[str, Iterable[int] | Mapping[int, Iterable[str]]]
"""Changes a task may make: table -> row ids (added or removed) or row id -> columns (updated)."""


def _allows(allowed: Allowed, change: RowChange) -> bool:
    rows = allowed.get(change.table)
    if rows is None:
        return False
    if isinstance(rows, Mapping):
        columns = rows.get(change.row_id)
        if columns is None or change.before is None or change.after is None:
            return False  # a row named for an update may not be added or removed
        after = change.after
        changed = {k for k, v in change.before.items() if after.get(k) != v}
        return changed <= set(columns)
    if change.before is not None and change.after is not None:
        return False  # a row named as added or removed may not be updated
    return change.row_id in set(rows)


class Grader:
    """Runs one task's checks on a final state and collects them into a `TestReport`."""

    def __init__(
        self,
        task_id: str,
        initial: Snapshot,
        final: sqlite3.Connection,
        answer: Any,
        completed: bool,
    ):
        self.task_id = task_id
        self.initial = initial
        self.final = final
        self.answer = answer
        self.completed = completed
        self.diff = StateDiff.compute(initial, final)
        self.results: list[TestResult] = []

    def before(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Query the initial state."""
        return self.initial.rows(sql, params)

    def after(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Query the final state."""
        return [dict(r) for r in self.final.execute(sql, params)]

    def check(
        self, name: str, requirement: str, passed: bool, failure: str, *, collateral: bool = False
    ) -> bool:
        """Record one test; `failure` says what differed and is kept only when it failed;
        `collateral` marks the test that checks nothing else changed (`TestResult.collateral`)."""
        result = TestResult(name, requirement, passed, "" if passed else failure, collateral)
        self.results.append(result)
        return passed

    def check_answer(self, expected: Any, *, ordered: bool = False) -> bool:
        """The answer given to complete_task equals `expected` (see `answers_match`)."""
        requirement = f"The answer given to complete_task is {expected!r}"
        if not self.completed:
            return self.check("answer", requirement, False, "complete_task was never called")
        ok = answers_match(self.answer, expected, ordered=ordered)
        return self.check("answer", requirement, ok, f"the answer was {self.answer!r}")

    def check_no_other_changes(self, allowed: Allowed | None = None) -> bool:
        """Nothing changed in any app except what `allowed` names, column by column.

        `allowed` maps a table to the rows that may change there: a list of row ids may be
        added or removed (whole rows), a mapping row id -> column names may be updated in
        those columns only. Any other changed column fails the check, so a right change made
        together with a wrong one to the same row (renaming the contact whose email was asked
        to change) is caught.
        """
        extra = [c for c in self.diff.changes if not _allows(allowed or {}, c)]
        listed = "; ".join(c.describe() for c in extra[:_MAX_LISTED])
        more = f" (and {len(extra) - _MAX_LISTED} more)" if len(extra) > _MAX_LISTED else ""
        return self.check(
            "no_collateral_changes",
            "No other record in any app was added, removed or changed",
            not extra,
            f"{len(extra)} unexpected change(s): {listed}{more}",
            collateral=True,
        )

    def report(self) -> TestReport:
        """The tests so far, and whether anything changed (a change undone is none)."""
        return TestReport(self.task_id, tuple(self.results), state_changed=bool(self.diff.changes))


def normalize(value: Any) -> Any:
    """Answers compare case-insensitively, numbers to the cent ("$12.50" == 12.5)."""
    if value is None:
        return None
    if isinstance(value, bool):  # kept apart from 1 and 0; "True" matches True
        return str(value).lower()
    if isinstance(value, int | float):
        return round(float(value), 2)
    if isinstance(value, str):
        text = value.strip().strip(".").strip()
        number = parse_number(text)
        if number is not None:
            return round(number, 2)
        return " ".join(text.lower().split())
    if isinstance(value, list | tuple):
        return [normalize(v) for v in value]
    return value


def parse_number(text: str) -> float | None:
    r"""The number `text` writes, or None: an optional "$", spaces, an optional "-", then digits
    and thousands commas, with at most one "." followed by digits ("$1,234.50", "-3", ".5").

    What the pattern `\$?\s*(-?[\d,]*\.?\d+)` accepted, read in one pass: that pattern
    backtracked in time quadratic in the length of a long run of digits that does not match
    (45,000 characters took 19 s).
    """
    body = text[1:] if text.startswith("$") else text
    body = body.lstrip()
    sign = "-" if body.startswith("-") else ""
    whole, dot, fraction = body[len(sign) :].partition(".")
    digits = whole.replace(",", "")
    if digits and not digits.isdecimal():  # isdecimal: the characters \d matches
        return None
    if dot:
        if not fraction.isdecimal():  # at least one digit, and no second "."
            return None
    elif not whole[-1:].isdecimal():  # digits and commas ending in a digit
        return None
    return float(f"{sign}{digits or '0'}.{fraction or '0'}")


def answers_match(answer: Any, expected: Any, *, ordered: bool = False) -> bool:
    """Whether `answer` equals `expected`; a list may come as a comma/newline separated string."""
    if isinstance(expected, list) and isinstance(answer, str):
        answer = [part for part in re.split(r"[,\n]", answer) if part.strip()]
    if isinstance(expected, list) and isinstance(answer, list) and len(answer) != len(expected):
        return False  # decided before normalising and sorting what may be many items
    got, want = normalize(answer), normalize(expected)
    if isinstance(want, list) and isinstance(got, list) and not ordered:
        return sorted(map(repr, got)) == sorted(map(repr, want))
    return bool(got == want)
