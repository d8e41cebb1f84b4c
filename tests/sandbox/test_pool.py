"""The kernel pool: warm kernels, never reused, dead ones replaced, everything cleaned up.

Run: python -m pytest tests/sandbox/test_pool.py
"""

from __future__ import annotations

import asyncio
import time

import pytest

from sandbox import KernelPool
from tests.sandbox.conftest import processes_of, wait_until


def test_acquire_is_fast_when_kernels_are_warm() -> None:
    with KernelPool(size=2, strict=True) as pool:
        assert wait_until(lambda: pool.idle == 2, timeout_s=60)
        start = time.monotonic()
        sb = pool.acquire()
        assert time.monotonic() - start < 0.2
        assert sb.execute("1 + 1").output == "2\n"
        pool.release(sb)


def test_a_kernel_is_never_handed_to_another_rollout_with_its_state() -> None:
    with KernelPool(size=1, strict=True) as pool:
        seen = set()
        for _ in range(3):
            sb = pool.acquire(timeout=60)
            assert sb.execute("'secret' in globals()").output == "False\n"
            assert sb.execute("import os\nos.listdir('.')").output == "[]\n"
            sb.execute("secret = 1\nopen('left-behind.txt', 'w').write('x')")
            seen.add(sb.directory)
            pool.release(sb)
        assert len(seen) == 3
        assert pool.stats["acquired"] == 3 and pool.stats["released"] == 3


def test_a_warm_kernel_that_died_is_not_handed_out() -> None:
    with KernelPool(size=1, strict=True) as pool:
        assert wait_until(lambda: pool.idle == 1, timeout_s=60)
        dead = pool._idle[0]
        dead._kernel.popen.kill()
        dead._kernel.popen.wait()
        sb = pool.acquire(timeout=60)
        assert sb is not dead and sb.alive()
        assert pool.stats["dead_on_acquire"] == 1
        pool.release(sb)


def test_async_acquire_and_release() -> None:
    async def rollout(pool: KernelPool, i: int) -> str:
        sb = await pool.acquire_async(handler=lambda app, api, kw: kw["i"] * 2)
        try:
            return (await sb.execute_async(f"apis.calc.double(i={i})")).output
        finally:
            await pool.release_async(sb)

    async def main() -> list[str]:
        with KernelPool(size=2, strict=True) as pool:
            return await asyncio.gather(*(rollout(pool, i) for i in range(4)))

    assert asyncio.run(main()) == ["0\n", "2\n", "4\n", "6\n"]


def test_close_destroys_idle_and_leased_kernels() -> None:
    pool = KernelPool(size=2, strict=True)
    leased = pool.acquire(timeout=60)
    assert wait_until(lambda: pool.idle == 2, timeout_s=60)
    uids = [leased.uid, *(sb.uid for sb in pool._idle)]
    pool.close()
    assert wait_until(lambda: not any(processes_of(uid) for uid in uids))
    assert not leased.directory.exists()
    with pytest.raises(RuntimeError, match="closed KernelPool"):
        pool.acquire()


def test_start_failures_surface_in_acquire() -> None:
    with KernelPool(size=1, strict=True, root_dir="/proc/no-such-dir") as pool:
        with pytest.raises(RuntimeError, match=r"cannot start kernels: .*no-such-dir"):
            pool.acquire(timeout=60)
        assert pool.stats["start_failures"] >= 1
