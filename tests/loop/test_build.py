"""What `loop.build` sets up around the parts: the process's open-file limit.

python -m pytest tests/loop/test_build.py -q        (a few seconds)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("build", ["build_evaluation", "build_training"])
def test_build_raises_the_soft_open_file_limit_to_the_hard_one(build: str) -> None:
    """A soft `ulimit -n` below the hard one (a node's usual 1,024) would fail sandbox starts
    with EMFILE in a large run; both builds raise it before anything starts."""
    script = textwrap.dedent(f"""
        import contextlib, resource
        import loop.build as build
        from loop.config import RunConfig

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        low = min(256, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

        class Stop(Exception):
            pass

        def stop(config):  # the suite is built next: nothing more is needed
            raise Stop

        build.build_suite = stop
        with contextlib.suppress(Stop):
            parts = build.{build}(RunConfig())
            if hasattr(parts, "__enter__"):
                parts.__enter__()
        print(low, *resource.getrlimit(resource.RLIMIT_NOFILE))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    low, soft, hard = map(int, out.stdout.split())
    if low == hard:
        pytest.skip(f"this machine's hard open-file limit is {hard}: nothing to raise")
    assert soft == hard, f"soft open-file limit {soft} left below the hard {hard}"
