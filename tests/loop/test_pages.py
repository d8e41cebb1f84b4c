"""The engine's row slots paged in by need (loop/generators/hf/pages.py, engine.py).

A slot tensor's capacity is address space: its pages become resident when written, a leaving
row's pages go back to the OS (they read as zeros again), and a growth copies the rows' own
tokens only. Resident sizes are read from the process (psutil), with wide margins.

Run: python -m pytest tests/loop/test_pages.py -q
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys

import psutil
import pytest
import torch

from loop.generators.hf.engine import DecoderEngine, Row
from loop.generators.hf.pages import _LIBC, SlotMemory
from loop.model.policy import Policy

MIB = 2**20
pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="resident pages are read as Linux reports them"
)


def resident() -> int:
    return psutil.Process().memory_info().rss


def test_slot_memory_is_resident_only_where_written_and_given_back() -> None:
    before = resident()
    slots = SlotMemory((64, 1024, 1024), torch.float32, torch.device("cpu"))  # 256 MiB
    assert resident() - before < 16 * MIB
    assert not slots.tensor.any()  # zeros, read without paging them in
    assert resident() - before < 16 * MIB
    slots.tensor[:16] = 1.0  # 64 MiB written
    assert 56 * MIB < resident() - before < 96 * MIB
    slots.give_back(slots.tensor[:8])
    assert 24 * MIB < resident() - before < 64 * MIB
    assert not slots.tensor[:8].any() and bool(slots.tensor[8:16].all())
    half_page = mmap.PAGESIZE // 8  # float32s in half a page: a partial page is kept
    slots.give_back(slots.tensor[8, 0, half_page : 3 * half_page])
    assert bool(slots.tensor[8, 0, : 2 * half_page].all())
    assert not slots.tensor[8, 0, 2 * half_page : 3 * half_page].any()
    del slots
    assert resident() - before < 32 * MIB


def test_slots_larger_than_the_memory_are_address_space_only() -> None:
    """A slot tensor of four times the machine's memory is made (no swap is set aside for it)
    and only what is written becomes resident."""
    total = psutil.virtual_memory().total + psutil.swap_memory().total
    rows = -(-4 * total // (64 * MIB))
    before = resident()
    slots = SlotMemory((rows, 16 * MIB), torch.float32, torch.device("cpu"))  # 64 MiB a row
    slots.tensor[0, : MIB // 4] = 1.0  # 1 MiB written
    assert resident() - before < 16 * MIB
    del slots


def test_a_leaving_row_gives_its_pages_back(tiny_policy: Policy) -> None:
    """The last row moves into the freed slot; the slot left empty and the freed slot's tail
    past the moved row's tokens read as zeros (their pages went back); the moved row's keys
    and values are intact."""
    engine = DecoderEngine(tiny_policy.model, max_rows=3)
    rows = [Row(ids=[]) for _ in range(3)]
    lengths = [200, 60, 90]
    with torch.no_grad():
        for row, n in zip(rows, lengths, strict=True):
            engine.add(row, None)
            engine.prefill(row, [5] * n)
        kept = engine.own_kv(rows[2]).clone()
        engine.remove(rows[0])
    assert rows[2].slot == 0 and torch.equal(engine.own_kv(rows[2]), kept)
    assert not engine.own[2].any()  # the slot left empty
    tail = engine.own[0, :, :, :, 90:]  # the 110 tokens only the leaving row had
    per_page = mmap.PAGESIZE // (engine.head_dim * engine.own.element_size())
    assert not tail[:, :, :, -(-90 // per_page) * per_page - 90 :].any()


def test_growth_copies_each_row_and_keeps_the_rest_unwritten(tiny_policy: Policy) -> None:
    engine = DecoderEngine(tiny_policy.model, max_rows=4)
    row = Row(ids=[])
    with torch.no_grad():
        engine.add(row, None)
        engine.prefill(row, list(range(3, 40)))
        kept = engine.own_kv(row).clone()
        engine.reserve(4 * engine.own.shape[4])
    assert torch.equal(engine.own_kv(row), kept)
    assert not engine.own[0, :, :, :, 37:].any() and not engine.own[1:].any()


def test_capped_slots_take_the_cap_at_once_and_never_grow(tiny_policy: Policy) -> None:
    """With a context cap the slots' address space is the cap from the first row on: rows of
    growing lengths join without a growth (no copy of the rows held), and only their tokens
    become resident."""
    engine = DecoderEngine(tiny_policy.model, max_rows=4, max_tokens=4096)
    rows = [Row(ids=[]) for _ in range(4)]
    with torch.no_grad():
        engine.add(rows[0], None)
        engine.prefill(rows[0], [5] * 10)
        own = engine.own
        assert own.shape[4] == 4096
        before = resident()
        for row, n in zip(rows[1:], (300, 900, 2000), strict=True):
            engine.reserve(n)
            engine.add(row, None)
            engine.prefill(row, [7] * n)
    assert engine.own is own  # the same slots: nothing grown, nothing copied
    per_token = len(engine.layers) * 2 * engine.kv_heads * engine.head_dim * 4
    written = (300 + 900 + 2000) * per_token
    assert resident() - before < written + 16 * MIB
    for row in rows:
        engine.remove(row, keep=False)
    engine.release()
    assert engine.own.shape[4] == 0


@pytest.mark.skipif(_LIBC is None, reason="glibc's malloc_trim")
def test_trim_heap_returns_what_a_thread_freed() -> None:
    """Tensors of 4 MiB (under glibc's mmap threshold, fixed here at its 32 MiB ceiling: how
    high it has risen otherwise depends on what the process freed before) live in the arena
    of the thread that made them, resident after they are freed while a live tensor above
    them keeps the heap from shrinking, until `trim_heap`. A fresh process, so that no
    earlier test's heap decides the outcome."""
    tunables = "glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824"
    env = {**os.environ, "GLIBC_TUNABLES": tunables}
    out = subprocess.run(
        [sys.executable, "-c", _TRIM_PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    held, after = (int(n) for n in out.stdout.split())
    assert held > 128 * MIB, held  # what the test is about: glibc kept the freed pages
    assert after < held - 128 * MIB, (held, after)


_TRIM_PROBE = """
import threading
import psutil
import torch
from loop.generators.hf.pages import trim_heap
MIB = 2**20
resident = lambda: psutil.Process().memory_info().rss
kept = []
def churn():
    parts = [torch.ones(MIB) for _ in range(64)]  # 64 x 4 MiB
    kept.append(torch.ones(16))
    del parts
thread = threading.Thread(target=churn)
before = resident()
thread.start()
thread.join()
held = resident() - before
trim_heap()
print(held, resident() - before)
"""


@pytest.mark.skipif(_LIBC is None, reason="glibc's mallopt")
@pytest.mark.parametrize("bounded", [False, True])
def test_bound_heap_gives_freed_tensors_back(bounded: bool) -> None:
    """After a 24 MiB block was freed (glibc's threshold then rises to it), 1.5 MiB tensors (a
    600-token row's activations) freed below a live one stay resident; with `bound_heap` (1 MiB)
    each had a map of its own and went back at once. A fresh process, without trim_heap."""
    probe = _BOUND_PROBE.replace("BOUNDED", str(bounded))
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    held = int(out.stdout)
    assert (held < 32 * MIB) if bounded else (held > 128 * MIB), held


_BOUND_PROBE = """
import psutil
import torch
from loop.model.heap import bound_heap
MIB = 2**20
resident = lambda: psutil.Process().memory_info().rss
if BOUNDED:
    bound_heap()
big = torch.ones(6 * MIB)  # 24 MiB mapped and freed: glibc's threshold rises to it
del big
before = resident()
parts = [torch.ones(3 * MIB // 8) for _ in range(128)]  # 128 x 1.5 MiB
kept = parts[-1]  # the last one stays: the heap cannot shrink below it
del parts
print(resident() - before)
"""
