"""32 concurrent sessions, one client killed mid-cell: no sandbox leaks, capacity is bounded.

Thirty-one clients in this process and one in a child process each open a session and start an
episode (32 sandboxes leased); a 33rd session is refused with CAPACITY_REACHED; the child is
SIGKILLed while its cell runs (its socket drops with no close); the others step and close. Then
every sandbox has gone back to the pool, and a new session works.

Run: python -m pytest tests/tasks/openenv/test_sessions.py     (slow: 33 kernels, a few minutes)
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from openenv.core.generic_client import GenericEnvClient

from tests.tasks.openenv.conftest import Served

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
SESSIONS = 32
CHILD = """
import asyncio, sys
from openenv.core.generic_client import GenericEnvClient

async def main():
    env = GenericEnvClient(base_url=sys.argv[1], message_timeout_s=600)
    await env.reset(seed=0)
    print("reset", flush=True)
    while True:  # cells that run to the server's time limit, until this process is killed
        await env.step({"code": "import time; time.sleep(600)"})

asyncio.run(main())
"""


def test_32_sessions_and_a_killed_client_leak_no_sandbox(server: Served) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, server.url], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "reset"

    async def go() -> None:
        clients = [
            GenericEnvClient(base_url=server.url, message_timeout_s=600)
            for _ in range(SESSIONS - 1)
        ]
        starts = await asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(clients)))
        assert all(not r.done for r in starts)
        assert server.leased() == SESSIONS, server.pool.stats
        extra = GenericEnvClient(base_url=server.url)
        with pytest.raises(RuntimeError, match="CAPACITY_REACHED"):
            await extra.reset(seed=0)
        await extra.close()
        time.sleep(1)  # the child's cell is running in its kernel now
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        steps = await asyncio.gather(*(c.step({"code": "print(1 + 1)"}) for c in clients))
        assert [s.observation["text"] for s in steps] == ["2"] * len(clients)
        await asyncio.gather(*(c.close() for c in clients))

    asyncio.run(go())
    server.wait_until_none_leased(timeout_s=120)

    async def again() -> str:
        async with GenericEnvClient(base_url=server.url) as env:
            await env.reset(seed=1)
            return str((await env.step({"code": "print('fresh')"})).observation["text"])

    assert asyncio.run(again()) == "fresh"
    server.wait_until_none_leased()
