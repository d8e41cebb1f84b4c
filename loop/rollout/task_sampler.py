"""The task sampler: seeded draws without replacement, reshuffled when the pool is exhausted.

Its state is a few integers (which pass over the tasks, how far into it), the outcome of each
task's last group and its own random stream, so a resumed run draws exactly the tasks an
uninterrupted one would have.

LOOP learns only from groups whose rollouts differ: a group that all solved, or all failed with
the same reward, has zero leave-one-out advantage everywhere and is filtered out whole. With
`no_signal_draw_prob < 1` a task whose last group carried no signal is drawn only with that
probability when its turn comes (skipped otherwise, until the next pass), so iterations spend
their rollouts where there is something to learn (prime-rl's easy/hard pools, DAPO's dynamic
sampling). The skips are counted by kind (`solved`: every rollout succeeded; `stuck`: every
rollout had the same reward short of success). At 1.0 (the default) draws are the paper's.

`stratify="scenario"` interleaves each pass's order by scenario (a shuffled round-robin over
the scenarios, each scenario's tasks in shuffled order): while every scenario has tasks left in
the pass, any N consecutive draws cover min(N, scenarios) scenarios. With few tasks an
iteration and tasks that are variants of a few scenarios, uniform draws can fill an iteration
with one scenario, and the update then teaches that scenario's moves to every task. Off (None)
by default: the paper's draws.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any, Literal

from loop.config import ConfigError, TrainConfig
from tasks import Task, TaskSuite

Signal = Literal["signal", "solved", "stuck"]
Stratify = Literal["scenario"] | None


def group_signal(rewards: Sequence[float], successes: Sequence[bool]) -> Signal:
    """What a finished group can teach: "signal" when its rewards differ, else "solved" (all
    succeeded) or "stuck" (all the same reward without success). An empty group: "signal"."""
    if not rewards or max(rewards) != min(rewards):
        return "signal"
    return "solved" if all(successes) else "stuck"


class TaskSampler:
    """Draws tasks in a seeded order; pass p's order is a shuffle seeded by (seed, p)."""

    def __init__(
        self,
        tasks: Sequence[Any],
        seed: int,
        *,
        no_signal_draw_prob: float = 1.0,
        stratify: Stratify = None,
    ):
        if not tasks:
            raise ValueError("no tasks to sample from")
        if not 0 < no_signal_draw_prob <= 1:
            raise ValueError(f"no_signal_draw_prob must be in (0, 1], got {no_signal_draw_prob}")
        self.tasks = list(tasks)
        self.seed = seed
        self.no_signal_draw_prob = no_signal_draw_prob
        self.stratify = stratify
        self.passes = 0  # completed passes over the tasks
        self.position = 0  # draws taken from the current pass
        self.last_signal: dict[str, Signal] = {}  # task id -> what its last group taught
        self.skipped = {"solved": 0, "stuck": 0}  # skips since the last `take_skip_counts`
        self._rng = random.Random(f"{seed}/no-signal")
        self._order = self._shuffled(0)

    def draw(self, n: int) -> list[Any]:
        """The next `n` tasks (a task repeats within one draw only if `n` exceeds the pool)."""
        drawn: list[Any] = []
        while len(drawn) < n:
            if self.position == len(self._order):
                self.passes += 1
                self.position = 0
                self._order = self._shuffled(self.passes)
            task = self._order[self.position]
            self.position += 1
            if self.no_signal_draw_prob < 1:
                signal = self.last_signal.get(task.id, "signal")
                if signal != "signal" and self._rng.random() >= self.no_signal_draw_prob:
                    self.skipped[signal] += 1
                    continue
            drawn.append(task)
        return drawn

    def record(self, task_id: str, signal: Signal) -> None:
        """Remember what the task's latest group taught (decides its next draws)."""
        self.last_signal[task_id] = signal

    def take_skip_counts(self) -> dict[str, int]:
        """Skips since the last call, by kind, as `sampler/*` metrics; resets the counts."""
        counts = {f"sampler/skipped_{kind}": count for kind, count in self.skipped.items()}
        self.skipped = dict.fromkeys(self.skipped, 0)
        return counts

    def state_dict(self) -> dict[str, Any]:
        """Where the sampler stands."""
        return {
            "seed": self.seed,
            "passes": self.passes,
            "position": self.position,
            "last_signal": dict(self.last_signal),
            "rng": self._rng.getstate(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a `state_dict` (older states without signals start with none)."""
        self.seed, self.passes, self.position = state["seed"], state["passes"], state["position"]
        self.last_signal = dict(state.get("last_signal", {}))
        if "rng" in state:
            self._rng.setstate(state["rng"])
        self._order = self._shuffled(self.passes)

    def _shuffled(self, index: int) -> list[Any]:
        order = list(self.tasks)
        random.Random(self.seed * 1_000_003 + index).shuffle(order)
        if self.stratify is None:
            return order
        return interleave(order, key=lambda task: task.scenario_id)


def interleave(order: Sequence[Any], key: Callable[[Any], Any]) -> list[Any]:
    """`order` regrouped round-robin by `key`: the groups in order of first appearance, each
    group's items in their order (so a shuffled `order` gives a shuffled round-robin)."""
    groups: dict[Any, list[Any]] = defaultdict(list)
    for item in order:
        groups[key(item)].append(item)
    depth = max((len(g) for g in groups.values()), default=0)
    return [g[i] for i in range(depth) for g in groups.values() if i < len(g)]


def training_tasks(suite: TaskSuite, cfg: TrainConfig) -> list[Task]:
    """The split's tasks, up to `max_difficulty`."""
    return split_tasks(suite, cfg.split, cfg.max_difficulty, "train.split")


def split_tasks(
    suite: TaskSuite, split: str, max_difficulty: int | None, setting: str
) -> list[Task]:
    """`split`'s tasks up to `max_difficulty` (None: all); a ConfigError naming `setting` (the
    config key that chose the split) when none is left. Splits joined by `+` (`easy+lookup_warm`)
    give their tasks one split after the other."""
    every = [t for name in split.split("+") for t in suite.tasks(name)]
    tasks = [t for t in every if max_difficulty is None or t.difficulty <= max_difficulty]
    if not tasks:
        raise ConfigError(f"{setting} {split!r} has no task of difficulty <= {max_difficulty}")
    return tasks
