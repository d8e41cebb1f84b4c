"""One AppWorld engine process: start it confined, talk JSON lines to it, notice when it dies.

`EngineProcess.start()` lays out the engine's directory (confine.py), launches the worker
(engine_side/worker.py) in the AppWorld venv and waits for its "ready" line; `request()` sends
one request and waits for its reply with a deadline. An engine that died, hung past its
deadline or broke the protocol is killed and reported as `EngineCrashError`, an
`EnvironmentFailureError`: the rollout is infrastructure's failure, never a quiet 0.0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandbox import Limits, probe
from tasks.appworld import confine
from tasks.core import EnvironmentFailureError

log = logging.getLogger(__name__)
MAX_REPLY_BYTES = 64 * 1024 * 1024
_launcher: ThreadPoolExecutor | None = None
_launcher_lock = threading.Lock()
_warned_missing = threading.Event()  # warn once per process, like the sandbox


class EngineCrashError(EnvironmentFailureError):
    """The engine process died, hung or broke the protocol (the rollout status is env_crash)."""


class EngineStartError(RuntimeError):
    """An engine could not be started; the message says why and quotes its log."""


class EngineRequestError(RuntimeError):
    """The engine is alive but refused a request (its reply carried the error)."""


@dataclass(frozen=True)
class EngineSpec:
    """What every engine of one suite runs with (plain data, shared by the pool)."""

    python: Path  # the AppWorld venv's interpreter
    data: Path  # the root's data/ directory
    limits: Limits = confine.ENGINE_LIMITS
    warmup_task: str | None = None  # a task to open and close once at start (pays the imports)
    start_timeout_s: float = 180.0  # cold start is 5-20 s; more on a loaded machine
    strict: bool = False  # refuse to start when an isolation layer is missing


@dataclass(eq=False)  # identity: engines are kept in sets
class EngineProcess:
    """A started engine; one rollout at a time uses it (the pool sees to that)."""

    spec: EngineSpec
    directory: confine.EngineDir
    popen: subprocess.Popen[bytes]
    start_s: float  # wall time from launch to the ready line
    tasks_started: int = 0  # worlds initialized so far (the pool recycles after N)
    crashed: str | None = None  # why it was declared dead, once it was
    _cancel: threading.Event | None = None  # checked while waiting for the ready line
    _buffer: bytearray = field(default_factory=bytearray)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, spec: EngineSpec, cancel: threading.Event | None = None) -> EngineProcess:
        """Launch a confined worker and wait until it is ready (raises EngineStartError, also
        within a second of `cancel` being set: a pool closing while engines start)."""
        caps = probe()
        missing = caps.missing()
        if missing and spec.strict:
            raise EngineStartError("isolation layers missing (strict): " + "; ".join(missing))
        if missing and not _warned_missing.is_set():
            _warned_missing.set()
            log.warning("AppWorld engines start with isolation layers missing: %s", missing)
        directory = confine.prepare(caps, spec.limits, spec.data, confine.worker_source())
        argv = confine.command(caps, spec.limits, directory, spec.python, spec.data)
        if spec.warmup_task:
            argv += ["--warmup", spec.warmup_task]
        started = time.monotonic()
        try:
            popen = _launch(argv, confine.environment(directory, spec.python), directory)
        except (OSError, RuntimeError) as exc:  # RuntimeError: the interpreter is exiting
            directory.remove()
            raise EngineStartError(f"could not launch the AppWorld engine: {exc}") from exc
        engine = cls(spec, directory, popen, 0.0, _cancel=cancel)
        try:
            ready = engine._read_reply(started + spec.start_timeout_s, "start")
        except EngineCrashError as exc:
            raise EngineStartError(f"the AppWorld engine did not start: {exc}") from None
        if not ready.get("ok"):
            engine.kill()
            raise EngineStartError(
                f"the AppWorld engine failed at start: {ready.get('error')}; {engine.log_tail()}"
            )
        engine.start_s = time.monotonic() - started
        engine._cancel = None
        return engine

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.crashed is None and self.popen.poll() is None

    def request(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one request, return its reply's fields. Raises EngineRequestError when the
        engine refused it and EngineCrashError when the engine is gone (then it is killed)."""
        with self._lock:
            op = message.get("op", "?")
            if self.crashed is not None:
                raise EngineCrashError(f"AppWorld engine pid {self.pid} {self.crashed}")
            if self.popen.poll() is not None:
                self._crash(f"{self.exit_reason()} before {op}")
            try:
                assert self.popen.stdin is not None
                data = memoryview(json.dumps(message).encode() + b"\n")
                while data:  # an unbuffered pipe may take a long line in parts
                    data = data[os.write(self.popen.stdin.fileno(), data) :]
            except OSError as exc:
                self._crash(f"could not send {op}: {exc}")
            reply = self._read_reply(time.monotonic() + timeout_s, op)
        if not reply.pop("ok", False):
            raise EngineRequestError(str(reply.get("error")) + "\n" + str(reply.get("traceback")))
        return reply

    def kill(self) -> None:
        """End the engine and everything it started; remove its directory."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.popen.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)
        for stream in (self.popen.stdin, self.popen.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        self.directory.remove()

    def exit_reason(self) -> str:
        """Why the process ended, as one phrase."""
        code = self.popen.poll()
        if code is None:
            return "still running"
        if self.directory.cgroup is not None and self.directory.cgroup.oom_killed():
            return "was killed for exceeding its memory limit"
        if code < 0 or code > 128:
            with contextlib.suppress(ValueError):
                return (
                    f"was killed by signal {signal.Signals(-code if code < 0 else code - 128).name}"
                )
        return f"exited with status {code}"

    def log_tail(self, lines: int = 6) -> str:
        """The end of the engine's own log (its stderr), for error messages."""
        with contextlib.suppress(OSError):
            text = self.directory.log.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                return "engine log: " + " | ".join(line.strip() for line in text)
        return "engine log is empty"

    def _read_reply(self, deadline: float, op: str) -> dict[str, Any]:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._crash(f"no reply to {op} in time (hung; killed)")
                if not selector.select(timeout=min(left, 1.0)):
                    if self._cancel is not None and self._cancel.is_set():
                        self._crash(f"was cancelled during {op}")
                    if self.popen.poll() is not None:
                        self._crash(f"{self.exit_reason()} during {op}")
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    self.popen.wait(timeout=10)
                    self._crash(f"{self.exit_reason()} during {op}")
                self._buffer += chunk
                if len(self._buffer) > MAX_REPLY_BYTES:
                    self._crash(f"reply to {op} exceeds {MAX_REPLY_BYTES} bytes")
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        try:
            reply = json.loads(line)
        except ValueError:
            self._crash(f"unreadable reply to {op}: {line[:200]!r}")
        if not isinstance(reply, dict):
            self._crash(f"unexpected reply to {op}: {line[:200]!r}")
        return reply

    def _crash(self, why: str) -> Any:
        """Declare the engine dead, kill it, raise EngineCrashError (never returns)."""
        tail = self.log_tail()
        self.crashed = why
        self.kill()
        raise EngineCrashError(f"AppWorld engine pid {self.pid} {why}; {tail}")


def _launch(argv: list[str], env: dict[str, str], directory: confine.EngineDir) -> Any:
    """Popen from a long-lived thread: bwrap's --die-with-parent fires when the *thread* that
    forked it exits, so a short-lived thread would take the engine down with it."""
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="appworld-launch")
    with open(directory.log, "ab") as log_file:
        launch = _launcher.submit(
            subprocess.Popen,
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
            env=env,
            cwd=str(directory.home),
            start_new_session=True,
            bufsize=0,
        )
        return launch.result()
