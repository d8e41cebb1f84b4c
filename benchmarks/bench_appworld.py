"""The AppWorld suite next to the built-in world, from one run: cold start, task reset, execute,
evaluate, and memory per engine process.

Run: python benchmarks/bench_appworld.py                 (about 2-3 min on 2 cores)
     python benchmarks/bench_appworld.py --root DIR      (an existing AppWorld root)

Without --root it builds the small self-made root in a temporary directory (the AppWorld venv
must exist: bash scripts/setup_appworld.sh). What each column times:
- AppWorld: one confined engine process (tasks/appworld/), agent code runs in AppWorld's REPL;
- AppTown: the built-in world in the host, agent code in one sandbox kernel (the bridge).
Both go through the same `Environment` calls (`reset`, `step`, `evaluate`) a rollout makes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox import Sandbox
from tasks.apptown import AppTownSuite
from tasks.appworld import AppWorldSuite, build_small_root
from tasks.appworld.engine import EngineProcess

ROUNDS = 3  # episodes per task


def p50(samples: list[float]) -> float:
    return statistics.median(samples)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def tree_memory(pid: int) -> tuple[float, float]:
    """RSS and PSS in MiB of a process and its descendants (the confinement chain included)."""
    root = psutil.Process(pid)
    rss = pss = 0.0
    for proc in [root, *root.children(recursive=True)]:
        info = proc.memory_full_info()
        rss, pss = rss + info.rss, pss + info.pss
    return rss / 2**20, pss / 2**20


def episodes(
    tasks: list[Any],
    solve: Callable[[Any], list[str]],
    make: Callable[[Any], Any],
    grade: Callable[[Any], Any],
) -> dict[str, list[float]]:
    """Per task: reset, a trivial cell, an API-call cell, the gold cells, the grader on the
    final state (`grade(env)`), then `env.evaluate()` as a rollout calls it."""
    out: dict[str, list[float]] = {k: [] for k in ("reset", "first", "cell", "api", "grade")}
    out["eval"] = []
    for _ in range(ROUNDS):
        for task in tasks:
            env = make(task)
            out["reset"].append(timed(env.reset))
            out["first"].append(timed(lambda e=env: e.step("x = 1")))  # AppWorld opens here
            for _ in range(5):
                out["cell"].append(timed(lambda e=env: e.step("print(x)")))
                out["api"].append(timed(lambda e=env: e.step("apis.supervisor.show_profile()")))
            for cell in solve(task):
                env.step(cell)
            out["grade"].append(timed(lambda e=env: grade(e)))
            out["eval"].append(timed(env.evaluate))  # AppWorld graded in the final step
    return out


def bench_appworld(root: Path) -> dict[str, Any]:
    suite = AppWorldSuite(root, pool_size=1, timeout_s=30)
    manifest = root / "small_root.json"  # gold solutions; an official root has none: no-ops
    solutions = json.loads(manifest.read_text()) if manifest.is_file() else {}
    cold = [EngineProcess.start(suite.engine_spec) for _ in range(2)]
    plain = [EngineProcess.start(_no_warmup(suite.engine_spec)) for _ in range(2)]
    result: dict[str, Any] = {
        "cold": p50([e.start_s for e in cold]),
        "cold_plain": p50([e.start_s for e in plain]),
    }
    first_open = []
    for engine in plain:  # the first task a process opens pays the imports the warm-up pays
        request = {"op": "initialize", "task_id": suite.tasks("train")[0].id, "timeout_s": 30}
        first_open.append(timed(lambda e=engine, r=request: e.request(
            {**r, "max_output_chars": 1000}, 300)))  # fmt: skip
    result["first_open"] = p50(first_open)
    result["memory_ready"] = tree_memory(cold[0].pid)
    for engine in cold + plain:
        engine.kill()
    tasks = [t for t in suite.tasks("train") + suite.tasks("dev")][:8]
    gold = lambda t: solutions.get(t.id, {}).get("gold", [])  # noqa: E731
    grader = lambda env: env.engine.request({"op": "evaluate"}, 300)  # noqa: E731
    result.update(episodes(tasks, gold, suite.make_env, grader))
    engine = suite.pool.engines()[0]
    result["memory_after"] = tree_memory(engine.pid)
    result["tasks_after"] = engine.tasks_started
    suite.close()
    return result


def bench_apptown() -> dict[str, Any]:
    start = time.perf_counter()
    suite = AppTownSuite()
    result: dict[str, Any] = {"suite_build": time.perf_counter() - start}
    starts = []
    for _ in range(2):
        start = time.perf_counter()
        with Sandbox(timeout_s=30) as sandbox:
            starts.append(time.perf_counter() - start)
    result["cold"] = p50(starts)
    tasks = suite.tasks("train")[:6] + suite.tasks("dev")[:2]
    with Sandbox(timeout_s=30) as sandbox:
        result["memory_ready"] = tree_memory(sandbox._kernel.popen.pid)
        make = lambda t: suite.make_env(t, sandbox)  # noqa: E731
        result.update(episodes(tasks, suite.gold_solution, make, lambda env: env.evaluate()))
        result["memory_after"] = tree_memory(sandbox._kernel.popen.pid)
    return result


def _no_warmup(spec: Any) -> Any:
    from dataclasses import replace

    return replace(spec, warmup_task=None)


def report(world: dict[str, Any], town: dict[str, Any]) -> None:
    ms = lambda s: f"{s * 1e3:,.1f} ms"  # noqa: E731
    rows = [
        ("cold start, ready for a task (p50 of 2)", ms(world["cold"]), ms(town["cold"])),
        ("  AppWorld without warm-up / its first task open", f"{ms(world['cold_plain'])} / "
         f"{ms(world['first_open'])}", f"suite build {ms(town['suite_build'])}"),
        ("task reset (env.reset, p50)", ms(p50(world["reset"])), ms(p50(town["reset"]))),
        ("first step (AppWorld opens the task here, p50)", ms(p50(world["first"])),
         ms(p50(town["first"]))),
        ("execute `print(x)` (p50)", ms(p50(world["cell"])), ms(p50(town["cell"]))),
        ("execute one API call (p50)", ms(p50(world["api"])), ms(p50(town["api"]))),
        ("evaluate: the grader on the gold state (p50)", ms(p50(world["grade"])),
         ms(p50(town["grade"]))),
        ("env.evaluate() in a rollout, after gold (p50)", ms(p50(world["eval"])),
         ms(p50(town["eval"]))),
        ("memory, ready: RSS / PSS", "{:.0f} / {:.0f} MiB".format(*world["memory_ready"]),
         "{:.0f} / {:.0f} MiB (kernel)".format(*town["memory_ready"])),
        (f"memory after {world['tasks_after']} tasks: RSS / PSS",
         "{:.0f} / {:.0f} MiB".format(*world["memory_after"]),
         "{:.0f} / {:.0f} MiB (kernel)".format(*town["memory_after"])),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"{'':<{width}}  {'AppWorld (engine process)':>28}  {'AppTown (host + kernel)':>28}")
    for name, a, b in rows:
        print(f"{name:<{width}}  {a:>28}  {b:>28}")
    print(f"episodes timed: {len(world['eval'])} AppWorld, {len(town['eval'])} AppTown")
    print("AppWorld grades in the step that completes the task; env.evaluate() then only closes")
    print("the task and returns the engine to the pool (AppTown grades in evaluate itself).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, help="an AppWorld root (default: build the small one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-appworld-") as scratch:
        root = args.root
        if root is None:
            started = time.perf_counter()
            root = build_small_root(Path(scratch) / "root")
            print(f"small root built in {time.perf_counter() - started:.1f} s")
        world = bench_appworld(root)
        town = bench_apptown()
    report(world, town)


if __name__ == "__main__":
    main()
