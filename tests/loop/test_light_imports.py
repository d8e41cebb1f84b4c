"""A learner-only machine (a GPU node without Jupyter) can import the learner and the config:
neither pulls in the sandbox's kernel stack (jupyter_client, zmq).

Run: python -m pytest tests/loop/test_light_imports.py -q
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import importlib.abc, sys
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("zmq", "jupyter_client"):
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Missing())
import loop.config, loop.learner.learner, loop.learner.prefix
from sandbox import Limits
print("imported")
try:
    from sandbox import KernelPool
except ModuleNotFoundError as exc:
    print("kernel stack:", exc)
"""


def test_the_learner_and_the_config_import_without_the_kernel_stack() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "imported"
    assert lines[1].startswith("kernel stack: No module named")  # the probe did block it
