"""The export side's guards: idle sessions end, headers have a deadline, a token is required
where one is set, and binding beyond the loopback without one is refused.

Each against our real app (tasks/openenv/server.py) under uvicorn, with short timeouts: an idle
WebSocket session is closed and its sandbox goes back; sessions created over `/mcp` (which hold
no connection) are reaped and free their capacity; a client dribbling its headers loses its
socket; requests without the bearer token are refused, over HTTP and WebSocket, and our import
side sends it when configured.

Run: python -m pytest tests/tasks/openenv/test_guard.py     (slow: real kernels, ~40 s)
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from tasks.apptown import AppTownSuite
from tasks.openenv import __main__ as cli
from tasks.openenv.env import WireSpec
from tasks.openenv.suite import OpenEnvSuite
from tests.tasks.openenv.conftest import served

pytestmark = pytest.mark.slow
TASK = "music_count_library_genre_1"


def test_an_idle_websocket_session_is_closed_and_gives_its_sandbox_back(
    apptown: AppTownSuite,
) -> None:
    with served(apptown, "dev", pool_size=1, idle_timeout_s=1.0) as server:

        async def go() -> None:
            env = GenericEnvClient(base_url=server.url)
            await env.reset(task_id=TASK)
            assert server.leased() == 1
            await asyncio.sleep(2.5)  # silent past the idle timeout
            assert server.leased() == 0
            with pytest.raises((ConnectionError, RuntimeError, OSError)):
                await env.step({"code": "print(1)"})
            await env.close()

        asyncio.run(go())
        server.wait_until_none_leased()


def _mcp(url: str, method: str, **params: Any) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return dict(httpx.post(f"{url}/mcp", json=body, timeout=10).json())


def test_sessions_made_over_mcp_are_reaped_once_idle(apptown: AppTownSuite) -> None:
    timeouts = {"idle_timeout_s": 1.0, "acquire_timeout_s": 0.5, "longest_step_s": 0.5}
    with served(apptown, "dev", pool_size=1, max_sessions=2, **timeouts) as server:
        for _ in range(2):
            assert "session_id" in _mcp(server.url, "openenv/session/create")["result"]
        assert "error" in _mcp(server.url, "openenv/session/create")  # the server is full
        deadline = time.monotonic() + 20  # reaped after 2 s idle; OpenEnv looks every 5 s
        while "error" in (answer := _mcp(server.url, "openenv/session/create")):
            assert time.monotonic() < deadline, answer
            time.sleep(0.5)


def test_a_client_dribbling_its_headers_loses_the_socket(apptown: AppTownSuite) -> None:
    with served(apptown, "dev", pool_size=1, header_timeout_s=1.0) as server:
        port = int(server.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
            slow.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
            started = time.monotonic()
            assert slow.recv(1024) == b""  # closed by the server
            assert time.monotonic() - started < 5
        assert httpx.get(f"{server.url}/health").status_code == 200  # others are served


def test_a_token_is_required_where_set_and_the_import_side_sends_it(
    apptown: AppTownSuite,
) -> None:
    with served(apptown, "dev", pool_size=1, token="s3cret") as server:
        assert httpx.get(f"{server.url}/health").status_code == 200  # a liveness probe
        assert httpx.get(f"{server.url}/schema").status_code == 401
        bearer = {"Authorization": "Bearer s3cret"}
        assert httpx.get(f"{server.url}/schema", headers=bearer).status_code == 200
        wrong = {"Authorization": "Bearer guess"}
        assert httpx.get(f"{server.url}/loop/status", headers=wrong).status_code == 401

        async def go() -> None:
            with pytest.raises(ConnectionError):
                await GenericEnvClient(base_url=server.url).reset(task_id=TASK)
            async with GenericEnvClient(base_url=server.url, headers=bearer) as env:
                assert not (await env.reset(task_id=TASK)).done

        asyncio.run(go())
        with pytest.raises(Exception, match="401"):
            OpenEnvSuite(server.url)
        remote = OpenEnvSuite(server.url, spec=WireSpec(server.url, token="s3cret"))

        async def episode() -> None:
            env = remote.make_env(remote.task(TASK))
            assert await env.areset()  # the task context
            await env.aclose()

        asyncio.run(episode())
        server.wait_until_none_leased()


def test_binding_beyond_the_loopback_without_a_token_is_refused(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(cli.TOKEN_ENV, raising=False)
    assert cli.main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--host 0.0.0.0" in err and "--token" in err
