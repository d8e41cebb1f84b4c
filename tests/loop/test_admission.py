"""The hf generator's waiting line (loop/generators/hf/admission.py) with a stand-in engine
whose rows' keys and values are counted in tokens: first in, first out, and a request that
waited is judged on its own room when it is taken again."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from loop.generators.base import SamplingParams
from loop.generators.hf.admission import Admission
from loop.generators.hf.kvcache import KVStore
from loop.generators.hf.requests import Request


class Rows:
    """A stand-in engine: `held` tokens in rows, one byte a token."""

    def __init__(self, held: int):
        self.held = held
        self.rows: list[Any] = [SimpleNamespace()] if held else []

    def kv_bytes(self, joining: int = 0) -> int:
        return self.held + joining


def request(loop: asyncio.AbstractEventLoop, tokens: int) -> Request:
    params = SamplingParams(max_new_tokens=tokens)
    return Request([1], params, loop.create_future(), loop)  # 1 prompt token: nothing cached


def test_waiting_requests_join_in_order_when_fewer_rows_are_free_than_wait() -> None:
    loop = asyncio.new_event_loop()
    try:
        admission = Admission(batch_wait_s=0.0, kv_rows_bytes=100)
        first, second, third = (request(loop, 10) for _ in range(3))
        for waiting in (first, second, third):
            admission.wait(waiting)
        newcomer = request(loop, 10)
        admission.inbox.put(newcomer)
        engine, cache = Rows(held=50), KVStore(0)
        taken = admission.take(1, block=False, static=False)  # one free row
        assert taken == [first]
        # room for it: it joins though others still wait behind it
        assert admission.room(first, engine, cache) == "yes"  # type: ignore[arg-type]
        # a newcomer queues behind those waiting, room or not
        assert admission.room(newcomer, engine, cache) == "wait"  # type: ignore[arg-type]
        fourth = request(loop, 10)
        admission.wait(fourth)
        assert admission.take(2, block=False, static=False) == [second, third]
        full = Rows(held=95)
        for taken in (second, third):  # no room now: back to their places, in order
            assert admission.room(taken, full, cache) == "wait"  # type: ignore[arg-type]
            admission.wait(taken)
        assert list(admission.waiting) == [second, third, fourth]
        assert admission.waits == 4
    finally:
        loop.close()
