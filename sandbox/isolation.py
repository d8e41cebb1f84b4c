"""How a kernel process is confined: probe what this machine offers, build the launch command.

The launch command is a chain of small exec's, each adding one layer, strongest first:

    sh   (join the sandbox's cgroups: caps processes, memory, CPU share; a kill switch)
    prlimit   (rlimits: address space, CPU seconds, open files, file size, no core dumps)
    bwrap     (new net/pid/ipc/uts namespaces; a read-only allow-listed filesystem)
    setpriv   (as root: drop to a uid of the sandbox's own, no capabilities, no new privileges)
    python -m ipykernel_launcher

Before the chain runs, the sandbox's directory (home, channel files, log) gets a tmpfs capped
in bytes and files (`sandbox/scratch.py`), where the host may mount one.

`probe()` finds which layers work here. A missing layer is left out of the chain and named in
`Capabilities.missing()`; the sandbox warns once, or refuses to start when asked to be strict.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import site
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from sandbox import scratch
from sandbox.cgroups import CgroupRoot, find_cgroup_root
from sandbox.limits import Limits

CGROUP_NAMESPACE = "loop-sandbox"
SANDBOX_HOME = "/home/agent"
SANDBOX_USER = "agent"
OWN_PACKAGES = ("loop", "sandbox", "tasks")  # hidden from agent code even when installed
ETC_ALLOWED = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime", "alternatives")


@dataclass(frozen=True)
class Capabilities:
    """The isolation layers that work on this machine (None where one is missing)."""

    bwrap: str | None
    prlimit: str | None
    setpriv: str | None
    cgroups: CgroupRoot | None
    is_root: bool
    cgroup_problem: str = ""  # why cgroups are unusable, when they are
    scratch_problem: str = "not probed"  # why no scratch tmpfs can be mounted ("" if it can)

    @property
    def scratch(self) -> bool:
        """Whether each sandbox's files go in a tmpfs capped in bytes and files."""
        return not self.scratch_problem

    @property
    def separate_uid(self) -> bool:
        """Whether each kernel runs under a uid of its own (needs root and setpriv)."""
        return self.is_root and self.setpriv is not None

    def missing(self) -> list[str]:
        """One line per layer that is missing, saying what is therefore not isolated."""
        gaps = []
        if self.bwrap is None:
            gaps.append(
                "bubblewrap (bwrap) is not usable: agent code has the host's network and can "
                "read every file the kernel's user can (install it: apt-get install bubblewrap)"
            )
        if self.cgroups is None:
            why = self.cgroup_problem or "not running as root"
            gaps.append(
                f"cgroups are not usable ({why}): no cap on the sandbox's total processes, "
                "memory and CPU share; only per-process rlimits apply"
            )
        if not self.scratch:
            gaps.append(
                f"a size-capped tmpfs cannot be mounted for the sandbox's files "
                f"({self.scratch_problem}): agent code can fill the host's disk, each file "
                "capped only by RLIMIT_FSIZE"
            )
        if self.prlimit is None:
            gaps.append("prlimit (util-linux) is missing: no rlimits on the kernel")
        if self.is_root and self.setpriv is None:
            gaps.append("setpriv (util-linux) is missing: kernels run as root")
        return gaps


@functools.cache
def probe() -> Capabilities:
    """Find the isolation layers that work here (cached for the life of the process)."""
    is_root = os.geteuid() == 0
    cgroups, cgroup_problem = find_cgroup_root(CGROUP_NAMESPACE) if is_root else (None, "")
    return Capabilities(
        bwrap=_working_bwrap(),
        prlimit=shutil.which("prlimit"),
        setpriv=shutil.which("setpriv") if is_root else None,
        cgroups=cgroups,
        is_root=is_root,
        cgroup_problem=cgroup_problem,
        scratch_problem=scratch.can_mount(),
    )


def _working_bwrap() -> str | None:
    path = shutil.which("bwrap")
    if path is None:
        return None
    test = [path, "--unshare-net", "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/"]
    test += ["--dev", "/dev", "--proc", "/proc", "true"]
    try:
        done = subprocess.run(test, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return path if done.returncode == 0 else None


@dataclass(frozen=True)
class LaunchPlan:
    """Everything the launcher needs to start one confined kernel."""

    uid: int | None  # the kernel's uid when it gets one of its own
    home_dir: Path  # the sandbox's scratch directory (its HOME and working directory)
    chan_dir: Path  # connection file, zmq ipc sockets, bridge socket, boot code
    etc_dir: Path  # synthesized /etc/passwd, /etc/group, /etc/hosts (read-only inside)
    procs_files: tuple[Path, ...]  # cgroup.procs files to join, empty without cgroups


def kernel_command(caps: Capabilities, limits: Limits, plan: LaunchPlan) -> list[str]:
    """The full argv that starts a confined ipykernel ("{connection_file}" left templated)."""
    cmd: list[str] = []
    if plan.procs_files:
        join = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
        cmd += ["/bin/sh", "-c", join, "loop-sandbox", *map(str, plan.procs_files), "--"]
    if caps.prlimit:
        cmd += [caps.prlimit, *_rlimit_args(limits, nproc=_nproc_applies(caps))]
        cmd += ["--"]
    if caps.bwrap:
        cmd += [caps.bwrap, *_bwrap_args(limits, plan), "--"]
    if caps.separate_uid and plan.uid is not None:
        assert caps.setpriv is not None
        cmd += [caps.setpriv, f"--reuid={plan.uid}", f"--regid={plan.uid}", "--clear-groups"]
        cmd += ["--inh-caps=-all", "--bounding-set=-all", "--no-new-privs", "--"]
    return cmd + _python_args(plan)


def kernel_env(plan: LaunchPlan) -> dict[str, str]:
    """The kernel's whole environment: nothing of the host's (no tokens, keys or paths)."""
    python_bin = str(Path(sys.executable).parent)
    isolated = probe().bwrap is not None
    return {
        "HOME": SANDBOX_HOME if isolated else str(plan.home_dir),
        # IPython's profile goes to the private /tmp, so the agent's home starts empty.
        "IPYTHONDIR": "/tmp/.ipython" if isolated else str(plan.home_dir / ".ipython"),
        "USER": SANDBOX_USER,
        "LOGNAME": SANDBOX_USER,
        "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "MPLBACKEND": "Agg",
        "TERM": "dumb",
    }


def write_etc(plan: LaunchPlan) -> None:
    """The /etc files agent code sees: just its own user, no host accounts or hosts."""
    uid = plan.uid if plan.uid is not None else os.getuid()
    plan.etc_dir.mkdir(parents=True, exist_ok=True)
    (plan.etc_dir / "passwd").write_text(
        f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{uid}:{uid}:agent:{SANDBOX_HOME}:/bin/sh\n"
    )
    (plan.etc_dir / "group").write_text(f"root:x:0:\n{SANDBOX_USER}:x:{uid}:\n")
    (plan.etc_dir / "hosts").write_text("127.0.0.1 localhost sandbox\n::1 localhost\n")
    (plan.etc_dir / "hostname").write_text("sandbox\n")


def _nproc_applies(caps: Capabilities) -> bool:
    # RLIMIT_NPROC counts every process of the kernel's uid. It bounds the sandbox only when
    # that uid is the sandbox's own: a fresh uid (root + setpriv) or a user namespace (bwrap
    # as non-root). Root ignores it, and a shared uid would count the user's other processes.
    return caps.separate_uid or (caps.bwrap is not None and not caps.is_root)


def _rlimit_args(limits: Limits, *, nproc: bool) -> list[str]:
    mib = 1024 * 1024
    args = [
        f"--as={limits.memory_mb * mib}",
        f"--cpu={limits.cpu_time_s}:{limits.cpu_time_s + 5}",  # SIGXCPU first, SIGKILL 5 s later
        f"--nofile={limits.max_open_files}",
        f"--fsize={limits.max_file_mb * mib}",
        "--core=0",
    ]
    if nproc:
        args.append(f"--nproc={limits.max_processes}")
    return args


def _bwrap_args(limits: Limits, plan: LaunchPlan) -> list[str]:
    args = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
    args += ["--unshare-cgroup-try", "--hostname", "sandbox", "--die-with-parent", "--new-session"]
    args += ["--clearenv"]
    for key, value in kernel_env(plan).items():
        args += ["--setenv", key, value]
    args += system_dir_args(limits.tmp_mb)
    ro_binds = ["/usr", *_python_dirs()]
    ro_binds += [str(Path("/etc") / name) for name in ETC_ALLOWED if (Path("/etc") / name).exists()]
    args += make_parent_dirs([*ro_binds, SANDBOX_HOME, str(plan.chan_dir)])
    for path in ro_binds:
        args += ["--ro-bind", path, path]
    for name in ("passwd", "group", "hosts", "hostname"):
        args += ["--ro-bind", str(plan.etc_dir / name), f"/etc/{name}"]
    for hidden in _own_package_dirs(ro_binds):
        args += ["--tmpfs", hidden]
    args += ["--bind", str(plan.home_dir), SANDBOX_HOME]
    args += ["--bind", str(plan.chan_dir), str(plan.chan_dir)]  # same path: the connection
    args += ["--chdir", SANDBOX_HOME]  # file names its sockets by host path
    return args


def _python_args(plan: LaunchPlan) -> list[str]:
    return [
        sys.executable,
        "-I",  # ignore PYTHON* variables, the user site and the working directory
        "-m",
        "ipykernel_launcher",
        "-f",
        "{connection_file}",
        f"--IPKernelApp.exec_files={plan.chan_dir / 'boot.py'}",
        "--HistoryManager.enabled=False",  # no sqlite history file in the scratch dir
        "--InteractiveShell.colors=NoColor",  # plain tracebacks: no ANSI codes for the agent
        "--InteractiveShell.xmode=Plain",  # short, standard tracebacks: fewer tokens
        "--IPKernelApp.quiet=True",
        "--Application.log_level=WARN",
    ]


def _python_dirs() -> list[str]:
    """The interpreter and its site-packages: all agent code may read besides /usr."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    dirs.update(site.getsitepackages())
    kept: list[str] = []
    for path in sorted(dirs, key=len):  # drop a directory already inside a kept one
        real = os.path.realpath(path)
        if os.path.isdir(real) and not any(is_within(real, k) for k in kept):
            kept.append(real)
    return kept


def _own_package_dirs(bound: list[str]) -> list[str]:
    """Our packages' directories that a bind would expose (an installed, non-editable copy)."""
    hidden = []
    for name in OWN_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        for location in spec.submodule_search_locations:
            real = os.path.realpath(location)
            if any(is_within(real, b) for b in bound):
                hidden.append(real)
    return hidden


def system_dir_args(tmp_mb: int) -> list[str]:
    """bwrap arguments for the top-level system directories, /dev, /proc and a capped /tmp."""
    args: list[str] = []
    for top in ("bin", "lib", "lib64", "sbin"):  # merged-/usr systems have these as symlinks
        top_dir = Path("/") / top
        if top_dir.is_symlink():
            args += ["--symlink", str(top_dir.readlink()), str(top_dir)]
        elif top_dir.is_dir():
            args += ["--ro-bind", str(top_dir), str(top_dir)]
    args += ["--dev", "/dev", "--proc", "/proc"]
    args += ["--perms", "1777", "--size", str(max(1, tmp_mb) * 1024 * 1024), "--tmpfs", "/tmp"]
    return args


def make_parent_dirs(targets: list[str]) -> list[str]:
    """`--dir` each missing ancestor as 0755: bwrap would copy host modes (/root is 0700)."""
    parents: set[str] = set()
    for target in targets:
        parent = Path(target).parent
        while str(parent) != "/":
            parents.add(str(parent))
            parent = parent.parent
    args: list[str] = []
    for path in sorted(parents, key=lambda p: p.count("/")):
        args += ["--perms", "0755", "--dir", path]
    return args


def is_within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip("/") + "/")
