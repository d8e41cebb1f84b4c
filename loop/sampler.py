"""The task sampler: seeded draws without replacement, reshuffled when the pool is exhausted.

Its state is two integers (which pass over the tasks, how far into it), so a resumed run draws
exactly the tasks an uninterrupted one would have.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any


class TaskSampler:
    """Draws tasks in a seeded order; pass p's order is a shuffle seeded by (seed, p)."""

    def __init__(self, tasks: Sequence[Any], seed: int):
        if not tasks:
            raise ValueError("no tasks to sample from")
        self.tasks = list(tasks)
        self.seed = seed
        self.passes = 0  # completed passes over the tasks
        self.position = 0  # draws taken from the current pass
        self._order = self._shuffled(0)

    def draw(self, n: int) -> list[Any]:
        """The next `n` tasks (a task repeats within one draw only if `n` exceeds the pool)."""
        drawn = []
        for _ in range(n):
            if self.position == len(self._order):
                self.passes += 1
                self.position = 0
                self._order = self._shuffled(self.passes)
            drawn.append(self._order[self.position])
            self.position += 1
        return drawn

    def state_dict(self) -> dict[str, int]:
        """Where the sampler stands."""
        return {"seed": self.seed, "passes": self.passes, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue from a `state_dict`."""
        self.seed, self.passes, self.position = state["seed"], state["passes"], state["position"]
        self._order = self._shuffled(self.passes)

    def _shuffled(self, index: int) -> list[Any]:
        order = list(self.tasks)
        random.Random(self.seed * 1_000_003 + index).shuffle(order)
        return order
