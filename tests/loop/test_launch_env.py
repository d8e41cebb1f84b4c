"""The inference engine's processes start without the launcher's variables, and why it matters.

Under torchrun, a process that rank 0 starts inherits `TORCHELASTIC_USE_AGENT_STORE=True` and
the rest; when it then rendezvouses over `tcp://` (as vLLM's workers do on GPUs), torch makes it
a client of the launcher's agent store, which serves nobody at that address, and it waits until
its timeout. `launcher_free` gives the environment without them, which a started vLLM server
gets (loop/generators/vllm/process.py). The slow test reproduces the hang on CPU with gloo under
a real torchrun and shows the fix.

Run: python -m pytest tests/loop/test_launch_env.py -q     (the torchrun test is `slow`)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from loop.generators.vllm.launch_env import is_launcher_variable, launcher_free

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = {  # what torchrun --nproc-per-node 2 gives rank 1, plus the learners' own tuning
    "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": "1", "ROLE_NAME": "default",
    "ROLE_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RUN_ID": "x",
    "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
    "TORCHELASTIC_ERROR_FILE": "/tmp/e.json", "TORCH_ELASTIC_X": "1",
    "ACCELERATE_MIXED_PRECISION": "no", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
}  # fmt: skip


def test_the_launchers_variables_are_removed_and_the_rest_kept() -> None:
    env = {**TORCHRUN_ENV, "PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "1"}
    clean = launcher_free(env, devices=[4, 5, 6, 7])
    assert all(is_launcher_variable(name) for name in TORCHRUN_ENV)
    kept = {"PATH": "/usr/bin", "HOME": "/root", "OMP_NUM_THREADS": "1"}
    assert clean == {**kept, "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert launcher_free(env)["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"  # no list: as seen


def test_devices_are_indices_among_the_inherited_visible_gpus() -> None:
    """A job given CUDA_VISIBLE_DEVICES=2,3,6,7: devices [2, 3] are its third and fourth GPUs,
    physical 6 and 7 (the learners' LOCAL_RANKs index the same list)."""
    env = {"CUDA_VISIBLE_DEVICES": "2,3,6,7"}
    assert launcher_free(env, devices=[2, 3])["CUDA_VISIBLE_DEVICES"] == "6,7"
    assert launcher_free({}, devices=[2, 3])["CUDA_VISIBLE_DEVICES"] == "2,3"  # all visible
    uuids = {"CUDA_VISIBLE_DEVICES": "GPU-a, GPU-b"}
    assert launcher_free(uuids, devices=[1])["CUDA_VISIBLE_DEVICES"] == "GPU-b"
    with pytest.raises(ValueError, match="GPU 4 is not among the 4 this process sees"):
        launcher_free(env, devices=[3, 4])


RENDEZVOUS = """
import datetime, sys, time, torch.distributed as dist
start = time.monotonic()
try:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{sys.argv[1]}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=float(sys.argv[2])))
    print("joined", round(time.monotonic() - start, 1))
except Exception as exc:
    print("failed", round(time.monotonic() - start, 1), type(exc).__name__)
"""

UNDER_TORCHRUN = """
import json, os, socket, subprocess, sys
from loop.generators.vllm.launch_env import launcher_free
def child(env):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    args = [sys.executable, "-c", sys.argv[2], str(port), sys.argv[3]]
    return subprocess.run(args, env=env, capture_output=True, text=True, timeout=120).stdout.split()
inherited = child(dict(os.environ))
clean = child(launcher_free(os.environ))
json.dump({"inherited": inherited, "clean": clean}, open(sys.argv[1], "w"))
"""


@pytest.mark.slow
def test_under_torchrun_a_started_process_joins_its_own_rendezvous_only_when_clean(
    tmp_path: Path,
) -> None:
    script, out = tmp_path / "rank.py", tmp_path / "out.json"
    script.write_text(UNDER_TORCHRUN)
    timeout_s = "8"  # the child's rendezvous timeout (vLLM's is much longer: a hang)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        str(script), str(out), RENDEZVOUS, timeout_s,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["inherited"][0] == "failed", result  # the launcher's store: no one answers
    assert float(result["inherited"][1]) >= float(timeout_s) - 1
    assert result["clean"][0] == "joined" and float(result["clean"][1]) < 5, result
