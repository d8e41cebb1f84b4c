"""One LOOP iteration of the quickstart over the wire: `python -m tasks.openenv serve` in its own
process serves the built-in world, and train.py trains on it as `suite: openenv`.

Run: python -m pytest tests/test_train_openenv.py       (slow: a few minutes on 2 cores)

The server runs as users run it (a process, stopped with SIGTERM, which destroys its
sandboxes); the run is the short quickstart of tests/test_train_cli.py with the suite swapped.
A bad argument to the server is a one-line error.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from tasks.apptown.suite import APPTOWN_SPLITS
from tests.test_train_cli import QUICKSTART, SHORT, run

pytest.importorskip("openenv", reason="the openenv extra: pip install -e .[test] brings it")
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def server() -> Iterator[str]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tasks.openenv", "serve", "--suite", "apptown", "--split",
         "easy", "--port", str(port), "--pool-size", "4", "--cell-timeout", "10"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the server did not come up"
        try:
            if httpx.get(f"{url}/health").status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    yield url
    kernels = psutil.Process(process.pid).children(recursive=True)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err[-2000:]
    _, alive = psutil.wait_procs(kernels, timeout=30)
    assert alive == []  # every sandbox destroyed on exit


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_one_loop_iteration_of_the_quickstart_over_the_wire(server: str, tmp_path: Path) -> None:
    done = run(
        "train.py", "--config", str(QUICKSTART), f"output_dir={tmp_path}", *SHORT,
        "suite=openenv", f"openenv.url={server}", "eval.split=easy", "train.stress_test=false",
        "sandbox.pool_size=0",  # the server runs the cells: no kernels on this side
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = [
        json.loads(line)
        for line in (tmp_path / "quickstart" / "metrics.jsonl").read_text().splitlines()
    ]
    assert record["rollout/count"] == 4 and record["rollout/infra_failures"] == 0, record
    assert record["learn/optimizer_steps"] == 4, record
    assert httpx.get(f"{server}/loop/status").json()["sandboxes_leased"] == 0


def test_a_bad_server_argument_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tasks.openenv", "serve", "--split", "nope", "--port", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    splits = ", ".join(APPTOWN_SPLITS)
    assert done.stderr.strip().splitlines() == [
        f"error: unknown split 'nope'; the splits are {splits}"
    ]
