"""Two real processes under torchrun: ranks 1.. wait for rank 0's rollouts as long as they take,
while a stuck collective of the learners still fails after its short timeout.

Rank 0 alone evaluates and collects an iteration's rollouts (minutes to hours) while the other
learners wait for them; an nccl collective would be killed by its watchdog after 10 minutes.
`distributed.wait_for_main` waits in a separate gloo group with its own long timeout
(`train.rollout_wait_timeout_s`); the learners' own group keeps `train.collective_timeout_s`.
Here the collective timeout is 3 s and rank 0 takes 6 s.

Run: python -m pytest tests/loop/test_distributed_waits.py -q        (`slow`: about 30 s)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COLLECTIVE_S, RANK0_WORK_S = 3, 6

RANK = """
import json, os, sys, time
from loop.model import distributed
out, collective_s, work_s = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
assert distributed.init_from_env(collective_timeout_s=collective_s, wait_timeout_s=120)
rank, result = distributed.rank(), {}
if rank == 0:
    time.sleep(work_s)  # rank 0 alone collects rollouts
start = time.monotonic()
got = distributed.wait_for_main({"samples": 7} if rank == 0 else None)
result["waited"] = [got, time.monotonic() - start]
if rank == 0:
    time.sleep(work_s)  # now a learners' collective that rank 0 does not join in time
start = time.monotonic()
try:
    distributed.all_sum([1.0])
    result["stuck"] = ["returned", time.monotonic() - start]
except Exception as exc:
    result["stuck"] = ["failed", time.monotonic() - start, type(exc).__name__]
json.dump(result, open(os.path.join(out, f"rank{rank}.json"), "w"))
os._exit(0)
"""


@pytest.mark.slow
def test_a_long_wait_for_rank_0_passes_and_a_stuck_collective_fails_fast(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        str(script), str(tmp_path), str(COLLECTIVE_S), str(RANK0_WORK_S),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    rank1 = json.loads((tmp_path / "rank1.json").read_text())
    got, waited = rank1["waited"]
    assert got == {"samples": 7} and waited >= RANK0_WORK_S - 1  # longer than the timeout
    outcome, seconds = rank1["stuck"][:2]
    assert outcome == "failed" and seconds < RANK0_WORK_S - 1, rank1["stuck"]
