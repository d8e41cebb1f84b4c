"""Hostile agent code, one property per test: each snippet must be contained.

"Contained" means: the host process and other sandboxes keep working promptly (the `canary`),
the result reports what happened (timed_out / crashed / an error), nothing outside the sandbox
is read or changed, and nothing the snippet started outlives the sandbox.

Run: python -m pytest tests/sandbox/test_adversarial.py     (needs root, bubblewrap, cgroups)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from sandbox import KernelPool, Limits, Sandbox
from tests.sandbox.conftest import (
    HOST_SECRET,
    EchoWorld,
    assert_healthy,
    processes_of,
    wait_until,
)

PROJECT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


# -- time and CPU ---------------------------------------------------------------------------


def test_infinite_loop_is_interrupted_and_state_kept(sb: Sandbox, canary: Sandbox) -> None:
    sb.execute("kept = 'yes'")
    result = sb.execute("while True: pass", timeout=1)
    assert result.timed_out and not result.crashed
    assert "time limit" in result.output
    assert sb.execute("kept").output == "'yes'\n"  # interrupted, not restarted
    assert sb.restarts == 0
    assert_healthy(canary)


def test_loop_that_ignores_sigint_is_killed_and_replaced(sb: Sandbox, canary: Sandbox) -> None:
    code = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass"
    result = sb.execute(code, timeout=1)
    assert result.timed_out
    assert "restarted" in result.output
    assert sb.restarts == 1
    assert sb.execute("40 + 2").output == "42\n"
    assert_healthy(canary)


def test_loop_that_swallows_keyboard_interrupt_is_killed_and_replaced(sb: Sandbox) -> None:
    code = "import time\nwhile True:\n    try: time.sleep(100)\n    except KeyboardInterrupt: pass"
    result = sb.execute(code, timeout=1)
    assert result.timed_out and "restarted" in result.output
    assert sb.restarts == 1
    assert sb.execute("'ok'").output == "'ok'\n"


def test_cpu_seconds_are_capped_per_process(canary: Sandbox) -> None:
    with Sandbox(timeout_s=60, limits=Limits(cpu_time_s=2), strict=True) as sb:
        result = sb.execute("while True: pass", timeout=30)
        assert result.crashed, result
        assert "SIGXCPU" in result.output or "SIGKILL" in result.output
        assert result.duration_s < 20
    assert_healthy(canary)


def test_signal_alarm_kills_only_the_kernel(sb: Sandbox, canary: Sandbox) -> None:
    result = sb.execute("import signal, time\nsignal.alarm(1)\ntime.sleep(5)", timeout=10)
    assert result.crashed and "SIGALRM" in result.output
    assert sb.execute("1 + 1").output.startswith("2\n")
    assert_healthy(canary)


# -- processes ------------------------------------------------------------------------------


def test_fork_bomb_is_capped_by_the_process_limit(pool: KernelPool, canary: Sandbox) -> None:
    sb = pool.acquire(timeout=60)
    uid, cgroup = sb.uid, sb.cgroup
    assert cgroup is not None
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = sb.execute(code, timeout=3)
    assert result.timed_out or result.crashed
    peak = cgroup.peak_processes()
    assert peak is not None and peak <= sb.limits.max_processes, peak
    assert_healthy(canary)
    pool.release(sb)
    assert wait_until(lambda: not processes_of(uid)), "fork bomb processes outlived the sandbox"


def test_background_process_does_not_outlive_the_sandbox(pool: KernelPool) -> None:
    sb = pool.acquire(timeout=60)
    uid = sb.uid
    sb.execute("import subprocess\np = subprocess.Popen(['sleep', '1000'], start_new_session=True)")
    assert any("sleep" in p.name() for p in processes_of(uid))
    pool.release(sb)
    assert wait_until(lambda: not processes_of(uid)), processes_of(uid)


def test_threads_that_outlive_their_cell_do_not_block_later_cells(
    pool: KernelPool, canary: Sandbox
) -> None:
    sb = pool.acquire(timeout=60)
    uid = sb.uid
    code = (
        "import threading, time\n"
        "def spin():\n    while True: time.sleep(0.001)\n"
        "for _ in range(8): threading.Thread(target=spin, daemon=True).start()"
    )
    assert sb.execute(code).error is None
    result = sb.execute("sum(range(100))", timeout=5)
    assert result.output.endswith("4950\n") and not result.timed_out
    assert_healthy(canary)
    pool.release(sb)
    assert wait_until(lambda: not processes_of(uid))


def test_killing_the_parent_does_not_reach_the_host(sb: Sandbox, canary: Sandbox) -> None:
    result = sb.execute("import os\nos.getppid(), os.kill(os.getppid(), 9)")
    assert "(1, None)" in result.output or "PermissionError" in result.output, result
    assert_healthy(canary)


def test_kill_every_process_reaches_only_the_sandbox(sb: Sandbox, canary: Sandbox) -> None:
    sb.execute("import subprocess\nchild = subprocess.Popen(['sleep', '100'])")
    result = sb.execute("import os\nos.kill(-1, 9)\nchild.wait()", timeout=5)
    assert result.output.strip().endswith("-9"), result  # its own child, killed
    assert_healthy(canary)
    assert sb.execute("'back'").output == "'back'\n"


def test_host_processes_are_invisible(sb: Sandbox) -> None:
    pids = json.loads(
        sb.execute(
            "import os, json\nprint(json.dumps([int(p) for p in os.listdir('/proc') "
            "if p.isdigit()]))"
        ).output
    )
    assert os.getpid() not in pids or max(pids) < 50, pids
    assert len(pids) < 20, f"sees {len(pids)} processes"


def test_os_system_runs_inside_the_sandbox_only(sb: Sandbox, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    sb.execute(f"import os\nos.system('touch {target}; id > {target}')")
    assert not target.exists()


def test_subprocess_cannot_read_project_files(sb: Sandbox) -> None:
    code = (
        "import subprocess\n"
        f"r = subprocess.run(['cat', '{PROJECT / 'pyproject.toml'}'], capture_output=True)\n"
        "r.returncode, r.stdout[:20]"
    )
    result = sb.execute(code)
    assert result.output.startswith("(1, b'')"), result


# -- memory, files, output ------------------------------------------------------------------


def test_single_huge_allocation_is_a_memory_error(sb: Sandbox) -> None:
    result = sb.execute("x = bytearray(64 * 2**30)")
    assert result.error is not None and result.error.startswith("MemoryError")
    assert not result.crashed
    assert sb.execute("'alive'").output == "'alive'\n"


def test_growing_memory_bomb_is_stopped(sb: Sandbox, canary: Sandbox) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 2**20))"
    result = sb.execute(code, timeout=20)
    assert result.crashed or (result.error or "").startswith("MemoryError"), result
    assert_healthy(canary)


def test_memory_spread_over_processes_is_capped_by_the_cgroup(canary: Sandbox) -> None:
    limits = Limits(memory_mb=1024)
    with Sandbox(timeout_s=30, limits=limits, strict=True) as sb:
        assert sb.cgroup is not None
        code = (
            "import os, time\n"
            "for _ in range(6):\n"
            "    if os.fork() == 0:\n"
            "        b = bytearray(700 * 2**20)\n"
            "        b[::4096] = b'x' * len(b[::4096])\n"
            "        time.sleep(30)\n"
            "        os._exit(0)\n"
            "time.sleep(3)\n"
            "print('parent alive')"
        )
        sb.execute(code, timeout=20)
        resident = _cgroup_memory_bytes(sb.cgroup.dirs)
        assert resident <= limits.memory_mb * 2**20, resident
    assert_healthy(canary)


def test_huge_output_is_truncated_with_a_notice(sb: Sandbox) -> None:
    result = sb.execute("print('x' * 50_000_000)", timeout=30)
    assert len(result.output) < sb.max_output_chars + 200
    assert "output truncated" in result.output
    assert not result.timed_out


def test_endless_output_flood_times_out_with_bounded_output(sb: Sandbox) -> None:
    result = sb.execute("while True: print('y' * 10_000)", timeout=2)
    assert result.timed_out
    assert len(result.output) < sb.max_output_chars + 300


def test_binary_and_control_output_is_made_printable(sb: Sandbox) -> None:
    code = (
        "import sys\nprint(bytes(range(256)).decode('latin1'))\n"
        "sys.stdout.write('\\x1b[2J\\x1b[31mred\\x00\\x07end\\n')"
    )
    output = sb.execute(code).output
    assert "red" in output and "end" in output
    assert not any(ord(ch) < 32 and ch not in "\n\t" for ch in output), repr(output)
    assert "\x1b" not in output


def test_too_many_open_files_is_an_error(sb: Sandbox) -> None:
    code = "files = [open(f'/tmp/f{i}', 'w') for i in range(100_000)]"
    result = sb.execute(code)
    assert result.error is not None and "Too many open files" in result.error


def test_huge_file_write_is_capped(sb: Sandbox) -> None:
    code = "with open('big.bin', 'wb') as f:\n    f.write(b'0' * (200 * 2**20))"
    result = sb.execute(code)
    assert result.error is not None or result.crashed, result
    assert "File too large" in result.output or "SIGXFSZ" in result.output, result


def test_private_tmp_is_size_capped(sb: Sandbox) -> None:
    code = (
        "for i in range(4):\n"
        "    with open(f'/tmp/fill{i}', 'wb') as f:\n"
        "        f.write(b'0' * (30 * 2**20))"
    )
    result = sb.execute(code)
    assert result.error is not None and "No space left" in result.error, result


def test_scratch_space_is_capped_in_bytes_and_files(canary: Sandbox) -> None:
    with Sandbox(limits=Limits(disk_mb=8, max_files=100), strict=True) as sb:
        big = sb.execute("open('big.bin', 'wb').write(b'0' * (20 * 2**20))")
        assert big.error is not None and "No space left" in big.error, big
        many = sb.execute("for i in range(1000): open(f'f{i}', 'w').close()")
        assert many.error is not None and "No space left" in many.error, many
        assert shutil.disk_usage(sb.directory).total <= 8 * 2**20  # the host sees the cap
        assert sb.execute("import os\nos._exit(1)").crashed
        assert sb.execute("'alive'").output.startswith("'alive'\n")  # restarts when full
    assert_healthy(canary)


# -- files ----------------------------------------------------------------------------------


def test_host_etc_passwd_is_not_readable(sb: Sandbox) -> None:
    inside = sb.execute("print(open('/etc/passwd').read())").output
    host_users = {line.split(":")[0] for line in Path("/etc/passwd").read_text().splitlines()}
    seen = {line.split(":")[0] for line in inside.splitlines() if ":" in line}
    assert seen <= {"root", "agent"}, seen
    assert host_users - {"root"} - seen, "host accounts leaked"


def test_project_files_are_not_readable(sb: Sandbox) -> None:
    result = sb.execute(f"open({str(PROJECT / 'README.md')!r}).read()")
    assert result.error is not None and "No such file" in result.error


def test_run_directory_is_not_readable(sb: Sandbox) -> None:
    with tempfile.TemporaryDirectory(dir=str(PROJECT)) as run_dir:
        secret = Path(run_dir) / "metrics.jsonl"
        secret.write_text("ground truth")
        result = sb.execute(f"open({str(secret)!r}).read()")
        assert "ground truth" not in result.output and result.error is not None


def test_other_sandboxes_are_not_readable(pool: KernelPool, sb: Sandbox) -> None:
    other = pool.acquire(timeout=60)
    try:
        other.execute("open('secret.txt', 'w').write('other sandbox secret')")
        target = other.directory / "home" / "secret.txt"
        assert target.read_text() == "other sandbox secret"
        result = sb.execute(f"open({str(target)!r}).read()")
        assert "other sandbox secret" not in result.output and result.error is not None
        listing = sb.execute(f"import os; os.listdir({str(other.directory.parent)!r})")
        assert other.directory.name not in listing.output
    finally:
        pool.release(other)


def test_writing_to_the_real_home_fails(sb: Sandbox) -> None:
    host_home = Path.home()
    before = sorted(p.name for p in host_home.iterdir())
    result = sb.execute(f"open({str(host_home / 'pwned')!r}, 'w').write('x')")
    assert result.error is not None
    assert sorted(p.name for p in host_home.iterdir()) == before


def test_home_inside_is_the_private_scratch_directory(sb: Sandbox) -> None:
    sb.execute("import os\nopen(os.path.expanduser('~/notes.txt'), 'w').write('mine')")
    assert (sb.directory / "home" / "notes.txt").read_text() == "mine"
    assert not (Path.home() / "notes.txt").exists()


def test_tmp_is_private(sb: Sandbox) -> None:
    marker = f"loop-sandbox-marker-{os.getpid()}"
    result = sb.execute(f"open('/tmp/{marker}', 'w').write('x')")
    assert result.error is None
    assert not (Path(tempfile.gettempdir()) / marker).exists()


def test_system_directories_are_read_only(sb: Sandbox) -> None:
    result = sb.execute("open('/usr/lib/pwned', 'w')")
    assert result.error is not None and "Read-only file system" in result.error


def test_our_packages_are_not_importable(sb: Sandbox) -> None:
    for name in ("sandbox", "tasks", "loop"):
        result = sb.execute(f"import {name}")
        assert result.error is not None and "ModuleNotFoundError" in result.error, name


def test_host_environment_is_not_inherited(
    pool: KernelPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOOP_TEST_API_KEY", "sk-secret")
    with Sandbox(timeout_s=10, strict=True) as sb:
        result = sb.execute("import os\nsorted(os.environ)")
        assert "LOOP_TEST_API_KEY" not in result.output
        assert "sk-secret" not in sb.execute("import os\nstr(dict(os.environ))").output


# -- network --------------------------------------------------------------------------------


def test_internet_is_unreachable(sb: Sandbox) -> None:
    code = "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)"
    result = sb.execute(code)
    assert result.error is not None and "unreachable" in result.error.lower(), result


def test_host_loopback_server_is_unreachable(sb: Sandbox) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    try:
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)"
        result = sb.execute(code)
        assert result.error is not None and "ConnectionRefused" in result.error, result
    finally:
        server.close()


def test_raw_socket_module_is_contained(sb: Sandbox) -> None:
    code = (
        "import _socket\ns = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)\n"
        "s.settimeout(3)\ns.connect(('8.8.8.8', 53))"
    )
    result = sb.execute(code)
    assert result.error is not None and "unreachable" in result.error.lower(), result


def test_packet_sockets_are_not_permitted(sb: Sandbox) -> None:
    result = sb.execute("import socket\nsocket.socket(socket.AF_PACKET, socket.SOCK_RAW)")
    assert result.error is not None and "PermissionError" in result.error, result


def test_host_abstract_unix_socket_is_unreachable(sb: Sandbox) -> None:
    name = f"\0loop-test-{os.getpid()}"
    server = socket.socket(socket.AF_UNIX)
    server.bind(name)
    server.listen(1)
    try:
        code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({name!r})"
        result = sb.execute(code)
        assert result.error is not None and "ConnectionRefused" in result.error, result
    finally:
        server.close()


# -- the interpreter ------------------------------------------------------------------------


def test_segfault_through_ctypes_is_a_crash_and_recovers(sb: Sandbox, canary: Sandbox) -> None:
    result = sb.execute("import ctypes\nctypes.string_at(0)")
    assert result.crashed and "SIGSEGV" in result.output
    after = sb.execute("'recovered'")
    assert after.output.startswith("'recovered'") and "new kernel" in after.output
    assert_healthy(canary)


def test_ctypes_cannot_become_root(sb: Sandbox) -> None:
    result = sb.execute("import ctypes, os\nctypes.CDLL(None).setuid(0), os.getuid()")
    assert result.output.startswith("(-1, "), result


def test_os_exit_is_a_crash_and_recovers(sb: Sandbox) -> None:
    result = sb.execute("import os\nos._exit(3)")
    assert result.crashed and "status 3" in result.output
    assert sb.execute("1").output.startswith("1\n")


def test_sys_exit_does_not_end_the_kernel(sb: Sandbox) -> None:
    sb.execute("kept = 5")
    result = sb.execute("import sys\nsys.exit(1)")
    assert not result.crashed and "SystemExit" in result.output
    assert sb.execute("kept").output == "5\n"


def test_deep_recursion_is_an_error_not_a_hang(sb: Sandbox) -> None:
    result = sb.execute("def f(n): return f(n + 1)\nf(0)", timeout=10)
    assert result.error is not None and "RecursionError" in result.error
    assert not result.crashed


def test_unbounded_recursion_limit_crash_is_contained(sb: Sandbox, canary: Sandbox) -> None:
    code = "import sys\nsys.setrecursionlimit(10**8)\ndef f(n): return f(n + 1)\nf(0)"
    result = sb.execute(code, timeout=20)
    assert result.crashed or result.error is not None
    assert sb.execute("2").output.startswith("2\n")
    assert_healthy(canary)


def test_input_fails_fast_instead_of_hanging(sb: Sandbox) -> None:
    result = sb.execute("input('password: ')", timeout=5)
    assert not result.timed_out and result.error is not None
    assert "StdinNotImplementedError" in result.error


# -- the bridge -----------------------------------------------------------------------------


def test_kernel_memory_holds_no_handler_state(sb: Sandbox, world: EchoWorld) -> None:
    sb.execute("apis.phone.echo(x=1)")
    half = len(HOST_SECRET) // 2  # the cell's own text must not contain the secret
    code = (  # every string reachable from the user namespace and all modules
        f"import sys\nneedle = {HOST_SECRET[:half]!r} + {HOST_SECRET[half:]!r}\n"
        "seen, stack, hits = set(), [get_ipython().user_ns, sys.modules], 0\n"
        "while stack:\n"
        "    o = stack.pop()\n"
        "    if id(o) in seen: continue\n"
        "    seen.add(id(o))\n"
        "    if isinstance(o, str):\n"
        "        hits += needle in o and o is not needle\n"
        "    elif isinstance(o, dict): stack += [*o.keys(), *o.values()]\n"
        "    elif isinstance(o, (list, tuple, set, frozenset)): stack += list(o)\n"
        "    elif isinstance(getattr(o, '__dict__', None), dict): stack.append(o.__dict__)\n"
        "hits"
    )
    assert sb.execute(code).output == "0\n"
    assert world.calls == [("phone", "echo", {"x": 1})]
    sb.execute("leaked = apis.phone.leak()")  # positive control: the search does find a leak
    assert sb.execute(code).output != "0\n"


def test_private_names_never_reach_the_handler(sb: Sandbox, world: EchoWorld) -> None:
    for attempt in ("apis._private", "apis.phone._x()", "apis.phone.__secret__()"):
        result = sb.execute(attempt)
        assert result.error is not None and "AttributeError" in result.error, attempt
    forged = sb.execute("apis._channel.call('phone', '__init__', {})")
    assert forged.error is not None and "400" in forged.error, forged
    assert world.calls == []


def test_forged_and_garbage_bridge_requests_get_errors(sb: Sandbox, world: EchoWorld) -> None:
    sock_path = sb.directory / "chan" / "bridge.sock"
    code = (
        "import socket, json\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(sock_path)!r})\n"
        "f = s.makefile('rb')\n"
        "replies = []\n"
        "for line in [b'not json', b'[1,2]', "
        "json.dumps({'id': 1, 'app': '__class__', 'api': 'x', 'kwargs': {}}).encode(), "
        "json.dumps({'id': 2, 'app': 'os', 'api': '_exit', 'kwargs': {}}).encode(), "
        "json.dumps({'id': 3, 'app': 'a', 'api': 'b', 'kwargs': []}).encode()]:\n"
        "    s.sendall(line + b'\\n')\n"
        "    replies.append(json.loads(f.readline())['status'])\n"
        "replies"
    )
    assert sb.execute(code).output == "[400, 400, 400, 400, 400]\n"
    assert world.calls == []
    assert sb.execute("apis.a.echo(k='v')['kwargs']").output == "{'k': 'v'}\n"


def test_oversized_bridge_request_is_refused(sb: Sandbox, world: EchoWorld) -> None:
    code = "apis.a.echo(blob='x' * (4 * 2**20))"
    result = sb.execute(code, timeout=20)
    assert result.error is not None
    assert "too large" in result.error, result
    assert world.calls == []
    assert sb.execute("apis.a.echo(k=1)['kwargs']").output == "{'k': 1}\n"


def test_bridge_flood_from_threads_does_not_wedge_the_host(sb: Sandbox, canary: Sandbox) -> None:
    code = (
        "import threading\n"
        "def hammer():\n    for _ in range(300): apis.a.echo(i=1)\n"
        "ts = [threading.Thread(target=hammer) for _ in range(8)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "'done'"
    )
    result = sb.execute(code, timeout=60)
    assert result.output.endswith("'done'\n"), result
    assert_healthy(canary)


def test_host_keeps_serving_while_a_sandbox_misbehaves(pool: KernelPool, canary: Sandbox) -> None:
    bad = pool.acquire(timeout=60)
    errors: list[BaseException] = []

    def misbehave() -> None:
        try:
            bad.execute(
                "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass", timeout=4
            )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    thread = threading.Thread(target=misbehave)
    thread.start()
    try:
        for _ in range(5):
            assert_healthy(canary)
    finally:
        thread.join()
        pool.release(bad)
    assert not errors


def _cgroup_memory_bytes(dirs: tuple[Path, ...]) -> int:
    for directory in dirs:
        for name in ("memory.usage_in_bytes", "memory.current"):
            if (directory / name).exists():
                return int((directory / name).read_text())
    raise AssertionError(f"no memory accounting in {dirs}")


def test_subprocess_network_is_contained_too(sb: Sandbox) -> None:
    code = (
        "import subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-c', \"import socket; "
        "socket.create_connection(('1.1.1.1', 80), timeout=3)\"], capture_output=True, text=True)\n"
        "print(r.returncode, r.stderr.strip().splitlines()[-1])"
    )
    output = sb.execute(code, timeout=20).output
    assert output.startswith("1 ") and "unreachable" in output.lower(), output
