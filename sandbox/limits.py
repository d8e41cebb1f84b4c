"""Resource limits of one sandbox, as plain data.

Every number a sandbox enforces lives here so that a config can set it and the launcher
(`sandbox/isolation.py`) reads it from one place. Defaults suit an agent that writes short
scripts against app APIs: generous for that, tight for anything hostile.

Where the defaults come from:
- `disk_mb`, `max_files`: the agent's files (its home, its channel files, the kernel's log)
  live in one tmpfs of this size and inode count (`sandbox/scratch.py`). Tasks write a handful
  of small files; 256 MiB holds four files of the largest size a process may write
  (`max_file_mb`), and 4,096 files are far more than a task makes yet few enough to list in a
  moment. The tmpfs is RAM, charged to the sandbox's memory cgroup as it fills.
- `output_mb`: the host reads at most this much from one sandbox's kernel over its life (one
  episode; `sandbox/channel.py`). One message is at most about 0.3 MB (`message_limit` of the
  default 20,000-character output cap) and a cell shows one such message's worth, so 64 MiB is
  over two hundred full cells: far past a 50-turn episode, and a cap on the host CPU that a
  flood of output can take.
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
    disk_mb: int = 256
    """Total size of what the sandbox may write besides /tmp: its home, channel files and log."""
    max_files: int = 4096
    """Files and directories the sandbox may create there (the scratch tmpfs's inodes)."""
    output_mb: int = 64
    """Bytes the host reads from the kernel over the sandbox's life (one episode); then no more."""

    def __post_init__(self) -> None:
        positive = ("memory_mb", "cpu_time_s", "max_processes", "max_open_files", "max_file_mb")
        for name in (*positive, "disk_mb", "max_files", "output_mb"):
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
        if self.max_files < 64:
            # The host's own files (channel, /etc, kernelspec, log) take about twenty inodes.
            raise ValueError(f"Limits.max_files must be >= 64, got {self.max_files}")
        if self.memory_mb < 512:
            raise ValueError(f"Limits.memory_mb must be >= 512 for a kernel, got {self.memory_mb}")
