"""A pool of AppWorld engine processes, started ahead of demand, recycled and replaced.

- `size` engines are started in the background when the pool is made, so the first rollouts
  do not wait for the 5-20 s cold start; when all are busy, `acquire()` starts one more, and
  such extras are retired when they come back while `size` others are idle.
- An engine is retired after `max_tasks_per_engine` tasks (the engine leaks about 1 MiB per
  task) and replaced in the background.
- A dead engine (crashed, hung, killed) is never handed out again; a replacement is started.
Engines serve one rollout at a time: `acquire()` gives one out, `release()` takes it back.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import weakref
from collections import Counter

from tasks.appworld.engine import EngineProcess, EngineSpec, EngineStartError

log = logging.getLogger(__name__)
_live_pools: weakref.WeakSet[EnginePool] = weakref.WeakSet()


class EnginePool:
    """Warm engines for one data root; thread-safe."""

    def __init__(self, spec: EngineSpec, *, size: int = 2, max_tasks_per_engine: int = 100):
        if size < 0 or max_tasks_per_engine < 1:
            raise ValueError(
                f"EnginePool needs size >= 0 and max_tasks_per_engine >= 1, "
                f"got {size}, {max_tasks_per_engine}"
            )
        self.spec = spec
        self.size = size
        self.max_tasks_per_engine = max_tasks_per_engine
        self.stats: Counter[str] = Counter()  # started, crashed, recycled, start_failures
        self._idle: list[EngineProcess] = []
        self._busy: set[EngineProcess] = set()
        self._starting = 0
        self._start_error: EngineStartError | None = None
        self._closed = False
        self._closing = threading.Event()  # cancels engines still starting
        self._cond = threading.Condition()
        _live_pools.add(self)
        with self._cond:
            for _ in range(size):
                self._start_in_background()

    def acquire(self, timeout_s: float | None = None) -> EngineProcess:
        """A ready engine with no open task (waits for one; raises EngineStartError if
        engines cannot be started, TimeoutError after `timeout_s`)."""
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("the engine pool is closed")
                while self._idle:
                    engine = self._idle.pop()
                    if engine.alive():
                        self._busy.add(engine)
                        return engine
                    self._retire(engine, "crashed")
                if self._start_error is not None and self._starting == 0:
                    error, self._start_error = self._start_error, None
                    raise error
                if self._starting == 0:
                    self._start_in_background()  # demand beyond the warm engines
                if not self._cond.wait(timeout=timeout_s):
                    raise TimeoutError(f"no AppWorld engine became ready in {timeout_s} s")

    def release(self, engine: EngineProcess, *, reusable: bool = True) -> None:
        """Take an engine back. Not `reusable` (a task left open, a failed close), dead, or
        past `max_tasks_per_engine`: it is retired and, if needed, replaced."""
        with self._cond:
            self._busy.discard(engine)
            if self._closed:
                self._retire(engine, "closed")
            elif not engine.alive():
                self._retire(engine, "crashed")
            elif not reusable:
                self._retire(engine, "discarded")
            elif engine.tasks_started >= self.max_tasks_per_engine:
                self._retire(engine, "recycled")
            elif len(self._idle) >= self.size:
                self._retire(engine, "surplus")
            else:
                self._idle.append(engine)
            self._top_up()
            self._cond.notify_all()

    def engines(self) -> list[EngineProcess]:
        """Every live engine, idle or busy (for measurements and tests)."""
        with self._cond:
            return [*self._idle, *self._busy]

    def close(self, wait_s: float = 10.0) -> None:
        """Kill every engine, idle and busy, and cancel those starting (idempotent; waits up
        to `wait_s` for the cancelled starts, so nothing is left behind at exit)."""
        with self._cond:
            self._closed = True
            self._closing.set()
            engines = [*self._idle, *self._busy]
            self._idle.clear()
            self._busy.clear()
            self._cond.notify_all()
        for engine in engines:
            engine.kill()
        with self._cond:
            self._cond.wait_for(lambda: self._starting == 0, timeout=wait_s)

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals (called with self._cond held) -------------------------------------------

    def _retire(self, engine: EngineProcess, why: str) -> None:
        self.stats[why] += 1
        if why == "crashed":
            why_dead = engine.crashed or engine.exit_reason()
            log.warning("AppWorld engine pid %d is dead (%s); replacing it", engine.pid, why_dead)
        threading.Thread(target=engine.kill, name="appworld-retire", daemon=True).start()

    def _top_up(self) -> None:
        """Keep `size` engines ready or on their way."""
        if self._closed:
            return
        missing = self.size - len(self._idle) - len(self._busy) - self._starting
        for _ in range(max(0, missing)):
            self._start_in_background()

    def _start_in_background(self) -> None:
        self._starting += 1
        threading.Thread(target=self._start_one, name="appworld-engine-start", daemon=True).start()

    def _start_one(self) -> None:
        try:
            if self._closed:
                raise EngineStartError("the engine pool was closed")
            engine = EngineProcess.start(self.spec, cancel=self._closing)
        except Exception as exc:
            error = exc if isinstance(exc, EngineStartError) else EngineStartError(str(exc))
            with self._cond:
                self._starting -= 1
                if not self._closed:
                    self.stats["start_failures"] += 1
                    self._start_error = error
                    log.error("%s", error)
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            self.stats["started"] += 1
            if self._closed:
                engine_to_kill: EngineProcess | None = engine
            else:
                engine_to_kill = None
                self._idle.append(engine)
            self._cond.notify_all()
        if engine_to_kill is not None:
            engine_to_kill.kill()


@atexit.register
def _close_all() -> None:
    """Kill the engines of every pool still open at interpreter exit."""
    for pool in list(_live_pools):
        with contextlib.suppress(Exception):
            pool.close()
