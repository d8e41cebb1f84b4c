"""What the OpenEnv wire costs: a step over an OpenEnv session against the same step run locally,
and the host memory one open session takes.

Run: python benchmarks/bench_openenv.py            (about 1 min; starts a server and 9 kernels)
     python benchmarks/bench_openenv.py --steps 50 --sessions 4   (a shorter pass)

The server is `python -m tasks.openenv serve` in its own process, as users run it. A step is
one cell of the built-in world (`print(1)`, and an API call through the sandbox's bridge);
locally the same cell runs through `env.astep` in this process. Memory: the server process's
RSS, and with its sandbox kernels (the process tree), before and after opening N sessions
(each reset, so each holds a kernel), divided by N; the pool keeps no warm kernels here.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import psutil
from openenv.core.generic_client import GenericEnvClient

from sandbox import KernelPool
from tasks.apptown import AppTownSuite

SPLIT = "dev"
CELLS = {"print(1)": "print(1)", "API call": "apis.supervisor.show_profile()"}


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(0.95 * (len(ordered) - 1))] * 1e3


async def _local(suite: AppTownSuite, code: str, steps: int) -> list[float]:
    with KernelPool(size=1, timeout_s=30) as pool:
        sandbox = await pool.acquire_async()
        env = suite.make_env(suite.tasks(SPLIT)[0], sandbox)
        await env.areset()
        await env.astep(code)  # warm
        samples = []
        for _ in range(steps):
            start = time.perf_counter()
            await env.astep(code)
            samples.append(time.perf_counter() - start)
        await pool.release_async(sandbox)
    return samples


async def _wire(url: str, code: str, steps: int) -> list[float]:
    async with GenericEnvClient(base_url=url) as env:
        await env.reset(seed=0)
        await env.step({"code": code})
        samples = []
        for _ in range(steps):
            start = time.perf_counter()
            await env.step({"code": code})
            samples.append(time.perf_counter() - start)
    return samples


def _rss_mb(process: psutil.Process) -> tuple[float, float]:
    """The server's RSS, and its whole process tree's (its kernels), in MB."""
    own = process.memory_info().rss
    tree = own + sum(c.memory_info().rss for c in process.children(recursive=True))
    return own / 2**20, tree / 2**20


async def _open_sessions(url: str, n: int) -> list[GenericEnvClient]:
    clients = [GenericEnvClient(base_url=url) for _ in range(n)]
    await asyncio.gather(*(c.reset(seed=i) for i, c in enumerate(clients)))
    return clients


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per cell and side")
    parser.add_argument("--sessions", type=int, default=8, help="sessions opened for memory")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "tasks.openenv", "serve", "--split", SPLIT, "--port", str(port),
         "--pool-size", "0", "--max-sessions", str(args.sessions + 1),
         "--max-steps", str(args.steps + 10)],
        cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                if httpx.get(f"{url}/health").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        suite = AppTownSuite()
        header = f"{'local p50/p95 ms':>18} {'wire p50/p95 ms':>18} {'wire/local p50':>15}"
        print(f"{'step':<10} {header}")
        for name, code in CELLS.items():
            local = _percentiles(asyncio.run(_local(suite, code, args.steps)))
            wire = _percentiles(asyncio.run(_wire(url, code, args.steps)))
            print(
                f"{name:<10} {local[0]:>8.2f} / {local[1]:<7.2f} {wire[0]:>8.2f} / {wire[1]:<7.2f}"
                f" {wire[0] / local[0]:>14.2f}x  (+{wire[0] - local[0]:.2f} ms p50)"
            )
        process = psutil.Process(server.pid)
        before = _rss_mb(process)

        async def measure() -> tuple[float, float]:
            clients = await _open_sessions(url, args.sessions)
            await asyncio.sleep(2)  # kernels settle
            after = _rss_mb(process)
            await asyncio.gather(*(c.close() for c in clients))
            return after

        after = asyncio.run(measure())
        n = args.sessions
        print(
            f"memory per open session ({n} sessions): server process "
            f"{(after[0] - before[0]) / n:.1f} MB, with its kernel {(after[1] - before[1]) / n:.1f}"
            f" MB (server {before[0]:.0f} -> {after[0]:.0f} MB, tree {before[1]:.0f} -> "
            f"{after[1]:.0f} MB)"
        )
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
