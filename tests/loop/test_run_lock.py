"""The run directory's lock: one training run at a time in `runs/<name>/`.

Rank 0 of train.py holds an exclusive flock on `train.lock` for the run's life; a second
train.py on the same directory is refused in one line naming the holder's pid, and a killed
holder's lock is free again at once (the OS drops it). Reading a run (evaluate.py, the
inspector) takes no lock.

Run: python -m pytest tests/loop/test_run_lock.py -q
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from loop.config import load_config
from loop.run.rundir import RunInUseError, lock_run

ROOT = Path(__file__).resolve().parents[2]
HOLD = """
import sys, time
from pathlib import Path
from loop.run.rundir import lock_run
with lock_run(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_lock_on_a_run_directory_is_refused_naming_the_holder(tmp_path: Path) -> None:
    refused = pytest.raises(
        RunInUseError, match=f"in use by another training run .pid {os.getpid()}"
    )
    with lock_run(tmp_path / "run"), refused, lock_run(tmp_path / "run"):
        pass
    with lock_run(tmp_path / "run"):  # released when the block ended
        pass


def test_a_killed_holders_lock_is_free_again(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path / "run")], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(RunInUseError, match=f"pid {holder.pid}"), lock_run(tmp_path / "run"):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with lock_run(tmp_path / "run"):  # the OS dropped the dead holder's lock
        pass


def test_train_py_refuses_a_second_run_on_a_run_directory_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        import train
    finally:
        sys.path.remove(str(ROOT))
    quickstart, overrides = ROOT / "configs" / "quickstart.yaml", [f"output_dir={tmp_path}"]
    run_dir = load_config(quickstart, overrides).run_dir
    with lock_run(run_dir):
        assert train.run(quickstart, overrides) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and f"pid {os.getpid()}" in error and str(run_dir) in error
