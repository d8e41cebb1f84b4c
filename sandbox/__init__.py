"""The Python REPL sandbox: persistent, isolated IPython kernels with the `apis` bridge.

    from sandbox import KernelPool
    pool = KernelPool(size=4, timeout_s=30)
    sb = pool.acquire(handler=lambda app, api, kwargs: {"echo": kwargs})
    sb.execute("apis.phone.login(username='x')").output   # "{'echo': {'username': 'x'}}\\n"
    pool.release(sb)

Each sandbox is one ipykernel started through jupyter_client. It imports no torch and nothing
from `tasks/` or `loop/`, so environments run on any machine.

What is isolated (each layer is probed at start; `isolation_report()` says which are active):
- Network: the kernel lives in an empty network namespace (bubblewrap). Only the bridge's Unix
  socket and the kernel's own Jupyter sockets, both files in its channel directory, reach out.
  Abstract Unix sockets of the host are unreachable (they belong to the host's namespace).
- Files: a read-only view of /usr, the Python installation and a few /etc files; a private
  HOME (the scratch directory, the only persistent writable place) and a private /tmp (a
  size-capped tmpfs). The project directory, run directories, other sandboxes, the host's /tmp
  and home, and our own packages (even when installed in site-packages) are not visible.
  /etc/passwd lists only the sandbox's user. Everything the sandbox writes outside /tmp (its
  home, its channel files, the kernel's log) lives in one tmpfs capped in bytes and in files
  (`Limits.disk_mb`, `Limits.max_files`; sandbox/scratch.py), so it cannot fill the host's disk.
- Processes: a new pid namespace (host processes are invisible, and the kernel's parent is the
  namespace's init); as root, each kernel runs under a uid of its own with no capabilities and
  no_new_privs, so it cannot signal or ptrace host processes.
- Resources: per-sandbox cgroup caps on processes+threads, memory and CPU share; rlimits on
  address space, CPU seconds, open files, file size and core dumps; cell wall time (interrupt,
  then kill and replace); output and error text: cut with a notice in the kernel, and bounded
  on the host where agent code cannot reach (sandbox/channel.py): every message is size-checked
  as it arrives, the kernel's channels are connected only while a cell runs (what a leftover
  thread prints between cells is never received), and the host reads at most
  `Limits.output_mb` from one sandbox over its episode.
- Environment: the kernel gets a fresh environment (no host variables, tokens or keys).
- Failure: a kernel that dies (segfault, os._exit, SIGKILL, out of memory) is reported as
  `crashed=True` and replaced; a hung one is killed; teardown kills the whole cgroup; sandboxes
  left behind by a killed host are reaped by the next one.

What is not isolated:
- The kernel shares the host's Linux kernel (namespaces, not a VM): a kernel exploit escapes.
- The bridge handler runs in the host process: a flood of `apis` calls costs host CPU until the
  cell's time limit, and the handler must treat its arguments as untrusted (names and values
  are checked at the bridge, `sandbox/arguments.py`; calls are served only while a cell runs).
- Agent code can read the installed Python packages and /usr, and use the CPU share and memory
  it is given; it can read its own connection file and talk to its own kernel.
- libzmq holds all frames of one multipart message until its last one arrives and caps only
  each frame: code that drives its kernel's zmq socket directly with a message of millions of
  frames can still grow host memory while a cell runs (between cells nothing is connected).
- Where a layer is missing (no bubblewrap, no writable cgroups, not root) the sandbox logs a
  loud warning naming what is lost, or refuses to start with `strict=True`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.bridge import ApiError, BridgeServer, Handler
    from sandbox.isolation import Capabilities, probe
    from sandbox.kernel import ExecutionResult, Sandbox, SandboxIsolationError, isolation_report
    from sandbox.limits import Limits
    from sandbox.pool import KernelPool
    from sandbox.process import SandboxStartError

# Loaded on first use, so that importing one light module (`sandbox.limits`, which the trainer's
# config checks read) does not import jupyter_client and zmq: a learner-only machine needs
# neither.
_HOMES = {
    "ApiError": "bridge", "BridgeServer": "bridge", "Handler": "bridge",
    "Capabilities": "isolation", "probe": "isolation",
    "ExecutionResult": "kernel", "Sandbox": "kernel", "SandboxIsolationError": "kernel",
    "isolation_report": "kernel", "Limits": "limits", "KernelPool": "pool",
    "SandboxStartError": "process",
}  # fmt: skip

__all__ = [
    "ApiError",
    "BridgeServer",
    "Capabilities",
    "ExecutionResult",
    "Handler",
    "KernelPool",
    "Limits",
    "Sandbox",
    "SandboxIsolationError",
    "SandboxStartError",
    "isolation_report",
    "probe",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sandbox.{_HOMES[name]}"), name)
