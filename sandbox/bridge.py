"""The host side of the `apis` bridge: a Unix-socket server that calls the environment's handler.

Inside the kernel, `apis.<app>.<api>(**kwargs)` sends one JSON line over a Unix socket in the
sandbox's channel directory; this server answers it with one JSON line. The kernel holds no app
state: it only sees results. The protocol, one request and one reply per line:

    {"id": 7, "app": "phone", "api": "login", "kwargs": {"username": "...", "password": "..."}}
    {"id": 7, "ok": true, "result": {...}}
    {"id": 7, "ok": false, "error": "You are not logged in ...", "status": 401}

Everything from the kernel is untrusted. Names must be identifiers without a leading underscore
(so no dunder reaches the handler), a request line is capped at `max_request_bytes`, arguments
must pass `sandbox.arguments.argument_problem` (64-bit integers, finite numbers, encodable
strings, bounded nesting and size; else 422), and a reply that cannot be sent within
`send_timeout_s` closes that connection. Every line gets a reply, however malformed, and nothing a
connection sends can stop the server thread: an unexpected error drops only that connection.

While `serving` is False (the sandbox clears it between cells) calls are refused with 409 and
counted in `refused`, so code left running after its cell cannot act while no cell runs. A
handler that raises `ApiError` gives the agent an error to read; any other exception is a bug in
the handler: the agent sees "internal error" and the message is kept in `errors` for the
environment to report.

One server thread per sandbox, one call at a time: a handler needs no locking against itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sandbox.arguments import argument_problem

log = logging.getLogger(__name__)

Handler = Callable[[str, str, dict[str, Any]], Any]
"""handler(app, api, kwargs) -> a JSON-compatible result; raise ApiError for API errors."""

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,63}")
MAX_REQUEST_BYTES = 1 << 20


class ApiError(Exception):
    """An error an API returns to agent code (raise it from a bridge handler)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message if status is None else f"{status}: {message}")
        self.message = message
        self.status = status


class BridgeServer:
    """Serves one sandbox's bridge socket in a daemon thread until `close()`."""

    def __init__(
        self,
        path: Path,
        handler: Handler | None = None,
        *,
        max_request_bytes: int = MAX_REQUEST_BYTES,
        send_timeout_s: float = 10.0,
    ) -> None:
        self.path = path
        self.handler = handler
        self.max_request_bytes = max_request_bytes
        self.send_timeout_s = send_timeout_s
        self.errors: list[str] = []  # handler bugs, for the environment to report
        self.calls = 0
        self.serving = True  # False: refuse calls (no cell is running)
        self.refused = 0  # calls refused while not serving
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(str(path))
        os.chmod(path, 0o666)  # the kernel runs under a uid of its own
        self._listener.listen(8)
        self._listener.setblocking(False)
        self._wake_r, self._wake_w = socket.socketpair()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._buffers: dict[socket.socket, bytearray] = {}
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"bridge:{path}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the thread, close every connection and remove the socket file (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=self.send_timeout_s + 1)
        for conn in list(self._buffers):
            self._drop(conn)
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()
        self._selector.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _serve(self) -> None:
        while not self._closed:
            for key, _ in self._selector.select(timeout=None):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._wake_r or self._closed:
                    return
                try:
                    if sock is self._listener:
                        self._accept()
                    else:
                        self._read(sock)
                except Exception:  # never let one connection end the server
                    log.exception("bridge %s: dropping a connection after an error", self.path)
                    if sock is not self._listener:
                        self._drop(sock)

    def _accept(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            conn, _ = self._listener.accept()
            conn.setblocking(False)
            self._buffers[conn] = bytearray()
            self._selector.register(conn, selectors.EVENT_READ, None)

    def _read(self, conn: socket.socket) -> None:
        try:
            chunk = conn.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        buffer = self._buffers[conn]
        buffer += chunk
        while (end := buffer.find(b"\n")) >= 0:
            line = bytes(buffer[:end])
            del buffer[: end + 1]
            if not self._send(conn, self.answer(line)):
                return
        if len(buffer) > self.max_request_bytes:
            too_big = {"id": None, "ok": False, "error": "request too large", "status": 413}
            self._send(conn, too_big)
            self._drop(conn)

    def answer(self, line: bytes) -> dict[str, Any]:
        """The reply to one request line (never raises)."""
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except (ValueError, RecursionError) as exc:  # RecursionError: brackets nested too deep
            return {"id": None, "ok": False, "error": f"malformed request: {exc}", "status": 400}
        rid, app, api, kwargs = (request.get(k) for k in ("id", "app", "api", "kwargs"))
        if not isinstance(rid, int | str) or isinstance(rid, bool) or len(str(rid)) > 64:
            rid = None  # echoed in the reply: only a short plain id comes back
        if not (isinstance(app, str) and NAME.fullmatch(app)):
            error = f"invalid app name {_quote(app)}"
            return {"id": rid, "ok": False, "error": error, "status": 400}
        if not (isinstance(api, str) and NAME.fullmatch(api)):
            error = f"invalid api name {_quote(api)}"
            return {"id": rid, "ok": False, "error": error, "status": 400}
        if not isinstance(kwargs, dict):
            return {"id": rid, "ok": False, "error": "kwargs must be an object", "status": 400}
        handler = self.handler
        if handler is None:
            return {"id": rid, "ok": False, "error": "no apps are served here", "status": 503}
        if not self.serving:
            self.refused += 1
            error = "apis calls are served only while a cell runs (this call came after its cell)"
            return {"id": rid, "ok": False, "error": error, "status": 409}
        problem = argument_problem(kwargs)
        if problem is not None:
            error = f"invalid arguments to {app}.{api}: {problem}"
            return {"id": rid, "ok": False, "error": error, "status": 422}
        self.calls += 1
        try:
            result = handler(app, api, kwargs)
        except ApiError as exc:
            return {"id": rid, "ok": False, "error": exc.message, "status": exc.status}
        except Exception as exc:
            self.errors.append(f"{app}.{api}: {type(exc).__name__}: {exc}")
            log.exception("bridge handler failed on %s.%s", app, api)
            return {
                "id": rid,
                "ok": False,
                "error": "internal error in the API server",
                "status": 500,
            }
        return {"id": rid, "ok": True, "result": result}

    def encode(self, reply: dict[str, Any]) -> bytes:
        """One reply line; a result that is not JSON is a handler bug, reported as such."""
        try:
            return json.dumps(reply, separators=(",", ":")).encode() + b"\n"
        except (TypeError, ValueError) as exc:
            self.errors.append(f"handler returned a result that is not JSON: {exc}")
            error = {"id": reply.get("id"), "ok": False, "status": 500}
            error["error"] = "internal error in the API server: result is not JSON"
            return json.dumps(error).encode() + b"\n"

    def _send(self, conn: socket.socket, reply: dict[str, Any]) -> bool:
        data = self.encode(reply)
        deadline = time.monotonic() + self.send_timeout_s
        view = memoryview(data)
        while view:
            try:
                sent = conn.send(view)
                view = view[sent:]
            except (BlockingIOError, InterruptedError):
                if time.monotonic() > deadline:
                    self._drop(conn)  # a reader that never reads only loses its connection
                    return False
                time.sleep(0.002)
            except OSError:
                self._drop(conn)
                return False
        return True

    def _drop(self, conn: socket.socket) -> None:
        self._buffers.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(conn)
        conn.close()


def _quote(value: Any) -> str:
    """A short, safe rendering of an untrusted name (no repr of a deep or huge value)."""
    if isinstance(value, str):
        return repr(value[:64]) + ("..." if len(value) > 64 else "")
    return f"of type {type(value).__name__}"
