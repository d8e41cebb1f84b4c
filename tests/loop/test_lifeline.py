"""`Lifeline`: processes a process started die with it, even when it is SIGKILLed.

Run: python -m pytest tests/loop/test_lifeline.py -q      (a few seconds)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PARENT = """
import json, os, signal, subprocess, sys, time
from loop.generators.vllm.lifeline import Lifeline, child_pids
before = child_pids()
# a child with a grandchild (as vLLM's engine core and its worker), both ignoring SIGTERM
tree = "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
tree += "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
tree += "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); time.sleep(600)"
subprocess.Popen([sys.executable, "-c", tree])
time.sleep(1.0)
started = child_pids() - before
lifeline = Lifeline(started)
grandchildren = set().union(*(child_pids(pid) for pid in started))
print(json.dumps(sorted(started | grandchildren)), flush=True)
if sys.argv[1] == "release":
    lifeline.release()
    print(json.dumps(sorted(child_pids())), flush=True)
    for pid in started | grandchildren:
        os.kill(pid, signal.SIGKILL)
    sys.exit(0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_sigkilled_process_takes_what_it_started_with_it() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PARENT, "die"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == -9, done.stderr
    tree = json.loads(done.stdout.splitlines()[0])
    assert len(tree) == 2  # the child and the grandchild
    deadline = time.monotonic() + 10
    while any(running(pid) for pid in tree) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [pid for pid in tree if running(pid)]


def test_release_stands_the_watcher_down() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", PARENT, "release"], env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    tree, children_after = (json.loads(line) for line in done.stdout.splitlines()[:2])
    assert set(children_after) <= set(tree)  # the watcher is gone, only the tree was left
