"""Child processes that end when this process ends, even by SIGKILL.

A vLLM server runs in processes this one starts (the server, its engine core, its workers).
When this process exits normally the server is stopped; when it is killed (SIGKILL, the OOM
killer, a scheduler ending a job), nothing stops it, and its processes live on as orphans
holding the model and the KV cache (a 10 GB worker, seen after a SIGKILLed torchrun run).
`Lifeline` watches for that: a small watcher process that the kernel signals when this process
dies (PR_SET_PDEATHSIG, Linux; when made by the main thread) or that sees itself reparented
(checked twice a second), and that then kills the given processes and everything under them.
`release()` stands it down after a normal stop.

    process = subprocess.Popen(server_command, start_new_session=True)
    lifeline = Lifeline([process.pid])   # the server and everything it starts
    ...
    stop(process); lifeline.release()

`child_pids` lists a process's children (from /proc).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterable
from pathlib import Path

WATCHER = r"""
import ctypes, os, signal, sys, time
POLL_S = 0.5
from pathlib import Path

roots = [int(p) for p in sys.argv[3:]]

def parents():
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
                found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return found

def end(*_):
    table, doomed, frontier = parents(), set(roots), set(roots)
    while frontier:
        frontier = {pid for pid, parent in table.items() if parent in frontier} - doomed
        doomed |= frontier
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(0)

signal.signal(signal.SIGTERM, end)
if sys.argv[2] == "1":  # started by the main thread: its death is the process's death
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
while os.getppid() == int(sys.argv[1]):  # reparented: the watched process has died
    time.sleep(POLL_S)
end()
"""


def child_pids(pid: int | None = None) -> set[int]:
    """The live children of `pid` (default: this process), from /proc."""
    pid = os.getpid() if pid is None else pid
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.add(int(entry.name))
    return children


class Lifeline:
    """Kills `roots` and their descendants when this process dies (see the module docstring)."""

    def __init__(self, roots: Iterable[int]):
        self.roots = sorted(roots)
        self._watcher: subprocess.Popen[bytes] | None = None
        if self.roots and sys.platform.startswith("linux"):
            # PR_SET_PDEATHSIG follows the creating thread, not the process: another thread
            # (a restart in the background) ending must not end the server, so there the
            # watcher only polls for its reparenting
            main = "1" if threading.current_thread() is threading.main_thread() else "0"
            args = [sys.executable, "-c", WATCHER, str(os.getpid()), main, *map(str, self.roots)]
            self._watcher = subprocess.Popen(args, stdin=subprocess.DEVNULL)

    def release(self) -> None:
        """Stand the watcher down (the processes were ended the normal way)."""
        if self._watcher is not None:
            self._watcher.kill()
            self._watcher.wait()
            self._watcher = None
