"""A sandbox's writable space on the host: one tmpfs capped in bytes and in files.

Everything a sandbox can write outside its private /tmp lives in its directory (the agent's
home, the channel files, the kernel's log: `sandbox/process.py`). Mounting a tmpfs with
`size=` and `nr_inodes=` over that directory bounds all of it at once, where agent code cannot
reach: a write past the cap fails with "No space left on device" (ENOSPC), whichever limit it
hits. An rlimit could only cap each file (RLIMIT_FSIZE), never the total or the file count.

The mount lives in the host's mount namespace, so the host reads the agent's files as before
and they outlive kernel restarts; `unmount` drops it (and its contents) at teardown, and the
reaper unmounts those of a host that died (`remove_directory` in sandbox/process.py). Its pages
are RAM, charged to the memory cgroup of the process that writes them (the sandbox's).

Mounting needs root with CAP_SYS_ADMIN; `can_mount()` probes it. Without it the directory is a
plain host directory and only RLIMIT_FSIZE applies (named in `Capabilities.missing()`).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import tempfile
from pathlib import Path

MS_NOSUID, MS_NODEV = 0x2, 0x4  # <sys/mount.h>: no set-uid programs, no device files
MNT_DETACH = 0x2  # <sys/mount.h>: unmount now even if busy, free when the last user leaves
FS_NAME = b"loop-sandbox"  # the mount's source name, as /proc/mounts lists it
_libc = ctypes.CDLL(None, use_errno=True)


class ScratchError(OSError):
    """The scratch tmpfs could not be mounted; the message says why."""


def mount(directory: Path, *, size_mb: int, max_files: int, mode: int = 0o711) -> None:
    """Mount a tmpfs of `size_mb` MiB and `max_files` inodes over `directory` (root only)."""
    options = f"size={size_mb}m,nr_inodes={max_files},mode={mode:o}".encode()
    if _libc.mount(FS_NAME, os.fsencode(directory), b"tmpfs", MS_NOSUID | MS_NODEV, options):
        errno = ctypes.get_errno()
        raise ScratchError(errno, f"cannot mount a tmpfs on {directory}: {os.strerror(errno)}")


def unmount(directory: Path) -> None:
    """Drop the tmpfs on `directory` and everything in it (nothing if none is mounted)."""
    if os.path.ismount(directory):
        _libc.umount2(os.fsencode(directory), MNT_DETACH)


def can_mount() -> str:
    """Why this process cannot mount a scratch tmpfs, in one phrase; "" when it can."""
    if os.geteuid() != 0:
        return "not running as root"
    with tempfile.TemporaryDirectory(prefix="loop-scratch-probe-") as probe:
        try:
            mount(Path(probe), size_mb=1, max_files=16)
        except ScratchError as exc:
            return os.strerror(exc.errno or 0)
        with contextlib.suppress(OSError):
            unmount(Path(probe))
    return ""
