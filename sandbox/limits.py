"""Resource limits of one sandbox, as plain data.

Every number a sandbox enforces lives here so that a config can set it and the launcher
(`sandbox/isolation.py`) reads it from one place. Defaults suit an agent that writes short
scripts against app APIs: generous for that, tight for anything hostile.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one kernel (and every process it starts) may use."""

    memory_mb: int = 2048
    """Address space per process (RLIMIT_AS) and, with cgroups, resident memory of the sandbox."""
    cpu_time_s: int = 3600
    """CPU seconds per process over the kernel's whole life (RLIMIT_CPU); then it is killed."""
    cpus: float = 1.0
    """CPU share of the whole sandbox in cores (cgroup CPU quota), so it cannot starve the host."""
    max_processes: int = 64
    """Processes and threads in the sandbox (cgroup pids.max and RLIMIT_NPROC)."""
    max_open_files: int = 256
    """Open file descriptors per process (RLIMIT_NOFILE)."""
    max_file_mb: int = 64
    """Largest file a process may write (RLIMIT_FSIZE)."""
    tmp_mb: int = 64
    """Size of the private /tmp (a tmpfs inside the sandbox)."""

    def __post_init__(self) -> None:
        for name in ("memory_mb", "cpu_time_s", "max_processes", "max_open_files", "max_file_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")
        if self.tmp_mb < 0:
            raise ValueError(f"Limits.tmp_mb must be >= 0, got {self.tmp_mb!r}")
        if not self.cpus > 0:
            raise ValueError(f"Limits.cpus must be > 0, got {self.cpus!r}")
        if self.max_processes < 16:
            # ipykernel alone runs about 8 threads (zmq I/O, heartbeat, control, iopub).
            raise ValueError(f"Limits.max_processes must be >= 16, got {self.max_processes}")
        if self.memory_mb < 512:
            raise ValueError(f"Limits.memory_mb must be >= 512 for a kernel, got {self.memory_mb}")
