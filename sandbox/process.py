"""One confined kernel process: its directories, uid, cgroup and Jupyter channels.

`KernelProcess.start()` lays out the sandbox directory, launches ipykernel through
jupyter_client with the isolation chain of `sandbox/isolation.py`, and waits until the kernel
answers. The host talks to it through `KernelChannels` (`sandbox/channel.py`), never through a
jupyter_client client, whose sockets would queue whatever the kernel sends. `kill()` ends the
kernel and every process it started. `Sandbox` (`sandbox/kernel.py`) drives it and owns the
bridge server, which outlives kernel restarts; nothing here knows about cells or results.

On disk, per sandbox (under the sandbox root, `<host pid>-<n>/`, a size-capped tmpfs where
this host may mount one: sandbox/scratch.py):

    owner.json   the host process that owns it (a later run reaps it if that process is gone)
    home/        the agent's scratch directory: HOME and working directory, owned by its uid
    chan/        connection file, zmq ipc sockets, bridge socket, boot code (kernel-visible)
    etc/         passwd, group, hosts as the kernel sees them (read-only inside)
    spec/        the kernelspec jupyter_client launches from (host-only)
    kernel.log   the kernel's own stdout/stderr (start-up errors end up here)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from jupyter_client import KernelManager
from jupyter_client.kernelspec import KernelSpecManager

from sandbox import scratch
from sandbox.bridge import MAX_REQUEST_BYTES
from sandbox.cgroups import Cgroup
from sandbox.channel import ByteBudget, KernelChannels, host_context, message_limit
from sandbox.isolation import Capabilities, LaunchPlan, kernel_command, kernel_env, write_etc
from sandbox.limits import Limits

T = TypeVar("T")
KERNEL_NAME = "loop-sandbox"
CHANNELS = ("shell", "iopub", "control")  # the host never connects stdin or heartbeat
UID_BASE = 100_000  # kernels' uids: UID_BASE + (host pid % 1024) * 1024 + n % 1024
BOOT_SOURCE = Path(__file__).with_name("kernel_boot.py")
_counter = itertools.count(1)
_counter_lock = threading.Lock()
_launcher_pool: ThreadPoolExecutor | None = None
_lifeline: tuple[int, int, int] | None = None  # (host pid, read end, write end)


class SandboxStartError(RuntimeError):
    """A kernel could not be started; the message says why and quotes its log."""


def next_sandbox_number() -> int:
    """A number unique among this process's sandboxes (names directories, cgroups, uids)."""
    with _counter_lock:
        return next(_counter)


@dataclass
class KernelProcess:
    """A started kernel and what it needs; `alive()`, `interrupt()`, `kill()`."""

    directory: Path
    uid: int | None
    cgroup: Cgroup | None
    manager: KernelManager
    channels: KernelChannels
    popen: subprocess.Popen[Any]
    log_path: Path
    exit_notes: list[str] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        directory: Path,
        *,
        caps: Capabilities,
        limits: Limits,
        uid: int | None,
        cgroup: Cgroup | None,
        startup_timeout_s: float,
        budget: ByteBudget,
        max_output_chars: int = 20_000,
    ) -> KernelProcess:
        """Launch a kernel in `directory` (its home/ is kept across restarts); it sends the host
        at most `max_output_chars` characters of output per cell, and the host reads from it
        what `budget` (the episode's, shared across restarts) has left."""
        plan = _lay_out(directory, uid, cgroup, max_output_chars)
        manager = _manager(plan, kernel_command(caps, limits, plan))
        log_path = directory / "kernel.log"
        try:
            manager.write_connection_file()  # picks the ipc socket names
            if uid is not None:
                os.chown(manager.connection_file, uid, uid)
            with open(log_path, "ab") as log:
                launch = functools.partial(
                    manager.start_kernel,
                    env=kernel_env(plan),
                    cwd=str(plan.home_dir),
                    stdout=log,
                    stderr=log,
                    stdin=subprocess.DEVNULL,
                    pass_fds=(host_lifeline(),),
                )
                _launcher().submit(closing_its_loop, launch).result()
            # jupyter_client keeps a control socket for shutdown requests, which we never send
            # (kill is a signal; interrupts go through KernelChannels): open, it would queue
            # whatever the kernel sent it.
            manager._close_control_socket()
            popen = manager.provisioner.process  # type: ignore[union-attr]
        except Exception as exc:
            _kill_tree(None, cgroup)
            raise SandboxStartError(f"could not launch the kernel: {exc}") from exc
        channels = KernelChannels(
            _urls(manager), manager.session, message_limit(max_output_chars), budget
        )
        process = cls(directory, uid, cgroup, manager, channels, popen, log_path)
        channels.open()
        try:
            deadline = time.monotonic() + startup_timeout_s
            state = channels.handshake(deadline, process.alive, reply=True)
        except BaseException:
            process.kill()
            raise
        finally:
            channels.close()
        if state != "ready":
            process.kill()
            why = "died" if state == "dead" else f"did not answer within {startup_timeout_s:g} s"
            raise SandboxStartError(f"kernel {why}; {process.log_tail()}")
        return process

    def alive(self) -> bool:
        """Whether the kernel process still runs."""
        return self.popen.poll() is None

    def interrupt(self) -> None:
        """Ask the kernel to raise KeyboardInterrupt in the running cell (control channel)."""
        with contextlib.suppress(Exception):
            self.channels.interrupt()

    def kill(self) -> None:
        """End the kernel and everything it started; close its channels."""
        self.channels.close()
        _kill_tree(self.popen, self.cgroup)
        with contextlib.suppress(Exception):
            closing_its_loop(self.manager.cleanup_resources)

    def exit_reason(self) -> str:
        """Why the kernel process ended, as one phrase."""
        code = self.popen.poll()
        if code is None:
            return "still running"
        if self.cgroup is not None and self.cgroup.oom_killed():
            return "was killed for exceeding its memory limit"
        if code < 0 or code > 128:
            number = -code if code < 0 else code - 128
            with contextlib.suppress(ValueError):
                return f"was killed by signal {signal.Signals(number).name}"
        return f"exited with status {code}"

    def log_tail(self, lines: int = 8) -> str:
        """The end of the kernel's own log, for error messages."""
        with contextlib.suppress(OSError):
            text = self.log_path.read_text(errors="replace").strip().splitlines()[-lines:]
            if text:
                return "kernel log: " + " | ".join(text)
        return "kernel log is empty"


def closing_its_loop(call: Callable[[], T]) -> T:
    """`call()`, a jupyter_client method that runs its coroutine on an event loop it makes for
    the calling thread and never closes, then that loop closed. Left open, the loops were
    finalized at interpreter exit, which now and then printed "Exception ignored in
    BaseEventLoop.__del__ ... Invalid file descriptor: -1" into a one-line error's stderr. A
    thread whose own loop runs is left as it is (jupyter then runs the coroutine elsewhere)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # none runs here: jupyter sets one for this thread
        try:
            return call()
        finally:
            with contextlib.suppress(RuntimeError):  # none was set
                asyncio.get_event_loop_policy().get_event_loop().close()
            asyncio.set_event_loop(None)
    return call()


def _launcher() -> ThreadPoolExecutor:
    """The long-lived threads every kernel is spawned from.

    bwrap's --die-with-parent uses PR_SET_PDEATHSIG, which fires when the *thread* that forked
    it exits. Spawning from these threads (alive until interpreter exit) ties a kernel's life to
    the host process, not to whichever short-lived thread happened to start it.
    """
    global _launcher_pool
    with _counter_lock:
        if _launcher_pool is None:
            _launcher_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kernel-launch")
        return _launcher_pool


def host_lifeline() -> int:
    """The read end of a pipe whose write end only this host process holds; kernels inherit it.

    bwrap's --die-with-parent cannot cover a host killed between a kernel's fork and bwrap's
    prctl (a SIGKILLed trainer in the middle of a pool refill left a kernel running). Every
    kernel also reads this pipe (kernel_boot.py) and exits when it reads end-of-file, which the
    kernel sees however and whenever the host died: the write end closes with the process.
    Kernels get the read end through `pass_fds`; nothing else the host starts inherits either.
    """
    global _lifeline
    with _counter_lock:
        if _lifeline is None or _lifeline[0] != os.getpid():  # a forked child makes its own
            read_end, write_end = os.pipe()
            _lifeline = (os.getpid(), read_end, write_end)
        return _lifeline[1]


def allocate_uid(number: int) -> int:
    """A uid no other live sandbox of this host process uses (it bounds RLIMIT_NPROC)."""
    return UID_BASE + (os.getpid() % 1024) * 1024 + number % 1024


def bridge_socket(directory: Path) -> Path:
    """Where a sandbox's bridge listens (in its channel directory, seen by the kernel)."""
    chan = directory / "chan"
    chan.mkdir(parents=True, exist_ok=True)
    return chan / "bridge.sock"


def remove_entry(path: Path) -> None:
    """Delete one entry of a kernel-writable directory, whatever the kernel made it.

    Agent code can leave directories, links or fifos among the channel files; a plain unlink
    of a directory would raise, and the next kernel would fail to start for a reason the agent
    caused.
    """
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def remove_directory(directory: Path) -> None:
    """Delete a sandbox directory (files the kernel made included), unmounting its tmpfs."""
    scratch.unmount(directory)
    shutil.rmtree(directory, ignore_errors=True)


def _lay_out(
    directory: Path, uid: int | None, cgroup: Cgroup | None, max_output_chars: int
) -> LaunchPlan:
    home, chan = directory / "home", directory / "chan"
    for path in (home, chan):
        path.mkdir(parents=True, exist_ok=True)
        if uid is not None:
            os.chown(path, uid, uid)
        path.chmod(0o700)
    for stale in chan.iterdir():  # sockets of a previous kernel; the bridge's stays
        if stale.name != "bridge.sock":
            remove_entry(stale)
    plan = LaunchPlan(
        uid=uid,
        home_dir=home,
        chan_dir=chan,
        etc_dir=directory / "etc",
        procs_files=tuple(cgroup.procs_files) if cgroup else (),
    )
    write_etc(plan)
    boot = BOOT_SOURCE.read_text().replace("__BRIDGE_SOCKET__", str(chan / "bridge.sock"), 1)
    boot = boot.replace("1 << 20  # replaced too", f"{MAX_REQUEST_BYTES}  # replaced too", 1)
    boot = boot.replace("20_000  # replaced as well", f"{max_output_chars}  # replaced as well", 1)
    boot = boot.replace("-1  # replaced last", f"{host_lifeline()}  # replaced last", 1)
    (chan / "boot.py").write_text(boot)
    (chan / "boot.py").chmod(0o444)
    return plan


def _manager(plan: LaunchPlan, argv: list[str]) -> KernelManager:
    spec_root = plan.home_dir.parent / "spec"
    (spec_root / KERNEL_NAME).mkdir(parents=True, exist_ok=True)
    spec = {"argv": argv, "display_name": KERNEL_NAME, "language": "python"}
    spec["interrupt_mode"] = "message"  # a signal cannot cross into the pid namespace
    (spec_root / KERNEL_NAME / "kernel.json").write_text(json.dumps(spec))
    return KernelManager(
        context=host_context(),  # not a zmq context (and I/O thread) per kernel
        kernel_name=KERNEL_NAME,
        kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec_root)]),
        transport="ipc",  # Unix sockets reach into the kernel's empty network namespace
        ip=str(plan.chan_dir / "k"),
        connection_file=str(plan.chan_dir / "connection.json"),
    )


def _urls(manager: KernelManager) -> dict[str, str]:
    """The kernel's zmq addresses by channel (ipc: a socket file per channel)."""
    info: dict[str, Any] = dict(manager.get_connection_info())
    return {name: f"ipc://{info['ip']}-{info[name + '_port']}" for name in CHANNELS}


def _kill_tree(popen: subprocess.Popen[Any] | None, cgroup: Cgroup | None) -> None:
    if popen is not None and popen.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(popen.pid, signal.SIGKILL)  # launched with start_new_session
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
    if cgroup is not None:
        cgroup.kill_all()
    if popen is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=10)
