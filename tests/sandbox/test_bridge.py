"""The bridge server on its own, over a real Unix socket (no kernel).

Run: python -m pytest tests/sandbox/test_bridge.py
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.bridge import ApiError, BridgeServer


def handler(app: str, api: str, kwargs: dict[str, Any]) -> Any:
    if api == "add":
        return kwargs["a"] + kwargs["b"]
    if api == "deny":
        raise ApiError("You are not logged in.", status=401)
    if api == "object":
        return object()
    raise ZeroDivisionError("handler bug")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[BridgeServer]:
    bridge = BridgeServer(tmp_path / "bridge.sock", handler, max_request_bytes=1000)
    yield bridge
    bridge.close()


def ask(server: BridgeServer, *lines: bytes) -> list[dict[str, Any]]:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        reader = sock.makefile("rb")
        replies = []
        for line in lines:
            sock.sendall(line + b"\n")
            replies.append(json.loads(reader.readline()))
        return replies


def request(app: str, api: str, **kwargs: Any) -> bytes:
    return json.dumps({"id": 1, "app": app, "api": api, "kwargs": kwargs}).encode()


def test_a_call_returns_the_handler_result(server: BridgeServer) -> None:
    assert ask(server, request("calc", "add", a=2, b=3)) == [{"id": 1, "ok": True, "result": 5}]
    assert server.calls == 1


def test_api_error_carries_message_and_status(server: BridgeServer) -> None:
    [reply] = ask(server, request("phone", "deny"))
    assert reply == {"id": 1, "ok": False, "error": "You are not logged in.", "status": 401}
    assert str(ApiError("nope", 404)) == "404: nope" and str(ApiError("nope")) == "nope"


def test_handler_bugs_are_recorded_not_raised(server: BridgeServer) -> None:
    [bug, not_json] = ask(server, request("x", "boom"), request("x", "object"))
    assert bug["status"] == 500 and "internal error" in bug["error"]
    assert not_json["status"] == 500
    assert server.errors[0] == "x.boom: ZeroDivisionError: handler bug"
    assert "not JSON" in server.errors[1]


@pytest.mark.parametrize(
    "line",
    [
        b"{broken",
        b"[]",
        json.dumps({"id": 1, "app": "_x", "api": "a", "kwargs": {}}).encode(),
        json.dumps({"id": 1, "app": "a", "api": "__init__", "kwargs": {}}).encode(),
        json.dumps({"id": 1, "app": "a.b", "api": "c", "kwargs": {}}).encode(),
        json.dumps({"id": 1, "app": "a", "api": "b", "kwargs": "x"}).encode(),
    ],
)
def test_malformed_requests_get_400_and_never_reach_the_handler(
    server: BridgeServer, line: bytes
) -> None:
    [reply] = ask(server, line)
    assert reply["ok"] is False and reply["status"] == 400
    assert server.calls == 0


def test_oversized_request_is_refused_and_the_server_keeps_serving(server: BridgeServer) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        sock.sendall(b"x" * 5000)  # no newline, past the 1000-byte limit
        reply = json.loads(sock.makefile("rb").readline())
    assert reply["status"] == 413
    assert ask(server, request("calc", "add", a=1, b=1))[0]["result"] == 2


def test_no_handler_means_no_apps(tmp_path: Path) -> None:
    bridge = BridgeServer(tmp_path / "b.sock")
    try:
        [reply] = ask(bridge, request("a", "b"))
        assert reply["status"] == 503
    finally:
        bridge.close()


def test_close_is_idempotent_and_removes_the_socket(tmp_path: Path) -> None:
    bridge = BridgeServer(tmp_path / "b.sock", handler)
    bridge.close()
    bridge.close()
    assert not (tmp_path / "b.sock").exists()


@pytest.mark.parametrize(
    "kwargs",
    [
        '{"song_id": 1180591620717411303424}',  # 2**70, past SQLite's int64
        '{"amount": NaN}',
        '{"amount": -Infinity}',
        '{"query": "\\ud800"}',  # a lone surrogate cannot be encoded as UTF-8
        '{"extra": ' + "[" * 600 + "]" * 600 + "}",
        '{"ids": [' + ",".join(["1"] * 10_001) + "]}",
    ],
    ids=["int-2**70", "nan", "-inf", "lone-surrogate", "600-deep", "10001-items"],
)
def test_extreme_arguments_get_422_and_never_reach_the_handler(tmp_path: Path, kwargs: str) -> None:
    bridge = BridgeServer(tmp_path / "b.sock", handler)  # the default 1 MB request limit
    try:
        line = ('{"id": 1, "app": "calc", "api": "add", "kwargs": ' + kwargs + "}").encode()
        [reply] = ask(bridge, line)
        assert reply["status"] == 422 and "invalid arguments to calc.add" in reply["error"]
        assert bridge.calls == 0
    finally:
        bridge.close()


def test_deeply_nested_line_gets_an_error_and_the_bridge_keeps_serving(
    tmp_path: Path,
) -> None:
    bridge = BridgeServer(tmp_path / "b.sock", handler)
    try:
        [reply] = ask(bridge, b"[" * 100_000)
        assert reply["status"] == 400 and "malformed" in reply["error"]
        [reply] = ask(bridge, b'{"id": ' + b"[" * 900 + b"]" * 900 + b', "app": "x"}')
        assert reply["status"] == 400 and reply["id"] is None
        assert ask(bridge, request("calc", "add", a=1, b=1))[0]["result"] == 2
    finally:
        bridge.close()


def test_a_connection_error_never_stops_the_server(
    server: BridgeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(line: bytes) -> dict[str, Any]:
        raise MemoryError("a reply could not be built")

    monkeypatch.setattr(server, "answer", broken)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(server.path))
        sock.sendall(request("calc", "add", a=1, b=1) + b"\n")
        assert sock.makefile("rb").readline() == b""  # only this connection is dropped
    monkeypatch.undo()
    assert ask(server, request("calc", "add", a=2, b=2))[0]["result"] == 4


def test_calls_are_refused_and_counted_while_not_serving(server: BridgeServer) -> None:
    server.serving = False
    [reply] = ask(server, request("calc", "add", a=1, b=1))
    assert reply["status"] == 409 and "only while a cell runs" in reply["error"]
    assert (server.calls, server.refused) == (0, 1)
    server.serving = True
    assert ask(server, request("calc", "add", a=1, b=1))[0]["result"] == 2
