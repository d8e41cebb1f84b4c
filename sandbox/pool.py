"""`KernelPool`: warm sandboxes ready before a rollout asks, and never reused across rollouts.

    pool = KernelPool(size=8, timeout_s=30)
    sb = pool.acquire(handler=env.handle)       # a fresh, already-started kernel
    ...
    pool.release(sb)                             # killed and deleted; a new one warms up

A background thread keeps `size` idle sandboxes started (at most `max_starting` cold starts at
once, so warming does not starve the rollouts of CPU). `release` always destroys the sandbox:
the next rollout gets a kernel nobody ran code in. A warm kernel that died while idle is
dropped at `acquire` and counted in `stats["dead_on_acquire"]`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sandbox.bridge import Handler
from sandbox.kernel import Sandbox

log = logging.getLogger(__name__)


class KernelPool:
    """A pool of warm `Sandbox`es; `sandbox_kwargs` go to every `Sandbox(...)`."""

    def __init__(self, size: int = 4, *, max_starting: int = 2, **sandbox_kwargs: Any) -> None:
        if size < 0 or max_starting < 1:
            raise ValueError(f"need size >= 0 and max_starting >= 1, got {size}, {max_starting}")
        self.size = size
        self.sandbox_kwargs = sandbox_kwargs
        self.stats = {
            "started": 0,
            "acquired": 0,
            "released": 0,
            "dead_on_acquire": 0,
            "start_failures": 0,
        }
        self._idle: deque[Sandbox] = deque()
        self._leased: set[Sandbox] = set()
        self._starting = 0
        self._cond = threading.Condition()
        self._closed = False
        self._last_error: BaseException | None = None
        self._workers = ThreadPoolExecutor(
            max_workers=max_starting + 2, thread_name_prefix="kernel-pool"
        )
        self._max_starting = max_starting
        self._refill()

    # -- public API -------------------------------------------------------------------------

    def acquire(self, handler: Handler | None = None, timeout: float | None = None) -> Sandbox:
        """A fresh started sandbox with `handler` attached; waits for one if none is warm."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("acquire() on a closed KernelPool")
                while self._idle:
                    sandbox = self._idle.popleft()
                    if sandbox.alive():
                        self._leased.add(sandbox)
                        self.stats["acquired"] += 1
                        self._refill_locked()
                        sandbox.set_handler(handler)
                        return sandbox
                    self.stats["dead_on_acquire"] += 1
                    self._workers.submit(sandbox.close)  # not closed: the pool is open
                if self._last_error is not None and self._starting == 0:
                    error, self._last_error = self._last_error, None
                    raise RuntimeError(f"the pool cannot start kernels: {error}") from error
                self._refill_locked(extra=1)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TimeoutError(f"no sandbox became ready within {timeout} s")
                self._cond.wait(timeout=remaining)

    def release(self, sandbox: Sandbox) -> None:
        """Give a sandbox back: it is destroyed (in the background) and replaced."""
        with self._cond:
            self._leased.discard(sandbox)
            self.stats["released"] += 1
            sandbox.set_handler(None)
            closed = self._closed
            if not closed:
                self._refill_locked()
                self._workers.submit(sandbox.close)
        if closed:
            sandbox.close()

    async def acquire_async(
        self, handler: Handler | None = None, timeout: float | None = None
    ) -> Sandbox:
        """`acquire` without blocking the event loop."""
        return await asyncio.to_thread(self.acquire, handler, timeout)

    async def release_async(self, sandbox: Sandbox) -> None:
        """`release` without blocking the event loop."""
        await asyncio.to_thread(self.release, sandbox)

    @contextlib.contextmanager
    def sandbox(self, handler: Handler | None = None) -> Iterator[Sandbox]:
        """`with pool.sandbox(handler) as sb:` acquires and always releases."""
        sb = self.acquire(handler)
        try:
            yield sb
        finally:
            self.release(sb)

    def close(self) -> None:
        """Destroy every sandbox, idle and leased, and stop warming (idempotent)."""
        with self._cond:
            self._closed = True
            doomed = list(self._idle) + list(self._leased)
            self._idle.clear()
            self._leased.clear()
            self._cond.notify_all()
        for sandbox in doomed:
            sandbox.close()
        self._workers.shutdown(wait=True)  # a start still running closes its own sandbox

    def __enter__(self) -> KernelPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def idle(self) -> int:
        """Warm sandboxes ready now."""
        return len(self._idle)

    # -- warming ----------------------------------------------------------------------------

    def _refill(self) -> None:
        with self._cond:
            self._refill_locked()

    def _refill_locked(self, extra: int = 0) -> None:
        wanted = self.size + extra - len(self._idle) - self._starting
        while wanted > 0 and self._starting < self._max_starting and not self._closed:
            self._starting += 1
            wanted -= 1
            self._workers.submit(self._start_one)

    def _start_one(self) -> None:
        sandbox: Sandbox | None = None
        try:
            sandbox = Sandbox(**self.sandbox_kwargs)
        except Exception as exc:  # reported to the next acquire()
            log.error("kernel pool: a sandbox failed to start: %s", exc)
            with self._cond:
                self._starting -= 1
                self.stats["start_failures"] += 1
                self._last_error = exc
                self._cond.notify_all()
            return
        with self._cond:
            self._starting -= 1
            keep = not self._closed
            if keep:
                self.stats["started"] += 1
                self._idle.append(sandbox)
                self._refill_locked()
            self._cond.notify_all()
        if not keep:
            sandbox.close()
