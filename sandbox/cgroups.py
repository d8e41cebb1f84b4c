"""Per-sandbox control groups: a hard cap on processes, memory and CPU share, and a kill switch.

A cgroup is the one mechanism that bounds a whole process tree: a fork bomb stops at `pids.max`
whatever the uid, a memory bomb spread over many processes stops at the memory limit, and
`kill_all()` reaches every process the kernel ever started. We create each sandbox's groups
under the cgroup this process already belongs to, so the host's own limits still apply above.

Both layouts are handled: cgroup v1 (one hierarchy per controller, as on this kind of machine)
and cgroup v2 where the controllers are delegated to our cgroup. Where neither is writable,
`find_cgroup_root()` returns None and the launcher says so.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

CGROUP_MOUNT = Path("/sys/fs/cgroup")
CONTROLLERS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupRoot:
    """Where sandbox cgroups are made: one base directory per controller (v1) or one (v2)."""

    version: int
    bases: dict[str, Path]

    def create(self, name: str, *, max_processes: int, memory_mb: int, cpus: float) -> Cgroup:
        """Make the cgroup `name` with the given limits; raises OSError if it cannot."""
        dirs = sorted({base / name for base in self.bases.values()})
        for path in dirs:
            path.mkdir(parents=True, exist_ok=True)
        group = Cgroup(version=self.version, dirs=tuple(dirs))
        memory = memory_mb * 1024 * 1024
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        if self.version == 1:
            mem_dir, cpu_dir = self.bases["memory"] / name, self.bases["cpu"] / name
            _write(self.bases["pids"] / name / "pids.max", max_processes)
            _write(mem_dir / "memory.limit_in_bytes", memory)
            if (mem_dir / "memory.memsw.limit_in_bytes").exists():
                _write(mem_dir / "memory.memsw.limit_in_bytes", memory)  # no escape into swap
            _write(cpu_dir / "cpu.cfs_period_us", CPU_PERIOD_US)
            _write(cpu_dir / "cpu.cfs_quota_us", quota)
        else:
            path = dirs[0]
            _write(path / "pids.max", max_processes)
            _write(path / "memory.max", memory)
            with contextlib.suppress(OSError):
                _write(path / "memory.swap.max", 0)
            _write(path / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        return group


@dataclass(frozen=True)
class Cgroup:
    """The cgroup directories of one sandbox (one per v1 controller, or a single v2 one)."""

    version: int
    dirs: tuple[Path, ...]

    @property
    def procs_files(self) -> list[Path]:
        """The `cgroup.procs` files a process writes its pid into to join every controller."""
        return [path / "cgroup.procs" for path in self.dirs]

    def pids(self) -> set[int]:
        """Every process currently in the sandbox."""
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError):
                found.update(int(line) for line in path.read_text().split())
        return found

    def peak_processes(self) -> int | None:
        """The most processes the sandbox ever had at once, where the kernel records it."""
        for path in self.dirs:
            peak = path / "pids.peak"
            if peak.exists():
                return int(peak.read_text())
        return None

    def oom_killed(self) -> bool:
        """Whether the memory limit made the kernel kill a process in this sandbox."""
        for path in self.dirs:
            for name, key in (("memory.events", "oom_kill "), ("memory.oom_control", "oom_kill ")):
                with contextlib.suppress(OSError):
                    for line in (path / name).read_text().splitlines():
                        if line.startswith(key) and int(line.split()[1]) > 0:
                            return True
        return False

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the sandbox until none is left; True if it emptied."""
        deadline = time.monotonic() + timeout_s
        kill_file = self.dirs[0] / "cgroup.kill"
        while True:
            pids = self.pids()
            if not pids:
                return True
            if self.version == 2 and kill_file.exists():
                with contextlib.suppress(OSError):
                    _write(kill_file, 1)
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def remove(self) -> None:
        """Kill what is left and delete the directories (idempotent)."""
        self.kill_all()
        for path in self.dirs:
            for _ in range(50):  # rmdir fails with EBUSY until the last process is reaped
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def find_cgroup_root(namespace: str) -> tuple[CgroupRoot | None, str]:
    """A writable place for sandbox cgroups under this process's own cgroup, or None and why."""
    own = _own_cgroup_paths()
    v1 = {c: CGROUP_MOUNT / c / own[c].lstrip("/") / namespace for c in CONTROLLERS if c in own}
    if len(v1) == len(CONTROLLERS) and all((CGROUP_MOUNT / c).is_dir() for c in CONTROLLERS):
        root = CgroupRoot(version=1, bases=v1)
        error = _creation_error(root)
        return (root, "") if error is None else (None, f"cgroup v1: {error}")
    if (CGROUP_MOUNT / "cgroup.controllers").exists() and "" in own:
        parent = CGROUP_MOUNT / own[""].lstrip("/")
        delegated = set((parent / "cgroup.subtree_control").read_text().split())
        if not set(CONTROLLERS) <= delegated:
            return None, f"cgroup v2: {parent} does not delegate {', '.join(CONTROLLERS)}"
        root = CgroupRoot(version=2, bases={"all": parent / namespace})
        error = _creation_error(root)
        return (root, "") if error is None else (None, f"cgroup v2: {error}")
    return None, f"no cgroup hierarchy with {', '.join(CONTROLLERS)} under {CGROUP_MOUNT}"


def _own_cgroup_paths() -> dict[str, str]:
    """Controller name -> this process's cgroup path ("" is the v2 unified hierarchy)."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for controller in controllers.split(","):
                paths[controller] = path
    return paths


def _creation_error(root: CgroupRoot) -> str | None:
    """Why a sandbox cgroup cannot be made under `root` (None if it can)."""
    probe = f"probe-{os.getpid()}-{secrets.token_hex(4)}"  # unique across pid namespaces
    try:
        group = root.create(probe, max_processes=64, memory_mb=512, cpus=1.0)
    except OSError as exc:
        Cgroup(root.version, tuple(base / probe for base in root.bases.values())).remove()
        return f"{type(exc).__name__}: {exc}"
    group.remove()
    return None


def _write(path: Path, value: object) -> None:
    path.write_text(f"{value}\n")
