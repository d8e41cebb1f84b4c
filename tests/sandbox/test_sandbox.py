"""What agent code sees in a sandbox: notebook semantics, the `apis` bridge, limits, lifecycle.

Run: python -m pytest tests/sandbox/test_sandbox.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import sandbox.kernel as kernel_module
import sandbox.process as process_module
from sandbox import (
    KernelPool,
    Limits,
    Sandbox,
    SandboxIsolationError,
    isolation_report,
    probe,
)
from sandbox.reaper import reap_stale
from tests.sandbox.conftest import EchoWorld, processes_of, wait_until

# -- notebook semantics ---------------------------------------------------------------------


def test_variables_imports_and_functions_persist(sb: Sandbox) -> None:
    sb.execute("import math\nradius = 2")
    sb.execute("def area(r):\n    return math.pi * r ** 2")
    assert sb.execute("round(area(radius), 3)").output == "12.566\n"


def test_output_shows_streams_then_the_trailing_repr(sb: Sandbox) -> None:
    code = "import sys\nprint('out')\nprint('err', file=sys.stderr)\n{'a': [1, 2]}"
    result = sb.execute(code)
    assert result.output == "out\nerr\n{'a': [1, 2]}\n"
    assert result.error is None and not result.timed_out and not result.crashed
    assert result.duration_s > 0


def test_stdout_and_stderr_keep_the_order_they_were_written(sb: Sandbox) -> None:
    code = "import sys\nfor i in range(20):\n    print(i, file=sys.stderr if i % 3 else sys.stdout)"
    assert sb.execute(code).output == "".join(f"{i}\n" for i in range(20))


def test_statement_without_value_shows_nothing(sb: Sandbox) -> None:
    assert sb.execute("x = 1").output == ""
    assert sb.execute("x = 1;").output == ""


def test_traceback_is_readable_and_shows_only_agent_code(sb: Sandbox) -> None:
    code = "def fetch(i):\n    return apis.store.missing(item=i)\nfetch(3)"
    result = sb.execute(code)
    assert result.error == "ApiError: 404: no such thing: {'item': 3}"
    assert "fetch(3)" in result.output and "return apis.store.missing(item=i)" in result.output
    for internal in ("boot.py", "_loop_", "_Channel", "ipykernel", "site-packages"):
        assert internal not in result.output, internal


def test_syntax_error_is_reported(sb: Sandbox) -> None:
    result = sb.execute("def broken(:\n    pass")
    assert result.error is not None and result.error.startswith("SyntaxError")
    assert "broken" in result.output


def test_output_limit_is_configurable(pool: KernelPool) -> None:
    with Sandbox(max_output_chars=50, strict=True) as sb:
        result = sb.execute("print('a' * 80)")
        assert result.output.startswith("a" * 50 + "\n[output truncated: 31 more characters")


# -- the apis bridge ------------------------------------------------------------------------


def test_api_call_returns_the_handler_result(sb: Sandbox, world: EchoWorld) -> None:
    result = sb.execute("r = apis.phone.echo(name='Ann', tags=['x'], n=None)\nr")
    assert (
        result.output == "{'app': 'phone', 'kwargs': {'name': 'Ann', 'tags': ['x'], 'n': None}}\n"
    )
    assert world.calls == [("phone", "echo", {"name": "Ann", "tags": ["x"], "n": None})]
    assert sb.api_calls == 1


def test_api_error_can_be_caught_with_status_and_message(sb: Sandbox) -> None:
    code = (
        "try:\n    apis.phone.missing(id=7)\nexcept ApiError as e:\n"
        "    print(e.status, '|', e.message)"
    )
    assert sb.execute(code).output == "404 | no such thing: {'id': 7}\n"


def test_apis_take_keyword_arguments_only(sb: Sandbox, world: EchoWorld) -> None:
    result = sb.execute("apis.phone.echo('Ann')")
    assert result.error is not None and "keyword arguments only" in result.error
    assert world.calls == []


def test_arguments_must_be_json(sb: Sandbox) -> None:
    result = sb.execute("apis.phone.echo(when=object())")
    assert result.error is not None and "JSON" in result.error


def test_handler_bug_is_recorded_and_shown_as_internal_error(sb: Sandbox) -> None:
    result = sb.execute("apis.phone.crash()")
    assert result.error == "ApiError: 500: internal error in the API server"
    assert sb.handler_errors == ["phone.crash: RuntimeError: handler bug"]


def test_large_results_cross_the_bridge(sb: Sandbox) -> None:
    assert sb.execute("len(apis.files.big(n=3_000_000))").output == "3000000\n"


def test_handler_can_be_replaced(sb: Sandbox) -> None:
    sb.set_handler(lambda app, api, kwargs: f"v2:{app}.{api}")
    assert sb.execute("apis.a.b()").output == "'v2:a.b'\n"


def test_api_calls_from_threads_in_the_kernel_are_serialised(sb: Sandbox) -> None:
    code = (
        "import threading\nresults = []\n"
        "def work(i):\n    results.append(apis.calc.echo(i=i)['kwargs']['i'])\n"
        "ts = [threading.Thread(target=work, args=(i,)) for i in range(20)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\nsorted(results) == list(range(20))"
    )
    assert sb.execute(code).output == "True\n"


# -- limits and lifecycle -------------------------------------------------------------------


def test_default_timeout_comes_from_the_constructor() -> None:
    with Sandbox(timeout_s=0.5, strict=True) as sb:
        result = sb.execute("import time\ntime.sleep(3)")
        assert result.timed_out and result.duration_s < 3
        assert result.error == "TimeoutError: cell exceeded its 0.5 s limit"


def test_execute_async_runs_sandboxes_concurrently(pool: KernelPool) -> None:
    boxes = [pool.acquire(timeout=60) for _ in range(3)]

    async def run_all() -> list[float]:
        results = await asyncio.gather(
            *(b.execute_async("import time\ntime.sleep(1)\n'done'") for b in boxes)
        )
        assert all(r.output == "'done'\n" for r in results)
        return [r.duration_s for r in results]

    try:
        start = time.monotonic()
        asyncio.run(run_all())
        assert time.monotonic() - start < 2.5, "cells ran one after another"
    finally:
        for b in boxes:
            pool.release(b)


def test_close_kills_the_kernel_and_removes_its_files() -> None:
    sb = Sandbox(strict=True)
    directory, cgroup = sb.directory, sb.cgroup
    assert directory.is_dir() and cgroup is not None and cgroup.pids()
    sb.close()
    sb.close()  # idempotent
    assert not directory.exists()
    assert not any(d.exists() for d in cgroup.dirs)
    with pytest.raises(RuntimeError, match="closed Sandbox"):
        sb.execute("1")


def test_a_kernel_started_from_a_short_lived_thread_outlives_it() -> None:
    box: list[Sandbox] = []
    thread = threading.Thread(target=lambda: box.append(Sandbox(strict=True)))
    thread.start()
    thread.join()
    time.sleep(0.5)
    with box[0] as sb:
        assert sb.alive()
        assert sb.execute("'fine'").output == "'fine'\n"


def test_a_kernel_ends_with_its_host_even_where_bwrap_cannot_see_it_die(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host killed between a kernel's fork and bwrap's prctl leaves --die-with-parent unset;
    the kernel's pipe to the host still reads end-of-file then, and the whole chain ends. Here
    the write end is closed with the host alive, which bwrap cannot notice at all."""
    read_end, write_end = os.pipe()
    monkeypatch.setattr(process_module, "_lifeline", (os.getpid(), read_end, write_end))
    sb = Sandbox(strict=True)
    monkeypatch.undo()  # later sandboxes get the real lifeline
    try:
        assert sb.execute("'up'").output == "'up'\n"
        os.close(write_end)
        assert wait_until(lambda: sb._kernel.popen.poll() is not None), "bwrap outlived its host"
        assert wait_until(lambda: not processes_of(sb.uid)), "kernel outlived its host"
    finally:
        sb.close()
        os.close(read_end)


def test_a_kernel_that_died_while_idle_is_replaced_and_the_loss_is_said(sb: Sandbox) -> None:
    sb.execute("x = 1")
    sb._kernel.popen.kill()
    sb._kernel.popen.wait()
    result = sb.execute("'again'")
    assert result.output.startswith("'again'\n")
    assert (
        "killed by signal SIGKILL" in result.output
        and "earlier variables are gone" in result.output
    )
    assert sb.restarts == 1


def test_strict_mode_refuses_to_run_without_every_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    weak = dataclasses.replace(probe(), bwrap=None)
    monkeypatch.setattr(kernel_module, "probe", lambda: weak)
    with pytest.raises(SandboxIsolationError, match="bubblewrap"):
        Sandbox(strict=True)


def test_bad_limits_are_one_line_errors() -> None:
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=0)
    with pytest.raises(ValueError, match="max_processes must be >= 16"):
        Limits(max_processes=4)
    with pytest.raises(ValueError, match="disk_mb must be a positive integer"):
        Limits(disk_mb=0)
    with pytest.raises(ValueError, match="max_files must be >= 64"):
        Limits(max_files=10)
    with pytest.raises(ValueError, match="timeout_s"):
        Sandbox(timeout_s=0)


def test_this_machine_isolates_fully() -> None:
    """CI must run the adversarial suite with every layer, not a degraded sandbox."""
    report = isolation_report()
    assert report["missing"] == [], report["missing"]
    assert report["bwrap"] and report["cgroups"] and report["separate_uid"]


def test_sandboxes_of_a_killed_host_are_reaped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = (
        "import sys, time\nfrom sandbox import Sandbox\n"
        "sb = Sandbox(root_dir=sys.argv[1], strict=True)\n"
        "print(sb.directory, sb.uid, *sb.cgroup.dirs, flush=True)\ntime.sleep(120)"
    )
    host = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], stdout=subprocess.PIPE, text=True
    )
    assert host.stdout is not None
    directory, uid, *cgroup_dirs = host.stdout.readline().split()
    host.kill()  # no atexit, no cleanup: what a crash or the OOM killer leaves behind
    host.wait()
    assert Path(directory).is_dir() and all(Path(d).is_dir() for d in cgroup_dirs)
    assert wait_until(lambda: not processes_of(int(uid))), "kernel outlived its host"
    assert reap_stale(root) == 1
    assert not Path(directory).exists()
    assert not any(Path(d).exists() for d in cgroup_dirs)
    assert reap_stale(root) == 0  # once per root per process, and idempotent anyway


def test_a_kernel_that_dies_while_interrupted_is_both_timed_out_and_crashed(sb: Sandbox) -> None:
    code = "import os, time\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    os._exit(7)"
    result = sb.execute(code, timeout=1)
    assert result.timed_out and result.crashed
    assert result.error == "KernelDied: the kernel exited with status 7"
    after = sb.execute("'next'")
    assert after.output.startswith("'next'\n") and "earlier variables are gone" in after.output


def test_bridge_records_survive_a_kernel_restart(sb: Sandbox, world: EchoWorld) -> None:
    sb.execute("apis.phone.crash()")
    assert sb.execute("import os\nos._exit(1)").crashed
    result = sb.execute("apis.phone.echo(after='restart')['kwargs']")
    assert result.output.startswith("{'after': 'restart'}"), result  # the new kernel reaches it
    assert sb.handler_errors == ["phone.crash: RuntimeError: handler bug"]  # still on record
    assert sb.api_calls == 2 and len(world.calls) == 2
