"""How an engine process is confined: the sandbox's isolation layers around the AppWorld worker.

Agent code runs inside the engine (AppWorld's own REPL, as in the paper), and AppWorld's safety
guard is an AST check, not a sandbox. So each engine gets the layers the REPL sandbox gives a
kernel (sandbox/isolation.py), probed by the same `sandbox.probe()`:

    sh        join the engine's cgroups (processes, memory, CPU share; a kill switch)
    prlimit   rlimits: address space, CPU seconds, open files, file size, no core dumps
    bwrap     new net/pid/ipc/uts namespaces; read-only /usr, venv and data; private /tmp
    setpriv   as root, with bwrap: a uid of its own, no capabilities, no new privileges
    python -I worker.py

The engine needs no network (the worker talks over its stdin/stdout pipes and AppWorld's apps
run in-process), so its network namespace is empty, unlike AppWorld's HTTP server mode. It sees
the data directory read-only; the only writable places are its home (AppWorld's outputs and
cache) and its /tmp. A missing layer is left out and named by `sandbox.probe().missing()`;
without bwrap the engine also keeps the host's uid (it could not read a private data root).
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandbox import Capabilities, Limits
from sandbox.cgroups import Cgroup
from sandbox.isolation import (
    ETC_ALLOWED,
    LaunchPlan,
    is_within,
    make_parent_dirs,
    system_dir_args,
    write_etc,
)
from sandbox.process import allocate_uid, next_sandbox_number, remove_directory
from sandbox.reaper import reap_stale, write_owner

# An engine holds about 250-400 MiB; address space is counted, not resident memory.
ENGINE_LIMITS = Limits(
    memory_mb=4096, cpu_time_s=6 * 3600, cpus=1.0, max_processes=64, max_open_files=1024,
    max_file_mb=256, tmp_mb=64,
)  # fmt: skip


def default_root() -> Path:
    """Where engine directories go (next to the sandboxes', reaped the same way)."""
    return Path(tempfile.gettempdir()) / f"loop-appworld-{os.geteuid()}"


@dataclass(frozen=True)
class EngineDir:
    """One engine's directory: `home/` is its HOME and APPWORLD_ROOT (`data` links to the real
    data directory, `experiments/` receives AppWorld's outputs), plus `worker.py`, `etc/`,
    `owner.json` (for the reaper) and `engine.log` (its stderr)."""

    path: Path
    uid: int | None
    cgroup: Cgroup | None

    @property
    def home(self) -> Path:
        return self.path / "home"

    @property
    def log(self) -> Path:
        return self.path / "engine.log"

    def remove(self) -> None:
        """Kill what is left in its cgroup and delete it (idempotent)."""
        if self.cgroup is not None:
            self.cgroup.remove()
        remove_directory(self.path)


def prepare(caps: Capabilities, limits: Limits, data: Path, worker: Path) -> EngineDir:
    """Lay out a fresh engine directory (and its cgroup) under `default_root()`."""
    root = default_root()
    reap_stale(root)
    number = next_sandbox_number()
    path = root / f"{os.getpid()}-{number}-{secrets.token_hex(3)}"
    path.mkdir(parents=True)
    path.chmod(0o711)
    uid = allocate_uid(number) if caps.separate_uid and caps.bwrap else None
    cgroup = None
    try:
        if caps.cgroups is not None:
            cgroup = caps.cgroups.create(
                path.name,
                max_processes=limits.max_processes,
                memory_mb=limits.memory_mb,
                cpus=limits.cpus,
            )
        write_owner(path, cgroup)
        engine = EngineDir(path, uid, cgroup)
        engine.home.mkdir()
        (engine.home / "data").symlink_to(data)
        shutil.copyfile(worker, path / "worker.py")
        (path / "worker.py").chmod(0o444)
        write_etc(LaunchPlan(uid, engine.home, path, path / "etc", ()))
        if uid is not None:
            os.chown(engine.home, uid, uid)
            engine.home.chmod(0o700)
    except BaseException:
        EngineDir(path, uid, cgroup).remove()
        raise
    return engine


def command(
    caps: Capabilities, limits: Limits, engine: EngineDir, python: Path, data: Path
) -> list[str]:
    """The argv that starts the confined worker (arguments for the worker are appended)."""
    cmd: list[str] = []
    if engine.cgroup is not None:
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
        procs = map(str, engine.cgroup.procs_files)
        cmd += ["/bin/sh", "-c", join, "loop-appworld", *procs, "--"]
    if caps.prlimit:
        mib = 1024 * 1024
        cmd += [caps.prlimit, f"--as={limits.memory_mb * mib}", "--core=0"]
        cmd += [f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 5}"]
        cmd += [f"--nofile={limits.max_open_files}", f"--fsize={limits.max_file_mb * mib}"]
        if engine.uid is not None:
            cmd += [f"--nproc={limits.max_processes}"]
        cmd += ["--"]
    if caps.bwrap:
        cmd += [caps.bwrap, *_bwrap_args(limits, engine, python, data), "--"]
    if engine.uid is not None:
        assert caps.setpriv is not None
        cmd += [caps.setpriv, f"--reuid={engine.uid}", f"--regid={engine.uid}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return [*cmd, str(python), "-I", str(engine.path / "worker.py")]


def environment(engine: EngineDir, python: Path) -> dict[str, str]:
    """The engine's whole environment: nothing of the host's (no tokens, keys or paths)."""
    home = str(engine.home)
    return {
        "HOME": home,
        "APPWORLD_ROOT": home,
        "APPWORLD_CACHE": os.path.join(home, ".appworld"),
        "PATH": f"{python.parent}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "TERM": "dumb",
    }


def _bwrap_args(limits: Limits, engine: EngineDir, python: Path, data: Path) -> list[str]:
    args = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--hostname", "appworld", "--die-with-parent"]
    args += ["--new-session", "--clearenv"]
    for key, value in environment(engine, python).items():
        args += ["--setenv", key, value]
    args += system_dir_args(limits.tmp_mb)
    ro_binds = ["/usr", *python_dirs(python), str(data.resolve()), str(engine.path / "worker.py")]
    ro_binds += [str(Path("/etc") / n) for n in ETC_ALLOWED if (Path("/etc") / n).exists()]
    args += make_parent_dirs([*ro_binds, str(engine.home)])
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    for name in ("passwd", "group", "hosts", "hostname"):
        args += ["--ro-bind", str(engine.path / "etc" / name), f"/etc/{name}"]
    args += ["--bind", str(engine.home), str(engine.home)]  # same path: the data link stays valid
    return [*args, "--chdir", str(engine.home)]


def python_dirs(python: Path) -> list[str]:
    """The venv and the installation its interpreter comes from (from pyvenv.cfg's `home`)."""
    venv = python.parent.parent
    dirs = [os.path.realpath(venv)]
    config = venv / "pyvenv.cfg"
    if config.is_file():
        for line in config.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home":
                dirs.append(os.path.realpath(Path(value.strip()).parent))
    dirs.append(os.path.dirname(os.path.dirname(os.path.realpath(python))))
    kept: list[str] = ["/usr"]  # bound anyway
    for path in sorted(set(dirs), key=len):
        if os.path.isdir(path) and path != "/" and not any(is_within(path, k) for k in kept):
            kept.append(path)
    return kept[1:]


def worker_source() -> Path:
    """The worker script shipped with this package (copied into each engine directory)."""
    return Path(__file__).resolve().parent / "engine_side" / "worker.py"
