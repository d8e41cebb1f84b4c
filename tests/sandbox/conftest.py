"""Fixtures for the sandbox tests: a warm pool per module, a fresh sandbox per test, a canary.

Run: python -m pytest tests/sandbox            (add -m "not slow" to skip the slow ones)
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest

from sandbox import ApiError, KernelPool, Sandbox

HOST_SECRET = "host-secret-7f3a9c"  # lives only in the host-side handler's state


class EchoWorld:
    """A bridge handler for tests: echoes, raises API errors and records every call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.secret = HOST_SECRET

    def __call__(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        self.calls.append((app, api, kwargs))
        if api == "echo":
            return {"app": app, "kwargs": kwargs}
        if api == "missing":
            raise ApiError(f"no such thing: {kwargs}", status=404)
        if api == "crash":
            raise RuntimeError("handler bug")
        if api == "leak":  # a deliberately broken handler, for positive controls
            return {"secret": self.secret}
        if api == "big":
            return "z" * int(kwargs["n"])
        raise ApiError(f"unknown api {app}.{api}", status=404)


@pytest.fixture(scope="module")
def pool() -> Iterator[KernelPool]:
    with KernelPool(size=2, timeout_s=10, strict=True) as kernel_pool:
        yield kernel_pool


@pytest.fixture
def world() -> EchoWorld:
    return EchoWorld()


@pytest.fixture
def sb(pool: KernelPool, world: EchoWorld) -> Iterator[Sandbox]:
    """A fresh sandbox from the pool, released (destroyed) after the test."""
    sandbox = pool.acquire(handler=world, timeout=60)
    try:
        yield sandbox
    finally:
        pool.release(sandbox)


@pytest.fixture(scope="module")
def canary() -> Iterator[Sandbox]:
    """A sandbox that stays up for the whole module: hostile code elsewhere must not hurt it."""
    with Sandbox(timeout_s=10, strict=True) as sandbox:
        yield sandbox


def assert_healthy(canary: Sandbox) -> None:
    """The host and other sandboxes still work promptly."""
    start = time.monotonic()
    result = canary.execute("sum(range(1000))", timeout=10)
    assert result.output == "499500\n", result
    assert time.monotonic() - start < 5, f"canary took {time.monotonic() - start:.1f} s"


def processes_of(uid: int | None) -> list[psutil.Process]:
    """Live processes running under a sandbox's uid (zombies excluded)."""
    assert uid is not None, "these tests need a per-sandbox uid (run as root)"
    found = []
    for proc in psutil.process_iter(["uids", "status"]):
        info = proc.info
        if info["uids"] and info["uids"].real == uid and info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def wait_until(predicate: Any, timeout_s: float = 10.0) -> bool:
    """Poll `predicate` until it is true or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())
