"""`Sandbox`: one persistent, isolated IPython kernel that runs agent code cell by cell.

    with Sandbox(handler=my_handler, timeout_s=30) as sb:
        sb.execute("x = 41")
        result = sb.execute("x + 1")           # result.output == "42\n"

State persists across cells as in a notebook. The bridge serves `apis` calls only while a cell
runs: a thread the agent left running cannot act between cells, and the next cell's output says
how many of its calls were refused. The kernel's channels, too, are connected only while a cell
runs (`sandbox/channel.py`): what a thread prints between cells is never received. A cell ends
when the kernel goes idle, or shortly after its reply when the idle status was lost (a channel
reset by an oversized message). A cell past its time limit is interrupted; if it
does not stop within `interrupt_grace_s` the kernel is killed and replaced (state lost, said in
the output). A kernel that dies is reported as `crashed=True` and replaced on the next call.
Neither raises: the caller reads the result and decides whether the episode goes on.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import secrets
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sandbox import scratch
from sandbox.bridge import MAX_REQUEST_BYTES, BridgeServer, Handler
from sandbox.cgroups import Cgroup
from sandbox.channel import ByteBudget
from sandbox.isolation import CGROUP_NAMESPACE, probe
from sandbox.limits import Limits
from sandbox.output import OutputCollector, budget_notice, loss_notes
from sandbox.process import (
    KernelProcess,
    allocate_uid,
    bridge_socket,
    next_sandbox_number,
    remove_directory,
)
from sandbox.reaper import reap_stale, write_owner

log = logging.getLogger(__name__)
POLL_S = 0.05  # how often a waiting cell checks that the kernel is still alive
# How long a cell whose reply has come waits, without a message of the cell, for the idle
# status that follows the reply (the kernel sends both within milliseconds; the status is lost
# only when iopub was reset).
REPLY_GRACE_S = 1.0
_warned = False
_executor_lock = threading.Lock()
_executor: ThreadPoolExecutor | None = None
_live: weakref.WeakSet[Sandbox] = weakref.WeakSet()  # closed at interpreter exit if still open


class SandboxIsolationError(RuntimeError):
    """`strict=True` was asked for and this machine lacks an isolation layer."""


@dataclass(frozen=True)
class ExecutionResult:
    """What one cell did, as the agent and the trainer see it."""

    output: str
    """What a notebook shows: streams, displays, the trailing repr, a traceback, our notices."""
    error: str | None
    """"ExceptionType: message" of an uncaught exception, a timeout or a crash; else None."""
    timed_out: bool
    crashed: bool
    duration_s: float


def default_root() -> Path:
    """Where sandbox directories go unless told otherwise."""
    return Path(tempfile.gettempdir()) / f"loop-sandbox-{os.geteuid()}"


class Sandbox:
    """One isolated kernel with the `apis` bridge; see the module docstring."""

    def __init__(
        self,
        handler: Handler | None = None,
        *,
        timeout_s: float = 30.0,
        max_output_chars: int = 20_000,
        limits: Limits | None = None,
        interrupt_grace_s: float = 3.0,
        startup_timeout_s: float = 60.0,
        strict: bool = False,
        root_dir: Path | str | None = None,
    ) -> None:
        if timeout_s <= 0 or max_output_chars <= 0:
            raise ValueError(
                f"timeout_s and max_output_chars must be > 0, got {timeout_s}, {max_output_chars}"
            )
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.limits = limits or Limits()
        self.interrupt_grace_s = interrupt_grace_s
        self.startup_timeout_s = startup_timeout_s
        self.caps = probe()
        _check_isolation(self.caps.missing(), strict)
        root = Path(root_dir) if root_dir is not None else default_root()
        reap_stale(root)
        self.number = next_sandbox_number()
        # pid + number is unique in this pid namespace; the suffix keeps other namespaces
        # sharing the same root (containers) from colliding with us.
        self.directory = root / f"{os.getpid()}-{self.number}-{secrets.token_hex(3)}"
        self.directory.mkdir(parents=True, exist_ok=False)
        self.directory.chmod(0o711)
        self.uid = allocate_uid(self.number) if self.caps.separate_uid else None
        self.cgroup: Cgroup | None = None
        self.restarts = 0
        # The host reads this much from the kernels of this sandbox (one episode), all told.
        self.output_budget = ByteBudget(self.limits.output_mb * 1024 * 1024)
        self._bridge: BridgeServer | None = None
        self._lock = threading.Lock()
        self._closed = False
        self._lost_state_note: str | None = None
        try:
            if self.caps.scratch:
                limits = self.limits
                scratch.mount(self.directory, size_mb=limits.disk_mb, max_files=limits.max_files)
            if self.caps.cgroups is not None:
                self.cgroup = self.caps.cgroups.create(
                    self.directory.name,
                    max_processes=self.limits.max_processes,
                    memory_mb=self.limits.memory_mb,
                    cpus=self.limits.cpus,
                )
            write_owner(self.directory, self.cgroup)
            # One bridge for the sandbox's life: API calls and handler bugs recorded before a
            # kernel restart must still count after it.
            self._bridge = BridgeServer(
                bridge_socket(self.directory), handler, max_request_bytes=MAX_REQUEST_BYTES
            )
            self._bridge.serving = False  # only while a cell runs
            self._refused_reported = 0
            self._kernel = self._start_kernel()
        except BaseException:
            self._teardown()
            raise
        _live.add(self)

    # -- public API -------------------------------------------------------------------------

    @property
    def handler_errors(self) -> list[str]:
        """Exceptions the bridge handler raised that were not ApiError (handler bugs)."""
        assert self._bridge is not None
        return self._bridge.errors

    @property
    def api_calls(self) -> int:
        """How many `apis` requests reached the handler in this sandbox, restarts included."""
        assert self._bridge is not None
        return self._bridge.calls

    def set_handler(self, handler: Handler | None) -> None:
        """Attach (or replace) the bridge handler that answers `apis` calls."""
        assert self._bridge is not None
        self._bridge.handler = handler

    def alive(self) -> bool:
        """Whether the kernel runs now (a dead one is replaced on the next `execute`)."""
        return not self._closed and self._kernel.alive()

    def execute(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """Run one cell; never raises for anything the code does."""
        if self._closed:
            raise RuntimeError("execute() on a closed Sandbox")
        with self._lock:
            assert self._bridge is not None
            try:
                return self._execute(code, self.timeout_s if timeout is None else timeout)
            finally:
                self._bridge.serving = False

    async def execute_async(self, code: str, timeout: float | None = None) -> ExecutionResult:
        """`execute` without blocking the event loop (runs on the sandbox I/O threads)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_io_executor(), self.execute, code, timeout)

    def close(self) -> None:
        """Kill the kernel and everything it started, delete its files (idempotent)."""
        if self._closed:
            return
        self._closed = True
        with self._lock:
            self._teardown()
        _live.discard(self)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("alive" if self.alive() else "dead")
        return f"<Sandbox {self.directory.name} {state} restarts={self.restarts}>"

    # -- internals --------------------------------------------------------------------------

    def _start_kernel(self) -> KernelProcess:
        return KernelProcess.start(
            self.directory,
            caps=self.caps,
            limits=self.limits,
            uid=self.uid,
            cgroup=self.cgroup,
            startup_timeout_s=self.startup_timeout_s,
            budget=self.output_budget,
            max_output_chars=self.max_output_chars,
        )

    def _replace_kernel(self, reason: str) -> None:
        self._kernel.kill()
        self.restarts += 1
        log.info("sandbox %s: replacing its kernel (%s)", self.directory.name, reason)
        self._kernel = self._start_kernel()

    def _execute(self, code: str, timeout: float) -> ExecutionResult:
        start = time.monotonic()
        out = OutputCollector(self.max_output_chars)
        self._prepare(out)
        deadline = time.monotonic() + timeout  # a kernel restarted just now is not the cell's
        assert self._bridge is not None
        self._bridge.serving = True
        kernel = self._kernel
        channels = kernel.channels
        dropped, resets, budget_spent = channels.dropped, channels.resets, self.output_budget.spent
        msg_id: str | None = None  # set once the cell is sent
        channels.open()
        try:
            state = channels.handshake(deadline, kernel.alive, reply=False)
            if state == "ready":
                msg_id = channels.execute(code)
                state = _collect(kernel, msg_id, out, deadline=deadline)
            timed_out = state == "timeout"
            if timed_out:
                state = self._stop_overrun(kernel, msg_id, out, timeout)
                # Ours, not the KeyboardInterrupt the interrupt raised in the cell:
                out.error = f"TimeoutError: cell exceeded its {timeout:g} s limit"
        finally:
            channels.close()
        crashed = state == "dead"
        if crashed:  # during the cell or while being interrupted; replaced next call
            reason = kernel.exit_reason()
            out.error = f"KernelDied: the kernel {reason}"
            out.note(f"the kernel {reason}; a new kernel will run the next cell")
            self._lost_state_note = "this cell ran in a new kernel: earlier variables are gone"
        else:  # a dead kernel's channels drop too: not news
            lost = channels.dropped - dropped, channels.resets - resets
            for note in loss_notes(*lost, message_limit=channels.max_message_bytes):
                out.note(note)
        if budget_spent or self.output_budget.spent:
            out.note(budget_notice(self.limits.output_mb))
        return ExecutionResult(out.text(), out.error, timed_out, crashed, time.monotonic() - start)

    def _prepare(self, out: OutputCollector) -> None:
        """Before a cell: replace a kernel that died between cells, and say what happened
        meanwhile (lost state, refused `apis` calls)."""
        if not self._kernel.alive():
            reason = self._kernel.exit_reason()
            self._replace_kernel(f"it had died: {reason}")
            self._lost_state_note = self._lost_state_note or (
                f"the previous kernel {reason}; this cell ran in a new kernel: earlier "
                "variables are gone"
            )
        if self._lost_state_note:
            out.note(self._lost_state_note)
            self._lost_state_note = None
        assert self._bridge is not None
        refused, self._refused_reported = (
            self._bridge.refused - self._refused_reported,
            self._bridge.refused,
        )
        if refused:
            out.note(
                f"{refused} apis call(s) made while no cell was running were refused "
                "(code left running after its cell cannot call apis)"
            )

    def _stop_overrun(
        self, kernel: KernelProcess, msg_id: str | None, out: OutputCollector, timeout: float
    ) -> str:
        """Interrupt a cell past its time limit: "idle" when it stopped, "dead", or "timeout"
        when it did not stop within `interrupt_grace_s` (or never answered): then replaced."""
        if msg_id is None:  # it never answered, so never took the cell
            self._replace_kernel("it did not answer")
            out.note(
                f"the kernel did not answer within the cell's {timeout:g} s time limit: it was "
                "restarted and all variables are lost"
            )
            return "timeout"
        kernel.interrupt()
        state = _collect(kernel, msg_id, out, deadline=time.monotonic() + self.interrupt_grace_s)
        if state == "idle":
            out.note(f"cell interrupted: it exceeded its {timeout:g} s time limit")
        elif state == "timeout":  # it ignored the interrupt
            self._replace_kernel("it ignored an interrupt")
            out.note(
                f"cell exceeded its {timeout:g} s time limit and did not stop when "
                "interrupted: the kernel was restarted and all variables are lost"
            )
        return state

    def _teardown(self) -> None:
        kernel = getattr(self, "_kernel", None)
        if kernel is not None:
            kernel.kill()
        if self._bridge is not None:
            self._bridge.close()
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_directory(self.directory)


def _collect(kernel: KernelProcess, msg_id: str, out: OutputCollector, deadline: float) -> str:
    """Read the cell's messages until it is "idle", "timeout" or "dead".

    Idle is the kernel's idle status for the cell or, when that was lost to an iopub reset (or
    iopub is no longer read), its reply followed by REPLY_GRACE_S without a message of the cell.
    """
    channels = kernel.channels
    replied = False
    last_seen = time.monotonic()  # when the cell's latest message came
    while True:
        now = time.monotonic()
        if now >= deadline:
            return "timeout"
        message = channels.receive(min(POLL_S, deadline - now))
        if message is None or message.parent_id != msg_id:  # none, or an earlier cell's
            if message is None and not kernel.alive():
                return "dead"
            quiet = time.monotonic() - last_seen > REPLY_GRACE_S
            if replied and (quiet or not channels.reading_output):
                return "idle"
            continue
        last_seen = time.monotonic()
        if message.channel == "shell":
            if message.msg_type == "execute_reply":
                replied = True
                out.add_reply(message.content)
                if not channels.reading_output:
                    return "idle"
        elif message.msg_type == "status" and message.content.get("execution_state") == "idle":
            return "idle"
        else:
            out.add(message.msg_type, message.content)


def _check_isolation(missing: list[str], strict: bool) -> None:
    global _warned
    if not missing:
        return
    if strict:
        raise SandboxIsolationError("sandbox isolation incomplete: " + "; ".join(missing))
    if not _warned:
        _warned = True
        for gap in missing:
            log.warning("SANDBOX ISOLATION DEGRADED: %s", gap)


def _io_executor() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=512, thread_name_prefix="sandbox-io")
        return _executor


def isolation_report() -> dict[str, Any]:
    """What this machine isolates, for logs and benchmarks."""
    caps = probe()
    return {
        "bwrap": caps.bwrap is not None,
        "cgroups": None if caps.cgroups is None else f"v{caps.cgroups.version}",
        "separate_uid": caps.separate_uid,
        "rlimits": caps.prlimit is not None,
        "missing": caps.missing(),
        "cgroup_namespace": CGROUP_NAMESPACE,
    }


@atexit.register
def close_all() -> None:
    """Close every sandbox of this process that is still open (a killed host cannot: the next
    one reaps its directories, sandbox/reaper.py)."""
    for sandbox in list(_live):
        with contextlib.suppress(Exception):
            sandbox.close()
