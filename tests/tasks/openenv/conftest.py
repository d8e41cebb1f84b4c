"""Our OpenEnv server, for the tests of both directions: the real app (tasks/openenv/server.py)
under uvicorn on a real socket, in a thread of the test process so that the tests can read its
sandbox pool; `python -m tasks.openenv serve` as a process is tested in test_cli.py.

Run: python -m pytest tests/tasks/openenv
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

pytest.importorskip("openenv", reason="the openenv extra: pip install -e .[test] brings it")

import uvicorn

from sandbox import KernelPool
from tasks.apptown import AppTownSuite
from tasks.openenv.guard import with_header_timeout
from tasks.openenv.server import build_app

MAX_MESSAGE_BYTES = 256 * 1024


@dataclass
class Served:
    """A running server: its URL and the pool its sessions take sandboxes from."""

    url: str
    pool: KernelPool
    headers: dict[str, str] = field(default_factory=dict)  # the bearer token, if it takes one

    def leased(self) -> int:
        """Sandboxes that sessions hold now, as the server reports them."""
        status = httpx.get(f"{self.url}/loop/status", headers=self.headers).json()
        return int(status["sandboxes_leased"])

    def wait_until_none_leased(self, timeout_s: float = 60.0) -> None:
        """Sessions end asynchronously after a disconnect: wait for their sandboxes to go back."""
        deadline = time.monotonic() + timeout_s
        while self.leased() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert self.leased() == 0
        stats = self.pool.stats
        assert stats["acquired"] == stats["released"], stats


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def served(
    suite: AppTownSuite,
    split: str,
    *,
    max_sessions: int = 32,
    pool_size: int = 2,
    header_timeout_s: float = 10.0,
    **app_kwargs: Any,
) -> Iterator[Served]:
    """Serve `split` of `suite` until the block ends; then stop, and destroy every sandbox.
    `app_kwargs` go to `build_app` (idle timeout, token)."""
    with KernelPool(size=pool_size, timeout_s=10) as pool:
        app = build_app(
            suite, pool, split=split, max_sessions=max_sessions, max_steps=10, **app_kwargs
        )
        port = free_port()
        config = uvicorn.Config(
            app, host="127.0.0.1", port=port, ws_max_size=MAX_MESSAGE_BYTES, log_level="warning",
            http=with_header_timeout(header_timeout_s),
        )  # fmt: skip
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not server.started:
            assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
            time.sleep(0.05)
        try:
            token = app_kwargs.get("token")
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            yield Served(f"http://127.0.0.1:{port}", pool, headers)
        finally:
            server.should_exit = True
            thread.join(timeout=30)


@pytest.fixture(scope="module")
def apptown() -> AppTownSuite:
    return AppTownSuite()


@pytest.fixture(scope="module")
def server(apptown: AppTownSuite) -> Iterator[Served]:
    with served(apptown, "dev") as running:
        yield running


@pytest.fixture(scope="module")
def tokenizer() -> object:
    """SmolLM2-135M-Instruct's tokenizer (the quickstart's)."""
    from transformers import AutoTokenizer

    from loop.model.aliases import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
