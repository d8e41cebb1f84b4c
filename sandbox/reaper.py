"""Cleaning up after sandboxes: at exit, and after a host process that died without cleaning.

Every live `Sandbox` is closed at interpreter exit (sandbox/kernel.py keeps that registry). A
host that was killed (SIGKILL, OOM, a
power cut) cannot do that, so each sandbox directory records its owner (pid and start time) and
its cgroups; the next process that makes a sandbox under the same root reaps the directories
whose owner is gone: it kills what is left in their cgroups and deletes them. Only sandboxes made in
this pid namespace are judged (a pid means nothing across namespaces). Teardown is idempotent
and keyed by directory name, so reaping twice is harmless.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from sandbox.cgroups import Cgroup
from sandbox.process import remove_directory

log = logging.getLogger(__name__)
_reaped_roots: set[Path] = set()
_lock = threading.Lock()


def write_owner(directory: Path, cgroup: Cgroup | None) -> None:
    """Record who owns a sandbox directory and which cgroups to empty when reaping it."""
    pid = os.getpid()
    owner: dict[str, Any] = {"pid": pid, "start": _start_time(pid), "pidns": _pid_namespace()}
    owner["cgroup"] = (
        None
        if cgroup is None
        else {"version": cgroup.version, "dirs": [str(d) for d in cgroup.dirs]}
    )
    (directory / "owner.json").write_text(json.dumps(owner))


def reap_stale(root: Path) -> int:
    """Remove sandboxes under `root` whose owning process is gone (once per root per process)."""
    with _lock:
        if root in _reaped_roots:
            return 0
        _reaped_roots.add(root)
    reaped = 0
    for directory in sorted(root.glob("*-*")) if root.is_dir() else []:
        try:
            owner = json.loads((directory / "owner.json").read_text())
        except (OSError, ValueError):
            continue  # not ours, or still being created
        if owner.get("pidns") != _pid_namespace():
            continue  # another pid namespace's: its pid means nothing here
        if _start_time(owner["pid"]) == owner["start"]:
            continue  # its owner is alive
        if owner.get("cgroup"):
            dirs = tuple(Path(d) for d in owner["cgroup"]["dirs"])
            Cgroup(version=owner["cgroup"]["version"], dirs=dirs).remove()
        remove_directory(directory)
        reaped += 1
    if reaped:
        log.warning("reaped %d sandboxes left behind by dead processes under %s", reaped, root)
    return reaped


def _pid_namespace() -> str:
    """Which pid namespace this process is in (pids are only comparable within one)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "unknown"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (tells a live pid from a reused one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]
