"""`AppTownSuite`: the built-in task suite: the world, its 30+ scenarios x 3 variants, the
splits, each task's initial state, and grading.

A task's initial state is the world's template plus that variant's setup, built on first use
as its own in-memory snapshot; `initial_state(task).fork()` then hands every rollout a
byte-identical private copy in about a millisecond. A snapshot is kept while an environment
holds it and built again (deterministically, in about a millisecond) after: the host then holds
the states of the tasks in flight, not of every task it ever ran (108 snapshots, 110 MiB, for
the quickstart's two splits).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tasks.apptown.example import example_messages
from tasks.apptown.grading import Grader
from tasks.apptown.people import Person
from tasks.apptown.scenario import PAGES_HELPER, Scenario, Variant
from tasks.apptown.scenarios import SCENARIOS
from tasks.apptown.world import Snapshot, World
from tasks.core import SPLITS, SandboxLike, Task, TestReport

# The AppWorld-style splits, then the easy band for small models: `easy` (more variants of the
# difficulty-1 train scenarios, for warm start and RL) and `easy_heldout` (variants of the same
# scenarios that no training uses, for measuring what training did); then the lookup band:
# `lookup` and `lookup_heldout`, more variants of difficulty-2 train scenarios and difficulty-1
# scenarios of their own, all needing APIs the easy band's gold solutions never call (where
# reading the documentation pays), and `lookup_warm`, demonstrations only: the easy band's apps
# with other APIs (scenarios/lookup_warm.py).
APPTOWN_SPLITS: tuple[str, ...] = (
    *SPLITS, "easy", "easy_heldout", "lookup", "lookup_heldout", "lookup_warm",
)  # fmt: skip

if TYPE_CHECKING:
    from tasks.apptown.env import AppTownEnv


@dataclass(frozen=True)
class _Entry:
    task: Task
    scenario: Scenario
    variant: Variant


class AppTownSuite:
    """The tasks of one seeded AppTown world (`suite: apptown` in a config)."""

    name = "apptown"
    uses_sandbox = True
    marks_collateral = True  # grading.py marks no_collateral_changes; api.py marks the reads
    replays_exactly = True  # a fixed clock, seeded content, SQLite state forked per reset

    def __init__(
        self, seed: int = 0, n_people: int = 72, scenarios: tuple[Scenario, ...] = SCENARIOS
    ):
        self.world = World.build(seed, n_people)
        self._entries: dict[str, _Entry] = {}
        for scenario in scenarios:
            variants = scenario.variants(self.world)
            assert [v.n for v in variants] == list(range(1, scenario.num_variants + 1)), (
                scenario.id,
                variants,
            )
            for v in variants:
                split = scenario.split_of(v.n)
                assert split in APPTOWN_SPLITS, (scenario.id, split)
                task = Task(
                    f"{scenario.id}_{v.n}",
                    scenario.id,
                    v.n,
                    scenario.difficulty,
                    v.instruction,
                    scenario.apps,
                    split,
                )
                assert task.id not in self._entries, f"duplicate task id {task.id}"
                self._entries[task.id] = _Entry(task, scenario, v)
        # the snapshots environments hold (see the module docstring)
        self._states: weakref.WeakValueDictionary[str, Snapshot] = weakref.WeakValueDictionary()
        self._states_lock = threading.Lock()
        self._example: list[dict[str, str]] | None = None

    @property
    def splits(self) -> dict[str, list[Task]]:
        return {split: self.tasks(split) for split in APPTOWN_SPLITS}

    def tasks(self, split: str) -> list[Task]:
        """The tasks of one split, in a fixed order."""
        if split not in APPTOWN_SPLITS:
            raise KeyError(f"unknown split {split!r}; the splits are {', '.join(APPTOWN_SPLITS)}")
        return [e.task for e in self._entries.values() if e.task.split == split]

    def task(self, task_id: str) -> Task:
        return self._entry(task_id).task

    def user_of(self, task: Task) -> Person:
        """The supervisor: the person the agent acts for in this task."""
        return self.world.person(self._entry(task.id).variant.user_id)

    def make_env(self, task: Task, sandbox: SandboxLike | None) -> AppTownEnv:
        """An environment for `task` in `sandbox`; call `reset()` on it to start an episode."""
        assert sandbox is not None, f"{task.id}: AppTown runs the agent's code in a sandbox"
        from tasks.apptown.env import AppTownEnv  # needs the sandbox package; the rest does not

        return AppTownEnv(
            task, sandbox, user=self.user_of(task), initial_state=self.initial_state(task),
            now=self.world.now, grade=functools.partial(self.grade, task),
        )  # fmt: skip

    def example_messages(self) -> list[dict[str, str]]:
        """The prompt's worked example, run against this world (tasks/apptown/example.py)."""
        with self._states_lock:
            if self._example is None:
                self._example = example_messages(self.world)
            return list(self._example)

    def initial_state(self, task: Task) -> Snapshot:
        """The task's initial state (world + variant setup): the one an environment holds, or
        built again."""
        with self._states_lock:
            state = self._states.get(task.id)
            if state is None:
                entry = self._entry(task.id)
                db = self.world.template.fork()
                entry.scenario.setup(db, self.world, entry.variant)
                db.execute("DELETE FROM _changes")  # the setup is part of the initial state
                state = self._states[task.id] = Snapshot(db)
            return state

    def grade(self, task: Task, db: sqlite3.Connection, answer: Any, completed: bool) -> TestReport:
        """The task's tests on a final state `db` (the one scoring path for reward and eval)."""
        entry = self._entry(task.id)
        grader = Grader(task.id, self.initial_state(task), db, answer, completed)
        entry.scenario.evaluate(grader, entry.variant)
        report = grader.report()
        assert report.tests and report.tests[-1].name == "no_collateral_changes", (
            f"{task.id}: every scenario must end with the collateral-damage check"
        )
        return report

    def gold_solution(self, task: Task) -> list[str]:
        """The reference solution's code cells (the login cell defines the `all_pages` helper
        only when a later cell uses it)."""
        entry = self._entry(task.id)
        cells = entry.scenario.gold(entry.variant)
        if cells and PAGES_HELPER in cells[0] and not any("all_pages(" in c for c in cells[1:]):
            cells = [cells[0].replace(PAGES_HELPER + "\n", ""), *cells[1:]]
        return cells

    def wrong_solution(self, task: Task) -> list[str]:
        """A plausible wrong solution's code cells (it must fail at least one test)."""
        entry = self._entry(task.id)
        return entry.scenario.wrong(entry.variant)

    def _entry(self, task_id: str) -> _Entry:
        if task_id not in self._entries:
            raise KeyError(f"no task {task_id!r} in suite {self.name}")
        return self._entries[task_id]
