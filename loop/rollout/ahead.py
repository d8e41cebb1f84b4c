"""Rollouts collected ahead of learning (`train.overlap.max_staleness` S): the asyncio side of
the overlap.

The trainer asks `take(k)` for iteration k's groups. With S = 0 that draws the tasks and
collects them then and there: the synchronous loop, unchanged. With S >= 1, once iteration k
has assembled its groups, `dispatch_ahead(k)` draws the tasks of iterations k+1 .. k+S (those
not dispatched yet, within the admission bound of loop/rollout/staleness.py) and starts their
collections as asyncio tasks on this event loop; the learner's steps 4-5 then run in a worker
thread (`off_loop`, one call: loop/learner/update.py, which first puts the thread on the
policy's GPU; torch releases the GIL), so the servers sample and the sandboxes run while the
learner trains, and `take(k+1)` awaits what is left.
Each group is pinned to the version published when its first rollout starts
(loop/rollout/collect.py), which `published` tracks.

Draw order. The tasks of k+1 are drawn after iteration k told the sampler its groups' signals,
so with S = 1 the sampler sees draws and signals in the synchronous loop's order (the same
tasks, given the same signals; with S >= 2 a draw comes before the signals of the iterations
still in flight).

Resume. A checkpoint after iteration k records the tasks of the iterations dispatched ahead
and not yet trained (`pending_tasks`) together with the sampler state after their draws. On a
kill their rollouts are lost; on resume those iterations re-collect the same tasks (same
seeds, a fresher policy) rather than draw new ones, and the number of groups re-collected is
counted (`recollected`, logged as `stale/groups_recollected`). So no group is trained twice and
none is lost uncounted, and the draws after them continue exactly as in the killed run. (The
alternative, saving the sampler state from before the ahead draws, would make a resumed run
redraw them too, but the signals of the iteration being trained arrive between the draws with
S >= 2, so no single sampler state is "before" all of them.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from loop.rollout.staleness import admits
from loop.rollout.trajectory import Trajectory
from tasks import Task

T = TypeVar("T")


@dataclass
class Collection:
    """One iteration's collected groups."""

    tasks: list[Task]  # the tasks drawn for it, one group each
    groups: list[list[Trajectory]]
    discarded: int  # rollouts cancelled by the straggler cut-off
    rollout_s: float  # the collection's own wall time
    wait_s: float = 0.0  # how long the learner waited for it in `take`
    metrics: dict[str, float] = field(default_factory=dict)  # the collector's own (search/*)


Collected = tuple[list[list[Trajectory]], int, dict[str, float]]  # groups, discarded, metrics
Collect = Callable[[int, list[Task]], Awaitable[Collected]]
Draw = Callable[[], list[Task]]


class AheadCollector:
    """Iterations' collections, in step or ahead of the learner (see the module docstring)."""

    def __init__(
        self, collect: Collect, *, max_staleness: int, tasks_per_iteration: int,
        iterations: int, published: int, saved: dict[int, list[Task]] | None = None,
    ) -> None:  # fmt: skip
        """`collect(iteration, tasks)` -> (groups, discarded); `iterations`: the run's total;
        `published`: the policy version the generator serves now; `saved`: the tasks of the
        iterations a killed run had dispatched ahead (re-collected, counted)."""
        self.collect, self.max_staleness = collect, max_staleness
        self.tasks_per_iteration, self.iterations = tasks_per_iteration, iterations
        self.published = published  # the updates published: the version new groups get
        self._saved = dict(saved or {})
        self.recollected = sum(len(tasks) for tasks in self._saved.values())
        self._running: dict[int, tuple[list[Task], asyncio.Task[Collection]]] = {}

    async def take(self, iteration: int, draw: Draw) -> Collection:
        """Iteration `iteration`'s groups: awaited if dispatched ahead, else collected now
        (the saved tasks of a killed run's iteration, or `draw()`'s)."""
        started = time.monotonic()
        if iteration in self._running:
            collection = await self._running.pop(iteration)[1]
        else:
            collection = await self._collect(iteration, self._saved.pop(iteration, []) or draw())
        collection.wait_s = time.monotonic() - started
        return collection

    def dispatch_ahead(self, iteration: int, draw: Draw) -> int:
        """Start collecting iterations iteration+1 .. iteration+S that are not yet running,
        while the admission bound allows; the number of groups dispatched."""
        dispatched = 0
        for ahead in range(
            iteration + 1, min(iteration + self.max_staleness, self.iterations - 1) + 1
        ):
            if ahead in self._running:
                continue
            in_flight = sum(len(tasks) for tasks, _ in self._running.values())
            n = self.tasks_per_iteration
            if not admits(n, in_flight, n, n, self.max_staleness):
                break
            tasks = self._saved.pop(ahead, []) or draw()
            task = asyncio.ensure_future(self._collect(ahead, tasks))
            self._running[ahead] = (tasks, task)
            dispatched += len(tasks)
        return dispatched

    def pending_tasks(self) -> dict[int, list[str]]:
        """The task ids of the iterations dispatched and not yet taken (for the checkpoint)."""
        pending = {j: [t.id for t in tasks] for j, (tasks, _) in self._running.items()}
        return pending | {j: [t.id for t in tasks] for j, tasks in self._saved.items()}

    async def off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)`: in a worker thread while collections run ahead (so they progress),
        else right here (the synchronous loop, unchanged)."""
        if self.max_staleness and self._running:
            return await asyncio.to_thread(fn, *args)
        return fn(*args)

    async def cancel(self) -> None:
        """Stop the collections still running (their rollouts are discarded)."""
        running = [task for _, task in self._running.values()]
        self._running.clear()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)

    async def _collect(self, iteration: int, tasks: list[Task]) -> Collection:
        started = time.monotonic()
        groups, discarded, metrics = await self.collect(iteration, tasks)
        return Collection(tasks, groups, discarded, time.monotonic() - started, metrics=metrics)
