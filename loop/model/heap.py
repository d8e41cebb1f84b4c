"""The C heap of a CPU run: glibc's, bounded so that freed tensors go back to the OS.

glibc serves an allocation below its mmap threshold from a heap, and raises the threshold up to
32 MiB whenever a larger block mapped on its own is freed. After that, a learner step's
tensors of a few MiB (a layer's activations, recomputed and freed again in the backward pass)
live in the heap, whose free holes stay resident: learner steps at the main job's shape
(SmolLM2-135M, LoRA, layers recomputed, rollouts of 700-1,200 tokens) peaked at 2.40 GiB of
RSS with the threshold left to rise, 2.13 GiB with it fixed at 2 MiB, 1.53 GiB at 1 MiB
(benchmarks/README.md, third round). A block above the threshold is mapped for itself and
unmapped when freed, at the cost of a page fault per 4 KiB on its first use: at 1 MiB the steps
took 1.04x as long as at 2 MiB (two processes side by side, one thread each, 2 cores).

`bound_heap` fixes the threshold (and so stops its rise); elsewhere than glibc it does nothing.
`LIBC` is glibc, or None.
"""

from __future__ import annotations

import ctypes
import sys

# Blocks from this size up get a map of their own (see the module docstring).
MMAP_THRESHOLD = 2**20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number (glibc's malloc.h)


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.malloc_trim  # noqa: B018 (absent outside glibc: musl)
        libc.mallopt  # noqa: B018
    except (OSError, AttributeError):
        return None
    return libc


LIBC = _glibc()


def bound_heap(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold at `threshold` bytes; False where there is no glibc."""
    if LIBC is None:
        return False
    return bool(LIBC.mallopt(_M_MMAP_THRESHOLD, threshold))
