"""The host's end of one kernel's Jupyter channels, bounded where agent code cannot reach.

Agent code owns its kernel process: it can write around the kernel's own output cap
(`sandbox/kernel_boot.py`), leave a thread printing after its cell, or send what it likes on
the kernel's sockets. The bounds that keep host memory flat are therefore enforced here, on the
host, as bytes arrive:

- Per message: libzmq refuses a frame over `max_message_bytes` before allocating it
  (ZMQ_MAXMSGSIZE; it drops the connection, and we reconnect), and the reader drops a message
  whose frames together exceed that size or that has more frames than a Jupyter message.
- Queued: at most `QUEUE_MESSAGES` messages wait in a socket (ZMQ_RCVHWM), and the sockets
  exist only while a cell runs (`open` ... `close`). Between cells nothing is connected, so a
  thread left writing costs the host nothing and nothing piles up.
- Per episode: a `ByteBudget` shared by a sandbox's kernels counts every byte received. Once it
  is spent, iopub is no longer read and cells complete on their shell reply alone.

Dropped messages and resets are counted (`dropped`, `resets`) for the cell's output to say so.
Left open: libzmq holds every frame of one multipart message until its last frame arrives and
has no cap on how many frames that is, so code that drives its zmq socket directly with a
message of millions of frames can still grow host memory while a cell runs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
from jupyter_client.session import Session
from zmq.utils.monitor import recv_monitor_message

QUEUE_MESSAGES = 8  # per socket; the host reads as fast as a cell's messages come
MAX_FRAMES = 16  # a Jupyter message: topic, delimiter, signature, 4 JSON frames (no buffers here)
FRAME_ROOM = 64 * 1024  # header, parent header, metadata and signature of one message
RETRY_S = 0.1  # how often `handshake` asks again while the kernel has not answered
_context_lock = threading.Lock()
_context: zmq.Context[Any] | None = None


def message_limit(max_output_chars: int) -> int:
    """The most bytes one message from the kernel may take.

    The kernel sends at most about 2 x `max_output_chars` characters in one message (an error's
    message and its traceback, each capped in kernel_boot.py; other output shares one budget),
    and JSON spends at most 6 bytes on a character (the \\u escape of a control character).
    """
    return 2 * 6 * max_output_chars + FRAME_ROOM


def host_context() -> zmq.Context[Any]:
    """The zmq context (one I/O thread) of every sandbox channel in this process."""
    global _context
    with _context_lock:
        if _context is None:
            _context = zmq.Context()
        return _context


@dataclass
class ByteBudget:
    """Bytes the host still reads from one sandbox's kernels (one episode)."""

    limit: int
    used: int = 0

    @property
    def spent(self) -> bool:
        """Whether the episode's kernels have sent all the host will read."""
        return self.used >= self.limit


@dataclass(frozen=True)
class Message:
    """One well-formed message from the kernel, as much of it as the host uses."""

    channel: str  # "shell" or "iopub"
    msg_type: str
    parent_id: str | None  # the msg_id of the request it answers
    content: dict[str, Any]


@dataclass
class KernelChannels:
    """The shell and iopub sockets to one kernel, connected only while a cell runs."""

    urls: dict[str, str]  # channel name -> zmq address ("shell", "iopub", "control")
    session: Session
    max_message_bytes: int
    budget: ByteBudget
    dropped: int = 0  # messages over the size or frame limits, or malformed
    resets: int = 0  # connections libzmq dropped for a frame over the limit
    _sockets: dict[str, zmq.Socket[Any]] = field(default_factory=dict)
    _monitors: dict[str, zmq.Socket[Any]] = field(default_factory=dict)

    @property
    def reading_output(self) -> bool:
        """Whether iopub is connected (not once the episode's byte budget is spent)."""
        return "iopub" in self._sockets

    def open(self) -> None:
        """Connect shell, and iopub unless the budget is spent; `handshake` before trusting it."""
        self.close()
        self._connect("shell")
        if not self.budget.spent:
            self._connect("iopub")

    def close(self) -> None:
        """Disconnect; what libzmq queued for us is dropped with the sockets (LINGER 0)."""
        for name in list(self._sockets):
            self._disconnect(name)

    def handshake(self, deadline: float, alive: Callable[[], bool], *, reply: bool) -> str:
        """Wait until iopub is subscribed and, with `reply`, the kernel answers on shell:
        "ready", "timeout" or "dead".

        A SUB socket misses what is published before its subscription arrives, so a cell waits
        for a first iopub message: the kernel's welcome to a new subscriber (ipykernel 7), or
        the busy status of a kernel_info request, sent again every RETRY_S until one comes.
        """
        replied, subscribed = not reply, not self.reading_output
        while not (replied and subscribed):
            request = self.send("kernel_info_request", {})
            retry_at = min(deadline, time.monotonic() + RETRY_S)
            while not (replied and subscribed) and time.monotonic() < retry_at:
                message = self.receive(retry_at - time.monotonic())
                if message is not None:
                    replied |= message.channel == "shell" and message.parent_id == request
                    subscribed |= message.channel == "iopub"
            if replied and subscribed:
                break
            if not alive():
                return "dead"
            if time.monotonic() >= deadline:
                return "timeout"
        return "ready"

    def send(self, msg_type: str, content: dict[str, Any]) -> str:
        """Send a request on shell; returns its msg_id."""
        message = self.session.msg(msg_type, content)
        self.session.send(self._sockets["shell"], message)
        return str(message["header"]["msg_id"])

    def execute(self, code: str) -> str:
        """Send one cell; returns the request's msg_id."""
        content = {"code": code, "silent": False, "store_history": True}
        content |= {"user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
        return self.send("execute_request", content)

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running cell (control channel).

        A socket for this one request: its reply is never read, so none is left to fill up.
        """
        socket = host_context().socket(zmq.DEALER)
        socket.linger = 1000  # long enough to deliver the request after close()
        socket.connect(self.urls["control"])
        self.session.send(socket, self.session.msg("interrupt_request", {}))
        socket.close()

    def receive(self, timeout: float) -> Message | None:
        """The next well-formed message within `timeout` seconds, shell first, else None."""
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            poller = zmq.Poller()
            for socket in (*self._sockets.values(), *self._monitors.values()):
                poller.register(socket, zmq.POLLIN)
            ready = dict(poller.poll(int(left * 1000)))
            for name, monitor in list(self._monitors.items()):
                if monitor in ready and self._disconnected(monitor):
                    self.resets += 1  # a frame over ZMQ_MAXMSGSIZE (or the kernel is gone)
                    self._disconnect(name)
                    self._connect(name)
            for name in ("shell", "iopub"):
                readable = self._sockets.get(name)
                if readable is not None and readable in ready:
                    message = self._read(name, readable)
                    if message is not None:
                        return message
            if left == 0:
                return None

    # -- internals --------------------------------------------------------------------------

    def _connect(self, name: str) -> None:
        socket = host_context().socket(zmq.SUB if name == "iopub" else zmq.DEALER)
        socket.setsockopt(zmq.MAXMSGSIZE, self.max_message_bytes)
        socket.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)
        socket.linger = 0
        if name == "iopub":
            socket.setsockopt(zmq.SUBSCRIBE, b"")
        self._monitors[name] = socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        socket.connect(self.urls[name])
        self._sockets[name] = socket

    def _disconnect(self, name: str) -> None:
        socket, monitor = self._sockets.pop(name), self._monitors.pop(name)
        with contextlib.suppress(zmq.ZMQError):
            socket.disable_monitor()
        monitor.close(linger=0)
        socket.close(linger=0)

    @staticmethod
    def _disconnected(monitor: zmq.Socket[Any]) -> bool:
        seen = False
        while monitor.poll(0):
            seen |= recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
        return seen

    def _read(self, name: str, socket: zmq.Socket[Any]) -> Message | None:
        """Take one whole message off `socket`, within the limits; None if it was dropped."""
        frames: list[bytes] = []
        size = count = 0
        more = True
        while more:  # libzmq hands over a message only once all its frames are in
            frame = socket.recv(zmq.NOBLOCK, copy=False)
            size, count, more = size + len(frame), count + 1, frame.more
            if count > MAX_FRAMES:  # not a Jupyter message: drop it and what else is queued
                self._disconnect(name)
                self._connect(name)
                break
            if size <= self.max_message_bytes:
                frames.append(frame.bytes)
        self.budget.used += size
        if self.budget.spent and self.reading_output:
            self._disconnect("iopub")
        if size > self.max_message_bytes or count > MAX_FRAMES:
            self.dropped += 1
            return None
        try:
            _, parts = self.session.feed_identities(frames, copy=True)
            raw = self.session.deserialize(parts, content=True, copy=True)
            parent = raw["parent_header"]
            content = raw["content"]
            parent_id = parent.get("msg_id") if isinstance(parent, dict) else None
            return Message(
                name,
                str(raw["msg_type"]),
                parent_id if isinstance(parent_id, str) else None,
                content if isinstance(content, dict) else {},
            )
        except Exception:  # anything the kernel sends is untrusted: a bad message is dropped
            self.dropped += 1
            return None
