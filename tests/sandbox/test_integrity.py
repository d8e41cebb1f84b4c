"""Agent code must not turn its own doing into a failure of our machinery, one property each.

What agent code causes inside its sandbox (a crash, junk in its channel directory, threads that
outlive their cell, a flood of output) must stay the agent's: the sandbox goes on, the host stays
flat, and the agent reads what happened.

Run: python -m pytest tests/sandbox/test_integrity.py     (needs root, bubblewrap, cgroups)
"""

from __future__ import annotations

import resource
import time

import pytest

from sandbox import Sandbox
from tests.sandbox.conftest import EchoWorld

pytestmark = pytest.mark.slow


def test_directories_left_in_the_channel_dir_do_not_stop_the_next_kernel(sb: Sandbox) -> None:
    chan = sb.directory / "chan"
    code = f"import os\nos.makedirs({str(chan / 'junk' / 'deeper')!r})\nos._exit(1)"
    assert sb.execute(code).crashed
    result = sb.execute("1 + 1")  # the old code raised here: the next kernel could not start
    assert result.output.startswith("2\n") and result.error is None, result


def test_calls_from_threads_left_running_between_cells_are_refused(
    sb: Sandbox, world: EchoWorld
) -> None:
    code = (
        "import threading, time\n"
        "def pester():\n"
        "    while True:\n"
        "        try: apis.a.echo(i=1)\n"
        "        except Exception: time.sleep(0.001)\n"
        "threading.Thread(target=pester, daemon=True).start()\n"
        "time.sleep(0.2)"
    )
    assert sb.execute(code).error is None
    after_cell = len(world.calls)
    time.sleep(1.0)  # no cell runs: the model would be generating now
    assert len(world.calls) - after_cell <= 1, len(world.calls) - after_cell  # one in flight
    result = sb.execute("'next'")
    assert "were refused" in result.output, result


@pytest.mark.parametrize(
    ("code", "produced"),
    [
        ("import sys\n_ = sys.stdout.write('x' * 200_000_000)", 200_000_000),
        ("'x' * 200_000_000", 200_000_002 + 1),  # the repr with its quotes, then a newline
    ],
    ids=["stdout", "trailing-value"],
)
def test_a_huge_output_is_dropped_in_the_kernel_not_sent_to_the_host(
    sb: Sandbox, code: str, produced: int
) -> None:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = sb.execute(code, timeout=60)
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kb) / 1024
    assert grown_mb < 50, f"the host's peak RSS grew by {grown_mb:.0f} MB"
    kept = sb.max_output_chars
    assert result.output[:kept].strip("'") == "x" * len(result.output[:kept].strip("'"))
    assert f"[output truncated: {produced - kept} more characters not shown]" in result.output
