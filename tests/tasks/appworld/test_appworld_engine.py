"""The AppWorld environment on the real engine: grading, steps, time limits, confinement, crashes.

Every task of the small root is solved by its gold solution and failed by a no-op and by a
plausible wrong solution, all graded by AppWorld's own evaluator. Engines are real confined
processes from the suite's pool; killing or hanging one must cost only its rollout.
Run: python -m pytest tests/tasks/appworld/test_appworld_engine.py     (slow: real engines)
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import pytest

from sandbox import probe
from tasks import EnvironmentFailureError
from tasks.appworld import AppWorldSuite, EngineCrashError, EngineStartError
from tasks.appworld import engine as engine_module
from tasks.appworld import env as env_module
from tasks.appworld.engine import EngineProcess

pytestmark = pytest.mark.slow


def run(suite: AppWorldSuite, task_id: str, cells: list[str]) -> Any:
    env = suite.make_env(suite.task(task_id), None)
    env.reset()
    for cell in cells:
        env.step(cell)
    return env, env.evaluate()


def worker_of(engine: Any) -> psutil.Process:
    """The Python worker inside an engine's confinement chain (sh, prlimit, bwrap, setpriv)."""
    chain = [psutil.Process(engine.pid), *psutil.Process(engine.pid).children(recursive=True)]
    python = str(engine.spec.python)
    return next(p for p in chain if p.cmdline()[:2] == [python, "-I"])


def test_gold_passes_and_no_op_and_wrong_fail_on_every_task(
    aw_suite: AppWorldSuite, solutions: dict[str, Any]
) -> None:
    assert len(solutions) >= 4

    def check(task_id: str) -> None:
        solution = solutions[task_id]
        _, gold = run(aw_suite, task_id, solution["gold"])
        assert gold.success and gold.reward == 1.0, gold.summary()
        _, no_op = run(aw_suite, task_id, [])
        assert not no_op.success and no_op.reward < 1.0, no_op.summary()
        _, wrong = run(aw_suite, task_id, solution["wrong"])
        assert not wrong.success, wrong.summary()
        failed = [t for t in wrong.tests if not t.passed]
        assert failed and all(t.message for t in failed), wrong.summary()

    with ThreadPoolExecutor(aw_suite.pool_size) as threads:  # one engine per thread
        list(threads.map(check, solutions))


def test_steps_return_appworld_output_and_record_api_calls(aw_suite: AppWorldSuite) -> None:
    env = aw_suite.make_env(aw_suite.task("c0a1b2c_1"), None)
    context = env.reset()
    assert "Dana Whitfield" in context and "2023-05-18" in context
    assert context.endswith("Task: How many of my phone contacts are my coworkers?")
    assert env.engine is None  # the engine opens the task on the first step
    assert env.step("print(1 + 1)").strip() == "2" and env.last_result.error is None
    output = env.step("apis.phone.search_contacts()")
    assert output.startswith("Execution failed.") and "401" in output
    assert env.last_result.error.startswith("Exception: Response status code is 401")
    call = env.api_calls[-1]
    assert (call.app, call.api, call.ok) == ("phone", "search_contacts", False)
    assert "401" in (call.error or "") and call.latency_s > 0
    env.step("apis.supervisor.show_profile()")
    assert env.api_calls[-1].ok and not env.done
    env.step("apis.supervisor.complete_task(answer=3)")
    assert env.done
    report = env.evaluate()
    assert report.success and env.engine is None  # evaluate ended the episode
    with pytest.raises(RuntimeError, match="call reset"):
        env.step("print(1)")
    assert env.evaluate() is report


def test_a_cell_past_the_time_limit_is_stopped_and_the_episode_goes_on(
    aw_suite: AppWorldSuite,
) -> None:
    env = aw_suite.make_env(aw_suite.task("c0a1b2c_1"), None)
    env.reset()
    env.step("x = 41")
    started = time.monotonic()
    output = env.step("while True:\n    pass")
    assert time.monotonic() - started < aw_suite.timeout_s + 10
    assert "timed out after 5 seconds" in output and env.last_result.timed_out
    assert env.step("print(x + 1)").strip() == "42"  # the REPL state survived
    env.close()


def test_engines_run_confined(aw_suite: AppWorldSuite) -> None:
    caps = probe()
    if caps.bwrap is None:
        pytest.skip("bubblewrap is not usable here: engines run unconfined (a logged warning)")
    env = aw_suite.make_env(aw_suite.task("c0a1b2c_1"), None)
    env.reset()
    env.step("x = 1")
    worker = worker_of(env.engine)
    assert os.readlink(f"/proc/{worker.pid}/ns/net") != os.readlink("/proc/self/ns/net")
    assert os.readlink(f"/proc/{worker.pid}/ns/pid") != os.readlink("/proc/self/ns/pid")
    if caps.separate_uid:
        assert worker.uids().real != os.getuid() and worker.uids().real >= 100_000
    env.close()


def test_an_engine_without_bubblewrap_still_works_and_says_what_is_missing(
    aw_suite: AppWorldSuite, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    degraded = dataclasses.replace(probe(), bwrap=None)
    monkeypatch.setattr(engine_module, "probe", lambda: degraded)
    monkeypatch.setattr(engine_module, "_warned_missing", threading.Event())
    engine = EngineProcess.start(dataclasses.replace(aw_suite.engine_spec, warmup_task=None))
    try:
        request = {"op": "initialize", "task_id": "c0a1b2c_1", "timeout_s": 5}
        engine.request({**request, "max_output_chars": 100}, 300)
        assert engine.request({"op": "execute", "code": "print(6 * 7)"}, 60)["output"] == "42\n"
        assert psutil.Process(engine.pid).uids().real == os.getuid()  # no uid of its own
    finally:
        engine.kill()
    assert "bubblewrap" in caplog.text
    with pytest.raises(EngineStartError, match="strict"):
        EngineProcess.start(dataclasses.replace(aw_suite.engine_spec, strict=True))


def test_a_killed_engine_fails_its_rollout_loudly_and_is_replaced(
    aw_suite: AppWorldSuite, solutions: dict[str, Any]
) -> None:
    pool = aw_suite.pool
    crashed_before = pool.stats["crashed"]
    env = aw_suite.make_env(aw_suite.task("c0a1b2d_1"), None)
    env.reset()
    env.step("x = 1")
    victim = env.engine
    assert victim is not None
    os.killpg(victim.pid, signal.SIGKILL)
    with pytest.raises(EngineCrashError, match=r"env_crash.*killed by signal SIGKILL"):
        env.step("print(x)")
    with pytest.raises(EnvironmentFailureError, match="env_crash"):
        env.evaluate()  # never a quiet 0.0
    assert pool.stats["crashed"] == crashed_before + 1
    _, report = run(aw_suite, "c0a1b2d_1", solutions["c0a1b2d_1"]["gold"])
    assert report.success  # the next rollout gets a healthy engine
    assert victim not in pool.engines() and not victim.directory.path.exists()
    deadline = time.monotonic() + 180
    while len(pool.engines()) < aw_suite.pool_size and time.monotonic() < deadline:
        time.sleep(0.5)  # the replacement starts in the background
    assert len(pool.engines()) >= aw_suite.pool_size


def test_an_engine_stuck_in_c_code_is_killed_at_its_deadline(
    aw_suite: AppWorldSuite, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(env_module, "STEP_GRACE_S", 1.0)
    env = aw_suite.make_env(aw_suite.task("c0a1b2c_2"), None)
    env.reset()
    started = time.monotonic()
    with pytest.raises(EngineCrashError, match="no reply to execute in time"):
        env.step("x = sum(range(10**12))")  # one C call: the engine's SIGALRM cannot stop it
    assert time.monotonic() - started < aw_suite.timeout_s + 10


def test_engines_are_recycled_after_max_tasks(aw_suite: AppWorldSuite) -> None:
    pool = aw_suite.pool
    monkey = pytest.MonkeyPatch()
    monkey.setattr(pool, "max_tasks_per_engine", 1)
    try:
        recycled = pool.stats["recycled"]
        first, _ = run(aw_suite, "c0a1b31_1", [])
        assert pool.stats["recycled"] == recycled + 1
    finally:
        monkey.undo()
    assert first.engine is None


def test_engine_directories_hold_outputs_outside_the_data_root(
    aw_suite: AppWorldSuite, small_root: Path
) -> None:
    before = sorted(p.relative_to(small_root) for p in small_root.rglob("*"))
    run(aw_suite, "c0a1b2d_2", [])
    assert sorted(p.relative_to(small_root) for p in small_root.rglob("*")) == before
