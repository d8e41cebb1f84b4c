"""The `hf` generator's requests on their way in: from the callers' event loops to the worker
thread (`inbox`), and those waiting for room for their keys and values under
`generator.kv_rows_mb` (`waiting`, in the order they came: once one waits, newcomers wait
behind it; one taken from the line joins on its own room or goes back to its place). The room
is the engine's own rule (`DecoderEngine.kv_bytes`)."""

from __future__ import annotations

import collections
import queue
import time
from typing import TYPE_CHECKING

from loop.generators.base import GeneratorError
from loop.generators.hf.requests import Request

if TYPE_CHECKING:
    from loop.generators.hf.engine import DecoderEngine
    from loop.generators.hf.kvcache import KVStore


class Admission:
    """The inbox and the waiting line of one generator (see the module docstring)."""

    def __init__(self, batch_wait_s: float, kv_rows_bytes: int | None):
        self.inbox: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self.waiting: collections.deque[Request] = collections.deque()
        self.batch_wait_s = batch_wait_s  # the static path: how long a batch waits for more
        self.kv_rows_bytes = kv_rows_bytes  # the rows' keys and values at most; None: no bound
        self.waits = 0  # requests that waited for room
        self._put_back = 0  # requests taken from the line this step and put back at its front

    def take(self, limit: int, *, block: bool, static: bool) -> list[Request]:
        """Up to `limit` requests, those waiting for room first: waiting for the first when
        `block`, and on the `static` path up to `batch_wait_s` for more."""
        taken: list[Request] = []
        self._put_back = 0
        while self.waiting and len(taken) < limit:
            waiting = self.waiting.popleft()
            if not waiting.future.done():  # not cancelled meanwhile
                taken.append(waiting)
        deadline = time.monotonic() + self.batch_wait_s
        while len(taken) < limit:
            wait = deadline - time.monotonic() if static else 0.0
            try:
                if block and not taken:
                    request = self.inbox.get()
                elif taken and wait > 0:
                    request = self.inbox.get(timeout=wait)
                else:
                    request = self.inbox.get_nowait()
            except queue.Empty:
                break
            if request is None:  # close() wakes the worker
                break
            if not request.future.done():  # not cancelled meanwhile
                taken.append(request)
        return taken

    def room(self, request: Request, engine: DecoderEngine, cache: KVStore) -> str | Exception:
        """ "yes" when the rows' keys and values stay within `kv_rows_bytes` with `request`'s
        row (its prompt tokens past what the store covers, and `max_new_tokens`); "wait" while
        other rows hold the room (or others wait before it); the error to deliver when it
        would not fit with no other row."""
        if self.waiting and not request.waited:  # a newcomer queues behind those waiting
            return "wait"
        if self.kv_rows_bytes is None:
            return "yes"
        prompt = request.prompt_token_ids
        need = len(prompt) - cache.match(prompt, take=False).n_prefix
        need += request.params.max_new_tokens
        if engine.kv_bytes(need) <= self.kv_rows_bytes:
            return "yes"
        if engine.rows:
            return "wait"
        return GeneratorError(
            f"a request of {len(prompt)} prompt tokens and max_new_tokens="
            f"{request.params.max_new_tokens} needs {engine.kv_bytes(need) / 2**20:.0f} MiB "
            f"of keys and values alone, over generator.kv_rows_mb={self.kv_rows_bytes / 2**20:g}"
        )

    def wait(self, request: Request) -> None:
        """`request` waits for room: a newcomer after those already waiting, one taken from
        the line put back where it was (before those not taken)."""
        if request.waited:
            self.waiting.insert(self._put_back, request)
            self._put_back += 1
            return
        self.waits += 1
        request.waited = True
        self.waiting.append(request)

    def drain(self) -> list[Request]:
        """Every request waiting or queued, taken out (the generator is failing them)."""
        drained, self.waiting = list(self.waiting), collections.deque()
        while not self.inbox.empty():
            if (request := self.inbox.get_nowait()) is not None:
                drained.append(request)
        return drained
