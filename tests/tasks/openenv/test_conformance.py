"""An outsider's check of our export: OpenEnv's own tools against `python -m tasks.openenv
serve`, started as a user starts it.

`openenv validate --url` (the openenv package's conformance check of a running server: its
OpenAPI, /health, /metadata, /schema, /mcp and the mode's endpoint set) must pass, and one
episode through OpenEnv's generic client (`GenericEnvClient`, its synchronous wrapper, as the
docs show it) must reset, step and end with our grader's reward and report.

Run: python -m pytest tests/tasks/openenv/test_conformance.py     (slow: a server, ~30 s)
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from openenv.core.generic_client import GenericEnvClient

from tests.tasks.openenv.conftest import free_port

pytestmark = pytest.mark.slow
TASK = "music_count_library_genre_1"  # a dev task of the built-in world


@pytest.fixture(scope="module")
def export() -> Iterator[str]:
    """`python -m tasks.openenv serve` in a process of its own; its URL."""
    port = free_port()
    command = [sys.executable, "-m", "tasks.openenv", "serve", "--port", str(port)]
    server = subprocess.Popen([*command, "--pool-size", "1"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)


def test_openenv_validate_passes_against_the_running_export(export: str) -> None:
    command = [sys.executable, "-m", "openenv.cli", "validate", "--url", export, "--json"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    report = json.loads(run.stdout)
    failed = [c["id"] for c in report["criteria"] if not c["passed"]]
    assert run.returncode == 0 and report["passed"], (failed, run.stderr[-2000:])
    assert report["summary"]["required_passed_count"] == report["summary"]["required_total_count"]


def test_an_episode_through_openenvs_generic_client(export: str) -> None:
    with GenericEnvClient(base_url=export).sync() as env:
        start = env.reset(task_id=TASK)
        assert not start.done and start.observation["task_id"] == TASK
        assert start.observation["text"] and start.observation["start_fingerprint"]
        step = env.step({"code": "print(6 * 7)"})
        assert step.observation["text"] == "42" and not step.done
        end = env.step({"submit": True})
        report = end.observation["report"]
        assert end.done and end.reward == report["reward"] < 1.0 and not report["success"]
        assert end.observation["report"]["tests"]  # our grader's per-test detail
