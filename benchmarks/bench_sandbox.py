"""How fast and how big the sandbox is, each figure beside the same work done in-process.

    python benchmarks/bench_sandbox.py                  # after `bash scripts/setup.sh`
    python -m benchmarks.bench_sandbox                  # from the repo root, without installing
    python benchmarks/bench_sandbox.py --quick          # fewer repetitions, about half a minute

What it measures (all in one run, so the ratios compare like with like on a noisy machine):
- cold start: `Sandbox()` construction until the kernel answers (N=10), beside a fresh dict
  namespace plus a first `exec`, and beside a plain jupyter_client kernel (no isolation);
- warm acquire: `pool.acquire()` while `pool.idle > 0` (N=50), beside making a fresh namespace;
- execute round trip p50/p95 of the trivial cell `1` (N=300 after warm-up), beside
  `exec(compile("1", ...), ns)` timed over many iterations, and beside a plain jupyter_client
  kernel running the same cell;
- bridge call: `apis.bench.echo(x=1)` timed per call inside the kernel (1000 calls in one cell),
  and a one-call cell's round trip minus the trivial cell's, beside calling the handler directly;
- memory per warm kernel: PSS (and USS, RSS) summed over every process in each of 8 warm
  sandboxes' cgroups, the cgroup's own charge, and how many such kernels fit in 24 GiB.

A "bare" figure is a per-call mean over a batch of in-process iterations; its p50/p95 are over
batches. Kernel figures are single calls timed with `time.perf_counter`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from jupyter_client import KernelManager

from sandbox import KernelPool, Limits, Sandbox, isolation_report

GIB = 1024**3
TRIVIAL_CELL = "1"
BRIDGE_CELL = "apis.bench.echo(x=1)['x']"  # displays `1`, like the trivial cell
BRIDGE_LOOP_CELL = """\
import json as _json, time as _time
_lat = []
for _ in range({n}):
    _t0 = _time.perf_counter()
    apis.bench.echo(x=1)
    _lat.append(_time.perf_counter() - _t0)
print(_json.dumps([round(x * 1e6, 3) for x in _lat]))  # microseconds
"""


def echo_handler(app: str, api: str, kwargs: dict[str, Any]) -> Any:
    """The bridge handler under test: returns its arguments."""
    return kwargs


@dataclass
class Row:
    """One line of the timing table (seconds; None where there is no counterpart)."""

    name: str
    sandbox: float
    bare: float | None
    plain: float | None = None


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def bare_per_call(fn: Callable[[], object], iterations: int, batches: int) -> list[float]:
    """Per-call seconds of `fn`, one mean per batch of `iterations` calls."""
    for _ in range(iterations):  # warm-up
        fn()
    out = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        out.append((time.perf_counter() - start) / iterations)
    return out


def bare_exec() -> None:
    """The in-process counterpart of running the cell `1` in a REPL namespace."""
    exec(compile(TRIVIAL_CELL, "<cell>", "exec"), {"__name__": "__main__"})


def checked(sb: Sandbox, code: str, expect: str | None = None) -> float:
    """Run a cell, fail loudly unless it succeeded; its wall time in seconds."""
    start = time.perf_counter()
    result = sb.execute(code)
    elapsed = time.perf_counter() - start
    if result.error is not None or (expect is not None and result.output != expect):
        raise RuntimeError(f"benchmark cell failed: {code!r} -> {result!r}")
    return elapsed


# -- the measurements -----------------------------------------------------------------------


def measure_cold_start(n: int) -> list[float]:
    """Seconds from `Sandbox()` to a kernel that answers, N fresh sandboxes one at a time."""
    times = []
    for _ in range(n):
        start = time.perf_counter()
        sb = Sandbox(handler=echo_handler)
        times.append(time.perf_counter() - start)
        sb.close()
    return times


def measure_warm_acquire(n: int, pool_size: int) -> list[float]:
    """Seconds `pool.acquire()` takes while a warm kernel is idle (released right after)."""
    times = []
    with KernelPool(size=pool_size) as pool:
        for _ in range(n):
            while pool.idle == 0:
                time.sleep(0.01)
            start = time.perf_counter()
            sb = pool.acquire(handler=echo_handler)
            times.append(time.perf_counter() - start)
            pool.release(sb)
    return times


def measure_round_trips(sb: Sandbox, n: int, warmup: int) -> tuple[list[float], list[float]]:
    """Wall seconds of the trivial cell and of a one-bridge-call cell, interleaved."""
    for _ in range(warmup):
        checked(sb, TRIVIAL_CELL, "1\n")
        checked(sb, BRIDGE_CELL, "1\n")
    trivial, bridge = [], []
    for _ in range(n):
        trivial.append(checked(sb, TRIVIAL_CELL, "1\n"))
        bridge.append(checked(sb, BRIDGE_CELL, "1\n"))
    return trivial, bridge


def measure_bridge_loop(sb: Sandbox, calls: int) -> list[float]:
    """Per-call seconds of `apis.bench.echo(x=1)` timed inside the kernel."""
    checked(sb, BRIDGE_LOOP_CELL.format(n=50))  # opens the bridge connection
    result = sb.execute(BRIDGE_LOOP_CELL.format(n=calls), timeout=120)
    if result.error is not None:
        raise RuntimeError(f"bridge loop cell failed: {result!r}")
    return [us * 1e-6 for us in json.loads(result.output)]


class PlainKernel:
    """An ipykernel started by jupyter_client with no isolation: the reference point.

    It uses the sandbox's transport (ipc sockets in a private directory), so the two differ by
    the isolation chain, the boot code and the bridge only.
    """

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-plain-kernel-")
        start = time.perf_counter()
        self.manager = KernelManager(
            kernel_name="python3",
            transport="ipc",
            ip=str(Path(self.tmp.name) / "k"),
            connection_file=str(Path(self.tmp.name) / "conn.json"),
        )
        self.manager.start_kernel(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = self.manager.client()
        self.client.start_channels()
        self.client.wait_for_ready(timeout=60)
        self.start_s = time.perf_counter() - start

    def execute(self, code: str) -> float:
        """Wall seconds until the cell's kernel goes idle again."""
        start = time.perf_counter()
        msg_id = self.client.execute(code)
        while True:
            msg = self.client.get_iopub_msg(timeout=30)
            if (
                msg["parent_header"].get("msg_id") == msg_id
                and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"
            ):
                break
        while self.client.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
            pass
        return time.perf_counter() - start

    def close(self) -> None:
        """Stop the kernel and its channels."""
        self.client.stop_channels()
        self.manager.shutdown_kernel(now=True)
        self.tmp.cleanup()


def measure_plain(n_start: int, n_exec: int, warmup: int) -> tuple[list[float], list[float]]:
    """Cold starts and trivial-cell round trips of unconfined jupyter_client kernels."""
    starts, trips = [], []
    for i in range(n_start):
        kernel = PlainKernel()
        starts.append(kernel.start_s)
        if i == n_start - 1:
            for _ in range(warmup):
                kernel.execute(TRIVIAL_CELL)
            trips = [kernel.execute(TRIVIAL_CELL) for _ in range(n_exec)]
        kernel.close()
    return starts, trips


def sandbox_memory(sb: Sandbox) -> dict[str, int]:
    """Bytes of RSS, PSS and USS summed over the sandbox's processes, and its cgroup charge."""
    pids = sb.cgroup.pids() if sb.cgroup is not None else set()
    if not pids:  # no cgroups here: the launcher and its descendants
        root = psutil.Process(sb._kernel.popen.pid)
        pids = {root.pid, *(p.pid for p in root.children(recursive=True))}
    total = {"rss": 0, "pss": 0, "uss": 0, "processes": 0, "cgroup": 0}
    for pid in pids:
        try:
            info = psutil.Process(pid).memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        total["processes"] += 1
        for key in ("rss", "pss", "uss"):
            total[key] += getattr(info, key, 0)
    for directory in sb.cgroup.dirs if sb.cgroup is not None else ():
        for name in ("memory.usage_in_bytes", "memory.current"):
            if (directory / name).exists():
                total["cgroup"] = int((directory / name).read_text())
    return total


def measure_memory(kernels: int) -> dict[str, float]:
    """Per-kernel means over `kernels` warm sandboxes taken from a full pool."""
    with KernelPool(size=kernels) as pool:
        while pool.idle < kernels:
            time.sleep(0.05)
        time.sleep(1.0)  # let the last kernels finish their start-up allocations
        sandboxes = [pool.acquire(handler=echo_handler) for _ in range(kernels)]
        samples = [sandbox_memory(sb) for sb in sandboxes]
        for sb in sandboxes:
            pool.release(sb)
    per = {key: statistics.mean(s[key] for s in samples) for key in samples[0]}
    per["pss_total"] = sum(s["pss"] for s in samples)
    return per


# -- the report -----------------------------------------------------------------------------


def fmt_s(seconds: float | None) -> str:
    """A duration in the unit that suits it."""
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"


def fmt_ratio(num: float, den: float | None) -> str:
    """`num/den` as "123x", or "-" where there is no denominator."""
    if den is None or den <= 0:
        return "-"
    ratio = num / den
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.2f}x"


def print_table(headers: list[str], rows: list[list[str]]) -> None:
    """A plain-text table, first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    line = "  ".join("-" * w for w in widths)

    def render(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        return "  ".join([first] + [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)])

    print(render(headers))
    print(line)
    for row in rows:
        print(render(row))


def main() -> None:
    """Parse options, run every measurement, print the tables."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cold-starts", type=int, default=10, help="sandboxes started cold")
    parser.add_argument("--acquires", type=int, default=50, help="warm acquires timed")
    parser.add_argument("--pool-size", type=int, default=2, help="pool size for warm acquire")
    parser.add_argument("--round-trips", type=int, default=300, help="cells timed per kind")
    parser.add_argument("--warmup", type=int, default=20, help="untimed cells first")
    parser.add_argument("--bridge-calls", type=int, default=1000, help="calls in the loop cell")
    parser.add_argument("--memory-kernels", type=int, default=8, help="warm kernels measured")
    parser.add_argument("--budget-gib", type=float, default=24.0, help="memory to fit kernels in")
    parser.add_argument(
        "--no-plain",
        action="store_true",
        help="skip the unconfined jupyter_client reference kernel",
    )
    parser.add_argument("--quick", action="store_true", help="a few repetitions of each")
    args = parser.parse_args()
    if args.quick:
        args.cold_starts, args.acquires, args.round_trips, args.warmup = 3, 10, 50, 5
        args.bridge_calls, args.memory_kernels = 200, 4

    print("isolation_report():", json.dumps(isolation_report(), indent=2))  # also probes once
    print(
        f"host: {psutil.cpu_count()} cpus, {psutil.virtual_memory().total / GIB:.1f} GiB, "
        f"python sandbox from {Path(__import__('sandbox').__file__).parent}"
    )

    # Bare in-process counterparts: per-call means over batches.
    bare_exec_s = bare_per_call(bare_exec, iterations=1000, batches=200)
    bare_ns_s = bare_per_call(lambda: {"__name__": "__main__"}, iterations=10_000, batches=200)
    bare_call_s = bare_per_call(lambda: echo_handler("bench", "echo", {"x": 1}), 10_000, 200)

    print(f"\n[1/5] cold start x{args.cold_starts} ...", flush=True)
    cold = measure_cold_start(args.cold_starts)
    print(f"[2/5] warm acquire x{args.acquires} ...", flush=True)
    acquire = measure_warm_acquire(args.acquires, args.pool_size)
    print(
        f"[3/5] round trips x{args.round_trips} and bridge loop x{args.bridge_calls} ...",
        flush=True,
    )
    # room for the loop cell's list of latencies (the default cuts output at 20,000 chars)
    with Sandbox(handler=echo_handler, max_output_chars=10_000_000) as sb:
        trivial, bridge = measure_round_trips(sb, args.round_trips, args.warmup)
        in_kernel = measure_bridge_loop(sb, args.bridge_calls)
    plain_start: list[float] = []
    plain_trip: list[float] = []
    if not args.no_plain:
        print("[4/5] plain jupyter_client reference kernel ...", flush=True)
        plain_start, plain_trip = measure_plain(args.cold_starts, args.round_trips, args.warmup)
    print(f"[5/5] memory of {args.memory_kernels} warm kernels ...", flush=True)
    memory = measure_memory(args.memory_kernels)

    def p(values: list[float], q: float) -> float | None:
        return pct(values, q) if values else None

    one_call = [b - t for t, b in zip(trivial, bridge, strict=True)]  # paired differences
    rows = [
        Row(
            "cold start p50 (Sandbox() to ready)",
            pct(cold, 50),
            pct(bare_exec_s, 50) + pct(bare_ns_s, 50),
            p(plain_start, 50),
        ),
        Row(
            "cold start mean",
            statistics.mean(cold),
            None,
            statistics.mean(plain_start) if plain_start else None,
        ),
        Row("warm acquire p50 (pool.idle > 0)", pct(acquire, 50), pct(bare_ns_s, 50)),
        Row("warm acquire p95", pct(acquire, 95), pct(bare_ns_s, 95)),
        Row(
            "execute round trip p50, cell `1`",
            pct(trivial, 50),
            pct(bare_exec_s, 50),
            p(plain_trip, 50),
        ),
        Row(
            "execute round trip p95, cell `1`",
            pct(trivial, 95),
            pct(bare_exec_s, 95),
            p(plain_trip, 95),
        ),
        Row("bridge call p50, timed in kernel", pct(in_kernel, 50), pct(bare_call_s, 50)),
        Row("bridge call p95, timed in kernel", pct(in_kernel, 95), pct(bare_call_s, 95)),
        Row(
            "bridge cell p50 - trivial cell p50",
            pct(bridge, 50) - pct(trivial, 50),
            pct(bare_call_s, 50),
        ),
        Row("bridge cell - trivial cell, paired p50", pct(one_call, 50), pct(bare_call_s, 50)),
    ]
    headers = ["measurement", "sandbox", "bare in-process", "ratio", "plain jupyter", "ratio"]
    table = [
        [
            r.name,
            fmt_s(r.sandbox),
            fmt_s(r.bare),
            fmt_ratio(r.sandbox, r.bare),
            fmt_s(r.plain),
            fmt_ratio(r.sandbox, r.plain),
        ]
        for r in rows
    ]
    print("\nTimings (same run; bare = per-call mean over batches of in-process calls)")
    print(
        "  bare for cold start: a fresh namespace dict + exec(compile('1')); for acquire: a "
        "fresh namespace dict;\n  for the bridge: echo_handler(...) called directly. "
        "plain jupyter = unconfined ipykernel via jupyter_client."
    )
    print_table(headers, table)

    mib = 1024 * 1024
    budget = args.budget_gib * GIB
    cap = Limits().memory_mb * mib
    mem_rows = [
        [
            "PSS per kernel (shared pages split)",
            f"{memory['pss'] / mib:.1f} MiB",
            f"{int(budget // memory['pss'])}",
        ],
        [
            "USS per kernel (private pages only)",
            f"{memory['uss'] / mib:.1f} MiB",
            f"{int(budget // memory['uss'])}",
        ],
        [
            "RSS per kernel (shared pages counted again)",
            f"{memory['rss'] / mib:.1f} MiB",
            f"{int(budget // memory['rss'])}",
        ],
        [
            "cgroup charge per kernel (incl. page cache)",
            f"{memory['cgroup'] / mib:.1f} MiB",
            f"{int(budget // memory['cgroup'])}" if memory["cgroup"] else "-",
        ],
        [
            "memory cap per sandbox (Limits.memory_mb, worst case)",
            f"{cap / mib:.0f} MiB",
            f"{int(budget // cap)}",
        ],
    ]
    print(
        f"\nMemory of one warm kernel (mean over {args.memory_kernels}; "
        f"{memory['processes']:.0f} processes each; PSS total {memory['pss_total'] / mib:.0f} "
        f"MiB)"
    )
    print_table(["figure", "per kernel", f"kernels in {args.budget_gib:g} GiB"], mem_rows)
    fits = int(budget // memory["pss"])
    print(
        f"\n=> about {fits} concurrent warm kernels fit in {args.budget_gib:g} GiB "
        f"(PSS {memory['pss'] / mib:.1f} MiB per kernel, idle; each may grow to its "
        f"memory cap while running)"
    )
    print(
        f"   cold start {fmt_s(pct(cold, 50))}, round trip {fmt_s(pct(trivial, 50))} p50, "
        f"bridge call {fmt_s(pct(in_kernel, 50))} p50 in kernel"
    )


if __name__ == "__main__":
    main()
