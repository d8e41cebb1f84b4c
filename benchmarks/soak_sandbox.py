"""Soak test of the kernel pool: many acquire/execute/release cycles, then look for leaks.

    python benchmarks/soak_sandbox.py                   # after `bash scripts/setup.sh`
    python -m benchmarks.soak_sandbox                   # from the repo root, without installing
    python benchmarks/soak_sandbox.py --cycles 200      # a shorter run

Each cycle acquires a sandbox from one `KernelPool`, runs a small cell that calls the `apis`
bridge a few times and allocates a little memory, checks the output, and releases the sandbox
(which destroys it: the pool keeps starting fresh kernels the whole time). Before the soak, a
short soak of the same shape (2 x pool size cycles) runs and closes, so that one-time set-up
(the isolation probe, zmq, long-lived launcher threads) is not counted as a leak. Afterwards
the pool is closed, the host settles, and the script reports:

- leaked processes: descendants of this process before vs after; processes anywhere on the
  machine that run under this host's sandbox uids or name its sandbox directories (a kernel
  that escaped its parent); the machine's process count (informational: other work counts);
- leftover cgroups under the sandbox cgroup namespace and leftover directories under the
  sandbox root, both named after this process;
- leaked file descriptors and threads of this process, before vs after;
- host RSS growth from the end of the warm-up (cycle `--warmup`) to the last cycle;
- cycles per second and every cycle that failed.

One PASS/FAIL line per target; the exit status is 1 if any target fails. The rate is bounded by
how fast kernels start (0.6-0.8 CPU-seconds each, start and teardown), not by the pool size:
on 2 cores, 1,000 cycles take about 7-8 minutes.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from sandbox import ApiError, KernelPool, Sandbox, isolation_report, probe
from sandbox.kernel import default_root
from sandbox.process import allocate_uid

MIB = 1024 * 1024
CELL = """\
_replies = [apis.soak.echo(i=i, pad="x" * 100) for i in range(5)]
_blob = bytearray(2 * 1024 * 1024)
print(sum(r["i"] for r in _replies), len(_blob))
"""
EXPECTED = "10 2097152\n"


def soak_handler(app: str, api: str, kwargs: dict[str, Any]) -> Any:
    """The bridge handler of the soak: `soak.echo` returns its arguments."""
    if (app, api) != ("soak", "echo"):
        raise ApiError(f"unknown api {app}.{api}", status=404)
    return kwargs


@dataclass(frozen=True)
class HostState:
    """What this process and the machine hold at one moment."""

    descendants: int
    machine_processes: int
    fds: int
    threads: int
    rss: int

    @classmethod
    def now(cls) -> HostState:
        """Snapshot this process (descendants, fds, threads, RSS) and the machine."""
        me = psutil.Process()
        return cls(
            descendants=len(me.children(recursive=True)),
            machine_processes=len(psutil.pids()),
            fds=sum(1 for _ in Path("/proc/self/fd").iterdir()),
            threads=me.num_threads(),
            rss=me.memory_info().rss,
        )


def open_fds() -> dict[str, str]:
    """This process's file descriptors and what each points to."""
    found = {}
    for entry in Path("/proc/self/fd").iterdir():
        try:
            found[entry.name] = os.readlink(entry)
        except OSError:  # the fd of the directory listing itself, closed by now
            continue
    return found


def thread_names() -> list[str]:
    """Names of this process's Python threads."""
    return [thread.name for thread in threading.enumerate()]


def orphaned_kernel_processes() -> list[str]:
    """Live processes anywhere that run under this host's sandbox uids or in its directories."""
    first_uid = allocate_uid(0)
    own_dirs = f"{default_root()}/{os.getpid()}-"
    found = []
    for proc in psutil.process_iter(["pid", "uids", "cmdline", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        uid = info["uids"].real if info["uids"] else -1
        cmdline = " ".join(info["cmdline"] or [])
        if first_uid <= uid < first_uid + 1024 or own_dirs in cmdline:
            found.append(f"pid {info['pid']} uid {uid}: {cmdline[:80]}")
    return found


def leftover_cgroups() -> list[Path]:
    """Sandbox cgroup directories named after this process that still exist."""
    root = probe().cgroups
    if root is None:
        return []
    return [path for base in root.bases.values() for path in base.glob(f"{os.getpid()}-*")]


def leftover_directories() -> list[Path]:
    """Sandbox directories of this process still under the sandbox root."""
    return sorted(default_root().glob(f"{os.getpid()}-*"))


def live_sandbox_objects() -> int:
    """`Sandbox` objects still reachable in this process (after a collection)."""
    gc.collect()
    return sum(1 for obj in gc.get_objects() if isinstance(obj, Sandbox))


def run_cycle(pool: KernelPool, acquire_timeout_s: float) -> str | None:
    """One acquire/execute/release; None if it went right, else what went wrong."""
    sb = pool.acquire(handler=soak_handler, timeout=acquire_timeout_s)
    try:
        result = sb.execute(CELL)
    finally:
        pool.release(sb)
    if result.error is not None or result.timed_out or result.crashed:
        return f"{result.error} (timed_out={result.timed_out}, crashed={result.crashed})"
    if result.output != EXPECTED:
        return f"unexpected output {result.output[:200]!r}"
    return None


def print_table(rows: list[tuple[str, str, str]]) -> None:
    """Three left/right/right-aligned columns under a header."""
    rows = [("measurement", "before / warm", "after / end"), *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    for i, (name, before, after) in enumerate(rows):
        print(f"{name.ljust(widths[0])}  {before.rjust(widths[1])}  {after.rjust(widths[2])}")
        if i == 0:
            print("  ".join("-" * w for w in widths))


def main() -> int:
    """Parse options, soak, report; the exit status says whether every target held."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cycles", type=int, default=1000, help="acquire/execute/release cycles")
    parser.add_argument("--pool-size", type=int, default=4, help="warm kernels the pool keeps")
    parser.add_argument("--max-starting", type=int, default=2, help="concurrent cold starts")
    parser.add_argument("--warmup", type=int, default=50, help="cycles before the RSS baseline")
    parser.add_argument("--settle-s", type=float, default=2.0, help="wait after closing the pool")
    parser.add_argument("--max-rss-growth", type=float, default=0.10, help="RSS growth target")
    parser.add_argument("--report-every", type=int, default=100, help="progress line interval")
    args = parser.parse_args()
    if args.cycles <= args.warmup:
        parser.error(f"--cycles ({args.cycles}) must exceed --warmup ({args.warmup})")

    # 0. a short soak of the same shape first, so one-time set-up is part of the baseline, not
    # of the leak: the isolation probe, zmq, and the sandbox's long-lived launcher threads
    # (each holds an asyncio loop: 3 fds), which grow with concurrent starts up to their cap
    with KernelPool(size=args.pool_size, max_starting=args.max_starting) as warm_pool:
        for _ in range(2 * args.pool_size):
            run_cycle(warm_pool, acquire_timeout_s=120)
    gc.collect()
    missing = isolation_report()["missing"]
    print(f"isolation: {'complete' if not missing else 'DEGRADED: ' + '; '.join(missing)}")
    before, fds_before, threads_before = HostState.now(), open_fds(), thread_names()
    print(
        f"soak: {args.cycles} cycles, pool size {args.pool_size}, max_starting "
        f"{args.max_starting}, pid {os.getpid()}, sandbox root {default_root()}",
        flush=True,
    )

    # 1. the soak
    failures: list[tuple[int, str]] = []
    warm = end = before
    start = time.monotonic()
    warm_t = start
    pool = KernelPool(size=args.pool_size, max_starting=args.max_starting)
    try:
        for cycle in range(1, args.cycles + 1):
            try:
                problem = run_cycle(pool, acquire_timeout_s=120)
            except Exception as exc:  # a failed cycle is counted, the soak goes on
                problem = f"{type(exc).__name__}: {exc}"
            if problem is not None:
                failures.append((cycle, problem))
            if cycle == args.warmup:
                warm, warm_t = HostState.now(), time.monotonic()
            if cycle % args.report_every == 0 or cycle == args.cycles:
                state = HostState.now()
                elapsed = time.monotonic() - start
                print(
                    f"  cycle {cycle:5d}  {elapsed:6.1f} s  {cycle / elapsed:5.2f} cycles/s  "
                    f"rss {state.rss / MIB:6.1f} MiB  fds {state.fds:4d}  "
                    f"threads {state.threads:3d}  children {state.descendants:3d}  "
                    f"failed {len(failures)}",
                    flush=True,
                )
        end = HostState.now()
    finally:
        elapsed = time.monotonic() - start
        stats = dict(pool.stats)
        pool.close()

    # 2. settle, then look for what is left
    time.sleep(args.settle_s)
    gc.collect()
    after, fds_after, threads_after = HostState.now(), open_fds(), thread_names()
    orphans = orphaned_kernel_processes()
    cgroups, directories = leftover_cgroups(), leftover_directories()
    live_objects = live_sandbox_objects()
    rss_growth = (end.rss - warm.rss) / warm.rss
    steady_rate = (args.cycles - args.warmup) / max(1e-9, start + elapsed - warm_t)

    # 3. report
    print(
        f"\nSoak summary ({args.cycles} cycles in {elapsed:.1f} s: {args.cycles / elapsed:.2f} "
        f"cycles/s overall, {steady_rate:.2f} after warm-up; pool stats {stats})"
    )
    print_table(
        [
            (
                "descendant processes (before / after close)",
                str(before.descendants),
                str(after.descendants),
            ),
            (
                "machine processes (before / after; informational)",
                str(before.machine_processes),
                str(after.machine_processes),
            ),
            ("orphaned kernel processes (after)", "-", str(len(orphans))),
            (
                "leftover cgroups / sandbox directories (after)",
                "-",
                f"{len(cgroups)} / {len(directories)}",
            ),
            ("Sandbox objects alive (after)", "-", str(live_objects)),
            ("open fds (before / after close)", str(before.fds), str(after.fds)),
            ("open fds (cycle warm-up / last cycle, pool open)", str(warm.fds), str(end.fds)),
            ("threads (before / after close)", str(before.threads), str(after.threads)),
            (
                f"host RSS MiB (cycle {args.warmup} / last cycle)",
                f"{warm.rss / MIB:.1f}",
                f"{end.rss / MIB:.1f}",
            ),
            (
                "host RSS MiB (before / after close)",
                f"{before.rss / MIB:.1f}",
                f"{after.rss / MIB:.1f}",
            ),
            ("failed cycles", "-", str(len(failures))),
        ]
    )
    for cycle, problem in failures[:20]:
        print(f"  failed cycle {cycle}: {problem}")
    for line in orphans[:10]:
        print(f"  orphan: {line}")
    for path in [*cgroups, *directories][:10]:
        print(f"  leftover: {path}")
    for fd, target in sorted(fds_after.items()):
        if fds_before.get(fd) != target:
            print(f"  new fd {fd} -> {target}")
    for name in sorted(set(threads_after) - set(threads_before)):
        print(f"  new thread {name}")

    leaked_procs = after.descendants - before.descendants
    targets = [
        (
            "no leaked processes",
            leaked_procs <= 0 and not orphans,
            f"{leaked_procs:+d} descendants, {len(orphans)} orphaned kernel processes",
        ),
        (
            "no leftover cgroups or sandbox directories",
            not cgroups and not directories,
            f"{len(cgroups)} cgroups, {len(directories)} directories",
        ),
        ("no leaked file descriptors", after.fds <= before.fds, f"{after.fds - before.fds:+d} fds"),
        (
            f"host RSS growth < {args.max_rss_growth:.0%}",
            rss_growth < args.max_rss_growth,
            f"{rss_growth:+.1%} from cycle {args.warmup} to cycle {args.cycles}",
        ),
        ("no failed cycles", not failures, f"{len(failures)} of {args.cycles} failed"),
    ]
    print()
    for name, ok, detail in targets:
        print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}")
    return 0 if all(ok for _, ok, _ in targets) else 1


if __name__ == "__main__":
    sys.exit(main())
