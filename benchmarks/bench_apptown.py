"""Speed of the AppTown environment: world build, fork/reset of a task's state, API calls through
the sandbox bridge (against a bare bridge that does no work), and evaluation per task.

Run: python benchmarks/bench_apptown.py            (about 20 s; starts one sandbox kernel)
     python benchmarks/bench_apptown.py --no-sandbox   (skips the bridge measurement)

Targets from issue 3: fork/reset < 5 ms; an API call < 1 ms beyond the bare bridge (p50).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tasks.apptown import AppTownSuite, World
from tasks.apptown.inprocess import InProcessApis
from tasks.apptown.server import AppServer
from tasks.core import SPLITS

CALLS = 300  # API calls per bridge measurement


def _ms(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return f"p50 {statistics.median(ordered) * 1e3:.3f} ms, p95 {p95 * 1e3:.3f} ms"


def _time(fn: Callable[[], object], repeat: int) -> list[float]:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def bench_world_and_fork(suite: AppTownSuite) -> None:
    build = _time(lambda: World.build(seed=0), 3)
    print(f"world build (72 people, every app):      {_ms(build)}")
    task = suite.tasks("train")[0]
    state = suite.initial_state(task)
    user = suite.user_of(task).id
    fork = _time(state.fork, 200)
    reset = _time(lambda: AppServer(state.fork(), user, suite.world.now), 200)
    size = len(state.fork().serialize()) / 1e6
    print(f"fork of a task state ({size:.1f} MB SQLite):    {_ms(fork)}   (target < 5 ms)")
    print(f"reset (fork + server):                   {_ms(reset)}")


def bench_evaluation(suite: AppTownSuite) -> None:
    """Grading time on a no-op final state and on the gold solution's final state."""
    noop, after_gold = [], []
    for split in SPLITS:
        for task in suite.tasks(split):
            user = suite.user_of(task).id
            untouched = AppServer(suite.initial_state(task).fork(), user, suite.world.now)
            noop += _time(lambda t=task, db=untouched.ctx.db: suite.grade(t, db, None, False), 1)
            server = AppServer(suite.initial_state(task).fork(), user, suite.world.now)
            namespace = {"apis": InProcessApis(server), "print": lambda *a, **k: None}
            for cell in suite.gold_solution(task):
                exec(cell, namespace)
            ctx = server.ctx
            after_gold += _time(
                lambda t=task, c=ctx: suite.grade(t, c.db, c.answer, c.completed), 1
            )
    print(f"evaluation per task, no-op state ({len(noop)}):   {_ms(noop)}")
    print(f"evaluation per task, after gold ({len(after_gold)}):  {_ms(after_gold)}")


_LOOP = """
import time as _t, json as _j
_lat = []
for _ in range({n}):
    _s = _t.perf_counter(); {call}; _lat.append(_t.perf_counter() - _s)
print(_j.dumps(_lat))
"""


def bench_bridge(suite: AppTownSuite) -> None:
    from sandbox import Sandbox

    task = suite.task("phone_count_relationship_1")
    with Sandbox(timeout_s=60) as sandbox:
        sandbox.set_handler(lambda app, api, kwargs: {"message": "ok"})
        bare = _kernel_latencies(sandbox, "apis.phone.ping()")
        env = suite.make_env(task, sandbox)
        env.reset()
        for cell in suite.gold_solution(task)[:1]:
            env.step(cell)
        profile = _kernel_latencies(sandbox, "apis.supervisor.show_profile()")
        search = _kernel_latencies(sandbox, "apis.phone.search_contacts(page_limit=20)")
    handler = [c.latency_s for c in env.api_calls if c.api == "search_contacts"]
    print(f"bare bridge call (handler does nothing): {_ms(bare)}")
    print(f"supervisor.show_profile via bridge:      {_ms(profile)}")
    print(f"phone.search_contacts(page_limit=20):    {_ms(search)}")
    print(f"  of which in the AppTown handler:       {_ms(handler)}")
    for name, samples in (("show_profile", profile), ("search_contacts", search)):
        extra = (statistics.median(samples) - statistics.median(bare)) * 1e3
        print(f"AppTown cost beyond the bare bridge, {name}: {extra:+.3f} ms p50 (target < 1 ms)")


def _kernel_latencies(sandbox: object, call: str) -> list[float]:
    result = sandbox.execute(_LOOP.format(n=CALLS, call=call))  # type: ignore[attr-defined]
    assert result.error is None, result.output
    return json.loads(result.output.strip().splitlines()[-1])[20:]  # drop warm-up calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-sandbox", action="store_true", help="skip the bridge benchmark")
    args = parser.parse_args()
    start = time.perf_counter()
    suite = AppTownSuite()
    print(
        f"suite build (world + {sum(len(suite.tasks(s)) for s in SPLITS)} tasks): "
        f"{(time.perf_counter() - start) * 1e3:.0f} ms"
    )
    bench_world_and_fork(suite)
    bench_evaluation(suite)
    if not args.no_sandbox:
        bench_bridge(suite)


if __name__ == "__main__":
    main()
