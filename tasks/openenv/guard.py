"""What stands between our OpenEnv server and its clients: a bearer token, idle sessions
closed, and a deadline for a request's headers.

`SessionGuard` wraps the ASGI app. With a token, every request but `GET /health` must carry
`Authorization: Bearer <token>`: an HTTP request without it is answered 401, a WebSocket is
refused before its handshake completes (the client sees 403). A WebSocket whose client sends
nothing for `idle_timeout_s` (between messages: a step's own run time does not count) is closed
with code 1001, and its session ends as on any dropped connection, giving its sandbox back.
Sessions that hold no connection (OpenEnv's `/mcp` sessions) are reaped by OpenEnv's own
reaper after the same idle time (server.py passes it as `session_timeout`).

`HeaderDeadline` is a uvicorn HTTP protocol whose connection is closed when a request's head
(request line and headers) has not arrived within `header_timeout_s` of the connection or of
the previous response: uvicorn's keep-alive timeout covers only an idle connection, so a
client dribbling its headers would hold a socket forever.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

try:  # uvicorn's "auto" choice: httptools where it is installed
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Base
except ImportError:  # pragma: no cover - h11 only
    _Base = H11Protocol  # type: ignore[assignment,misc]

OPEN_PATHS = frozenset({"/health"})  # a liveness probe needs no token
HEAD_END = b"\r\n\r\n"

Scope = dict[str, Any]
Message = dict[str, Any]


def is_loopback(host: str) -> bool:
    """Whether binding `host` serves this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: assume it reaches beyond
        return False


class SessionGuard:
    """The ASGI middleware of the module docstring: a bearer token and WebSocket idle time."""

    def __init__(self, app: Any, *, token: str | None, idle_timeout_s: float) -> None:
        self.app, self.token, self.idle_timeout_s = app, token, idle_timeout_s

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if not self._authorised(scope):
            if kind == "http":
                return await _refuse_http(send)
            await receive()  # websocket.connect
            return await send({"type": "websocket.close", "code": 1008})  # 403 to the client
        if kind == "http":
            return await self.app(scope, receive, send)
        return await self._idle_bounded(scope, receive, send)

    def _authorised(self, scope: Scope) -> bool:
        if self.token is None or scope.get("path") in OPEN_PATHS:
            return True
        wanted = f"Bearer {self.token}".encode()
        given = dict(scope.get("headers", ())).get(b"authorization", b"")
        return hmac.compare_digest(given, wanted)

    async def _idle_bounded(self, scope: Scope, receive: Any, send: Any) -> None:
        """Run a WebSocket session, closing it once its client is silent for the idle time."""
        closed = False

        async def bounded_receive() -> Message:
            nonlocal closed
            try:
                return dict(await asyncio.wait_for(receive(), self.idle_timeout_s))
            except TimeoutError:
                reason = f"idle for {self.idle_timeout_s:g} s"
                await send({"type": "websocket.close", "code": 1001, "reason": reason})
                closed = True
                return {"type": "websocket.disconnect", "code": 1001}

        async def guarded_send(message: Message) -> None:
            if not closed:  # after our close, the app's goodbyes go nowhere
                await send(message)

        await self.app(scope, bounded_receive, guarded_send)


async def _refuse_http(send: Any) -> None:
    body = json.dumps({"detail": "a bearer token is required (Authorization: Bearer ...)"})
    headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
    await send({"type": "http.response.start", "status": 401, "headers": headers})
    await send({"type": "http.response.body", "body": body.encode()})


class HeaderDeadline(_Base):
    """uvicorn's HTTP protocol with a deadline for each request's head (module docstring)."""

    header_timeout_s = 10.0  # set per server: `with_header_timeout`

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._head_tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._await_head()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is not None:  # cancelled first: an upgrade hands the socket on
            seen = self._head_tail + data
            if HEAD_END in seen:
                self._head_timer.cancel()
                self._head_timer = None
            else:
                self._head_tail = seen[-3:]
        super().data_received(data)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_head()  # the next request on this connection has the same deadline

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _await_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
        self._head_tail = b""
        self._head_timer = asyncio.get_running_loop().call_later(
            self.header_timeout_s, self._head_late
        )

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()


def with_header_timeout(header_timeout_s: float) -> type[HeaderDeadline]:
    """The protocol class to pass as uvicorn's `http=`, with this deadline."""
    return type("HeaderDeadline", (HeaderDeadline,), {"header_timeout_s": header_timeout_s})
