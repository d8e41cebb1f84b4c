"""Zeroed tensors whose memory the OS provides page by page as it is written (on a CPU).

The engine's row slots are sized for the longest row and its `max_new_tokens` ahead, but a row
writes only the keys and values it computes. On a CPU a slot tensor is an anonymous private
memory map (`mmap`): Linux gives it zero pages that become resident only when first written,
so the process holds the tokens the rows have, not the rows times the capacity (a 4 KiB page is
16 tokens of one head's keys in float32). Reading a page never written reads zeros without
making it resident; the attention's masked padding is such reads. `give_back` returns the
pages of a part no row needs any more (a row that left), which read as zeros again. The map is
unmapped when its last tensor is freed.

Elsewhere (a GPU, or a platform without anonymous maps) `SlotMemory` is plain `torch.zeros`
and `give_back` does nothing. Transparent huge pages are refused for the map where the OS
offers the choice, since one written token would then make 2 MiB resident.

`trim_heap` hands the C heap's free pages back to the OS (glibc's `malloc_trim`), which the
generator calls where sampling and learning hand over to each other.
"""

from __future__ import annotations

import math
import mmap
import sys

import torch
from torch import Tensor

from loop.model.heap import LIBC as _LIBC

# Address space only: the kernel's overcommit heuristic would refuse a map larger than the
# memory and swap (36 rows x a 32K-token cap of a small model's float32 keys and values are
# tens of GB of address space, a fraction of it ever written). Linux's flag (mman-linux.h);
# Python's mmap module does not export it.
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class SlotMemory:
    """A zeroed `shape` tensor of `dtype` on `device`, paged in by need on a CPU."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        numel = math.prod(shape)
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        self._map: mmap.mmap | None = None
        self.paged = device.type == "cpu" and hasattr(mmap, "MAP_PRIVATE")  # memory by need
        if not self.paged or not nbytes:
            self.tensor = torch.zeros(shape, dtype=dtype, device=device)
            return
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
        self._map = mmap.mmap(-1, nbytes, flags=flags)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            self._map.madvise(mmap.MADV_NOHUGEPAGE)
        # the tensor holds the map: it is unmapped when both are gone
        self.tensor = torch.frombuffer(self._map, dtype=dtype, count=numel).view(shape)

    def give_back(self, part: Tensor) -> None:
        """Return the whole pages inside `part` (a contiguous piece of `tensor`) to the OS;
        they read as zeros afterwards. The partial pages at its ends are kept (but the map's
        last page, which holds nothing past the tensor)."""
        if self._map is None or not hasattr(mmap, "MADV_DONTNEED") or not part.numel():
            return
        assert part.is_contiguous(), f"give_back needs a contiguous part, got {part.stride()}"
        start = part.data_ptr() - self.tensor.data_ptr()
        end = start + part.numel() * part.element_size()
        first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = end // mmap.PAGESIZE * mmap.PAGESIZE
        if end == self.tensor.numel() * self.tensor.element_size():  # the map's last page
            last = -(-end // mmap.PAGESIZE) * mmap.PAGESIZE  # holds nothing past the tensor
        if last > first:
            self._map.madvise(mmap.MADV_DONTNEED, first, last - first)


def trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc's `malloc_trim`; elsewhere nothing).

    torch's CPU tensors below glibc's mmap threshold (up to 32 MiB) live in malloc's heaps,
    one arena per thread, which keep freed pages resident: after a learner step the main
    thread's arena holds the step's peak (2.3 GiB of SmolLM2-135M's activations at 1,100
    tokens), and the sampler's thread, with an arena of its own, adds its peak on top. Called
    where one phase hands over to the other, the process holds the larger phase, not the sum.
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
