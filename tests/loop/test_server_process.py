"""`loop.generators.vllm.process.ServerProcess`: a started server's environment, devices,
failures and life, with a stand-in server process (tests/loop/stub_server.py) that starts in a
blink. vLLM itself is started by tests/loop/test_vllm_server.py.

Run: python -m pytest tests/loop/test_server_process.py -q
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from loop.generators.base import GeneratorError
from loop.generators.vllm.launch_env import is_launcher_variable
from loop.generators.vllm.process import ServerProcess, failure_cause, healthy
from tests.loop.test_launch_env import TORCHRUN_ENV

ROOT = Path(__file__).resolve().parents[2]
STUB = "tests.loop.stub_server"


def stub(tmp_path: Path, *args: str, **kwargs) -> ServerProcess:
    return ServerProcess(
        ["--env-out", str(tmp_path / "env.json"), *args],
        log_path=tmp_path / "server.log", module=STUB, **kwargs,
    )  # fmt: skip


def test_a_server_started_under_torchrun_holds_none_of_the_launchers_variables(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    server = stub(tmp_path, devices=[4, 5], on_gpu=True)
    server.start(timeout_s=30)
    try:
        assert healthy(server.url) and server.url.startswith("http://127.0.0.1:")
        env = json.loads((tmp_path / "env.json").read_text())
        leaked = sorted(n for n in env if is_launcher_variable(n) and n != "CUDA_VISIBLE_DEVICES")
        assert leaked == []
        assert env["CUDA_VISIBLE_DEVICES"] == "4,5"  # its own GPUs, not the learners' 0..7
        assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
        assert int(env["STUB_PGID"]) == server.pid != os.getpgid(0)  # a process group of its own
    finally:
        server.stop()
    assert server.pid is None and not healthy(server.url)


def test_on_cpu_the_server_is_bound_to_its_cores(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    server = stub(tmp_path, devices=[1])
    server.start(timeout_s=30)
    server.stop()
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"


def test_a_failed_start_is_one_line_naming_the_cause_and_the_log(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        server = stub(tmp_path, "--fail-with", "OSError: [Errno 98] Address already in use",
                      port=port)  # fmt: skip
        with pytest.raises(GeneratorError) as caught:
            server.start(timeout_s=30)
    message = str(caught.value)
    assert "\n" not in message and f"port {port} is taken" in message, message
    assert str(tmp_path / "server.log") in message and "exited (1)" in message
    never = stub(tmp_path, "--never-ready")
    started = time.monotonic()
    with pytest.raises(GeneratorError, match=r"not ready after 3 s .*server_start_timeout_s"):
        never.start(timeout_s=3)
    assert time.monotonic() - started < 30 and not never.alive()


@pytest.mark.parametrize(
    ("log", "cause"),
    [
        ("ValueError: torch.OutOfMemoryError: CUDA out of memory. Tried", "out of memory"),
        ("OSError: /models/x does not appear to have a file named config.json", "model is missing"),
        ("huggingface_hub.errors.RepositoryNotFoundError: 404", "model is missing"),
        ("INFO loading\nRuntimeError: Engine core initialization failed\nINFO bye",
         "RuntimeError: Engine core initialization failed"),
        ("ERROR Worker proc VllmWorker-0 died unexpectedly (exit code: -9)", "out of memory?"),
        ("ValueError: Available memory on node 0 (19.35/23.54 GiB) on kv cache allocation is "
         "less than requested memory for kv (-0.28/1.18 GiB).\nRuntimeError: Engine core "
         "initialization failed", "raise generator.gpu_memory_utilization"),
        ("ValueError: No available memory for the cache blocks. Try increasing "
         "`gpu_memory_utilization` when initializing the engine.", "KV cache"),
        ("", "no output"),
    ],
)  # fmt: skip
def test_failure_causes_from_the_log(log: str, cause: str) -> None:
    assert cause in failure_cause(log, port=8000)


def test_a_server_started_by_a_thread_outlives_the_thread(tmp_path: Path, monkeypatch) -> None:
    """A restart runs in a background thread that then ends: the parent-death signal follows
    the creating thread, so the server's lifeline must not take that for the trainer's death."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    server = stub(tmp_path)
    starter = threading.Thread(target=server.start, args=(30,))
    starter.start()
    starter.join()
    time.sleep(2.0)  # the lifeline polls twice a second
    try:
        assert server.alive() and healthy(server.url)
    finally:
        server.stop()


def test_a_killed_trainer_takes_its_server_with_it(tmp_path: Path) -> None:
    """SIGKILL the process that started a server: the server (in its own session, which a
    signal to the trainer's group would miss) ends too."""
    script = (
        "import sys; from pathlib import Path; "
        "from loop.generators.vllm.process import ServerProcess; "
        f"s = ServerProcess([], log_path=Path({str(tmp_path / 'log')!r}), module={STUB!r}); "
        "s.start(30); print(s.pid, flush=True); sys.stdin.read()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    trainer = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
    )
    assert trainer.stdout is not None
    server_pid = int(trainer.stdout.readline())
    os.kill(server_pid, 0)  # running
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and running(server_pid):
        time.sleep(0.2)
    assert not running(server_pid)


def running(pid: int) -> bool:
    """True while `pid` runs (not ended, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_server_dead_at_publication_is_restarted_with_the_new_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server whose process died between iterations does not fail the publication (which
    would stop the run): it leaves routing and comes back serving the version published."""
    import asyncio

    from loop.generators.vllm.server import VLLMServerGenerator

    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", processes=[stub(tmp_path)], start_timeout_s=30
    )
    try:
        server = generator.servers[0]
        old_pid = server.process.pid
        os.killpg(old_pid, signal.SIGKILL)
        (tmp_path / "v1").mkdir()
        generator.load_adapter(tmp_path / "v1")  # no exception: the server was lost, not refusing
        deadline = time.monotonic() + 30
        while server.served != "run-v1" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.served == "run-v1" and generator.restarts == 1
        assert server.process.pid != old_pid and healthy(server.url)
    finally:
        asyncio.run(generator.close())
