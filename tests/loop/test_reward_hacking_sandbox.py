"""Reward integrity at the sandbox's edges: host memory, host disk and the size of the record.

Each test plays one attack as the agent's turns through the real episode loop and a real
kernel (`play` from tests/loop/test_reward_hacking.py), asserts the rollout is still scored,
and asserts the bound it relies on in numbers: the host's peak RSS while a thread floods output
around the kernel's own cap, the host-side bytes and files of the sandbox while the agent fills
its home, and the serialized size of a rollout whose cells raise 20 MB exceptions.

Run: python -m pytest tests/loop/test_reward_hacking_sandbox.py   (needs root, bubblewrap, cgroups)
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from sandbox import KernelPool, Limits
from tests.loop.test_reward_hacking import COMPLETE, SlowGenerator, assert_scored, play

pytestmark = pytest.mark.slow
MAX_OUTPUT_CHARS = 20_000  # the sandbox's default: what one cell may show
LIMITS = Limits(disk_mb=64, max_files=2_000)  # small, so filling them takes a moment


@pytest.fixture(scope="module")
def sandbox_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's sandbox directories (and nothing else's), to measure on the host."""
    return tmp_path_factory.mktemp("sandboxes")


@pytest.fixture(scope="module")
def pool(sandbox_root: Path) -> Iterator[KernelPool]:
    with KernelPool(
        size=1, timeout_s=5, strict=True, limits=LIMITS, root_dir=sandbox_root
    ) as kernel_pool:
        yield kernel_pool


class Sampler:
    """Calls `sample` every `period_s` on a thread while the `with` block runs."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            self.sample()

    def sample(self) -> None:
        raise NotImplementedError


class RssSampler(Sampler):
    """Samples this (host) process's resident memory; `peak_growth` over its value at start.

    ru_maxrss would miss growth that stays below an earlier peak (loading the tokenizer).
    """

    def __init__(self, period_s: float = 0.02) -> None:
        super().__init__(period_s)
        self.before = self.rss()
        self.peak_growth = 0

    @staticmethod
    def rss() -> int:
        """Resident bytes of this process now."""
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * resource.getpagesize()

    def sample(self) -> None:
        self.peak_growth = max(self.peak_growth, self.rss() - self.before)


class DiskSampler(Sampler):
    """Samples, on the host, the bytes and files under the sandbox root and the disk's use."""

    def __init__(self, root: Path, period_s: float = 0.05) -> None:
        super().__init__(period_s)
        self.root = root
        self.used_before = shutil.disk_usage(root).used
        self.peak_bytes = self.peak_files = self.peak_disk_growth = 0

    def sample(self) -> None:
        size = files = 0
        for folder, _, names in os.walk(self.root):
            for name in names:
                try:
                    size += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    continue  # deleted while we walked
                files += 1
        growth = shutil.disk_usage(self.root).used - self.used_before
        self.peak_bytes = max(self.peak_bytes, size)
        self.peak_files = max(self.peak_files, files)
        self.peak_disk_growth = max(self.peak_disk_growth, growth)


def test_output_around_the_kernel_cap_leaves_host_memory_flat(
    suite: Any, pool: KernelPool, tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The stream class's own write skips the kernel's cap; the thread keeps writing while the
    # policy "thinks" (3 s per turn, no cell running) and while later cells run.
    flood = (
        "import sys, threading\n"
        "write = type(sys.stdout).write\n"
        "def spam():\n"
        "    while True: write(sys.stdout, 'y' * 10**7)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
        "write(sys.stdout, 'x' * 3 * 10**7)"
    )
    monkeypatch.setattr(SlowGenerator, "delay_s", 3.0)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with RssSampler() as memory:
        traj = play(suite, pool, tokenizer, [flood, "'next'", "'and next'", COMPLETE], slow=True)
    grown_mb = memory.peak_growth / 2**20
    assert grown_mb < 100, f"the host's RSS grew by {grown_mb:.0f} MB"
    peak_grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kb) / 1024
    assert peak_grown_mb < 100, f"the host's peak RSS grew by {peak_grown_mb:.0f} MB"
    observations = [turn.observation or "" for turn in traj.turns]
    assert max(map(len, observations)) < MAX_OUTPUT_CHARS + 1_000, list(map(len, observations))
    assert "'next'" in observations[1], observations[1][-300:]
    assert traj.status == "ok"
    assert_scored(traj)


def test_filling_the_home_is_bounded_on_the_host_and_scored(
    suite: Any, pool: KernelPool, tokenizer: Any, sandbox_root: Path
) -> None:
    big = (
        "total = 0\n"
        "try:\n"
        "    for i in range(20):\n"
        "        with open(f'big{i}.bin', 'wb') as f:\n"
        "            for _ in range(30):\n"
        "                f.write(b'0' * 2**20); total += 2**20\n"
        "except OSError as e: print(type(e).__name__, e)\n"
        "print('MiB written:', total >> 20)"
    )
    many = (
        "import os\n"
        "made = 0\n"
        "try:\n"
        "    os.makedirs('many', exist_ok=True)\n"
        "    for made in range(10_000): open(f'many/{made}', 'w').close()\n"
        "except OSError as e: print(type(e).__name__, e)\n"
        "print('files made:', made)"
    )
    crash = "import os\nos._exit(1)"  # a new kernel must start in the full scratch space
    with DiskSampler(sandbox_root) as disk:
        traj = play(suite, pool, tokenizer, [big, many, crash, "print('alive')", COMPLETE])
    mib = 2**20
    assert disk.peak_bytes < (LIMITS.disk_mb + 2) * mib, f"{disk.peak_bytes / mib:.0f} MiB"
    assert disk.peak_files <= LIMITS.max_files + 20, disk.peak_files  # + the idle warm sandbox
    assert disk.peak_disk_growth < LIMITS.disk_mb * mib, f"{disk.peak_disk_growth / mib:.0f} MiB"
    observations = [turn.observation or "" for turn in traj.turns]
    assert "No space left" in observations[0] and "No space left" in observations[1], observations
    assert traj.turns[2].crashed and "alive" in observations[3], observations[3]
    assert traj.status == "ok"
    assert_scored(traj)


def test_huge_exception_messages_leave_the_record_small(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    raise_huge = "raise Exception('x' * 20_000_000)"
    traj = play(suite, pool, tokenizer, [raise_huge] * 3 + [COMPLETE])
    record = traj.to_json()  # what a rollouts file holds (loop/run/runlog.py)
    turn_chars, record_chars = len(json.dumps(record["turns"])), len(json.dumps(record))
    # 3 cut errors and observations (~22 KB a turn); the rest is tokens, as for any long output
    assert turn_chars < 100_000, f"the turns serialize to {turn_chars:,} characters"
    assert record_chars < 400_000, f"the rollout record is {record_chars:,} characters"
    for turn in traj.turns[:3]:
        assert turn.error is not None and turn.error.startswith("Exception: xxx"), turn.error
        assert len(turn.error) <= MAX_OUTPUT_CHARS + 100 and "characters cut" in turn.error
    assert traj.status == "ok"
    assert_scored(traj)
