"""The `vllm_server` generator when servers fail: stand-in servers (tests/loop/stub_server.py,
real processes over real HTTP, started in a blink) killed under a request, refusing an adapter,
or all gone. A dead server costs its requests nothing but time (they are re-sent whole to
another server, with their version); it is restarted (ours) or re-probed (attached, or refusing
an adapter) and returns to routing once it holds the current version; with every server gone a
request fails in one line naming each server and its log. The real vLLM server killed
mid-iteration is tests/loop/test_vllm_server.py's (`slow`).

Run: python -m pytest tests/loop/test_server_failures.py -q
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from loop.generators.base import GeneratorError, SamplingParams
from loop.generators.vllm.process import ServerProcess, free_port
from loop.generators.vllm.server import VLLMServerGenerator

ROOT = Path(__file__).resolve().parents[2]
SHORT = SamplingParams(4)
LONG = SamplingParams(100)  # the stand-in takes --slow-s seconds: time to kill it under one


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the stand-in is tests.loop.stub_server


def stub(tmp_path: Path, name: str, *args: str, port: int = 0) -> ServerProcess:
    return ServerProcess(
        list(args), port=port, log_path=tmp_path / f"{name}.log", module="tests.loop.stub_server",
        name=f"stand-in {name}",
    )  # fmt: skip


async def until(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.05)


async def on_both(generator: VLLMServerGenerator) -> set[int]:
    """The servers four new groups go to, sent together (each to the least-loaded)."""
    prompts = [[10 + i, 2, 3] for i in range(4)]
    answers = await asyncio.gather(*(generator.generate(p, LONG) for p in prompts))
    return {answer.server for answer in answers if answer.server is not None}


async def test_a_server_that_refused_an_adapter_once_is_re_admitted_by_a_re_probe(
    tmp_path: Path,
) -> None:
    attached = [stub(tmp_path, "a", "--slow-s", "0.2"), stub(tmp_path, "b", "--fail-loads", "1")]
    for server in attached:
        server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", urls=[s.url for s in attached], probe_every_s=0.2
    )
    try:
        (tmp_path / "v1").mkdir()
        generator.load_adapter(tmp_path / "v1")  # b refuses: out of routing, a serves run-v1
        refused = generator.servers[1]
        assert refused.served is None and generator.stats().server_failures == 1
        assert (await generator.generate([1, 2, 3], SHORT)).server == 0
        await until(lambda: refused.served == "run-v1")  # no publication in between
        assert await on_both(generator) == {0, 1}
        answer = await generator.generate([1, 2, 3, 4], SHORT)
        assert (
            answer.adapter_version == answer.text.split()[0] == "run-v1"
        )  # it samples the version
    finally:
        await generator.close()
        for server in attached:
            server.stop()


async def test_a_server_out_of_routing_is_re_admitted_at_the_next_publication(
    tmp_path: Path,
) -> None:
    attached = [stub(tmp_path, "a"), stub(tmp_path, "b", "--fail-loads", "1")]
    for server in attached:
        server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", urls=[s.url for s in attached],
        probe_every_s=3600.0,
    )  # fmt: skip
    try:
        for name in ("v1", "v2"):
            (tmp_path / name).mkdir()
            generator.load_adapter(tmp_path / name)
        await until(lambda: generator.servers[1].served == "run-v2")
    finally:
        await generator.close()
        for server in attached:
            server.stop()


async def test_a_started_server_killed_mid_request_costs_only_time_and_is_restarted(
    tmp_path: Path,
) -> None:
    processes = [stub(tmp_path, "a", "--slow-s", "2"), stub(tmp_path, "b", "--slow-s", "0.2")]
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", processes=processes, start_timeout_s=30
    )
    try:
        (tmp_path / "v1").mkdir()
        generator.load_adapter(tmp_path / "v1")
        before = generator.stats()
        killed = generator.servers[0]
        old_pid = killed.process.pid if killed.process else None
        request = asyncio.create_task(generator.generate([1, 2, 3], LONG))
        await until(lambda: killed.in_flight == 1)
        await asyncio.sleep(0.3)  # the stand-in is inside the request
        assert old_pid is not None
        os.killpg(old_pid, signal.SIGKILL)
        answer = await request  # re-sent whole to the other server, with its version
        assert answer.server == 1 and answer.adapter_version == answer.text.split()[0] == "run-v1"
        await until(lambda: killed.served == "run-v1")  # restarted, the adapter loaded first
        assert killed.process is not None and killed.process.pid != old_pid
        counted = generator.stats().servers_since(before, elapsed_s=1.0)
        assert counted["servers/failures"] == 1.0 and counted["servers/restarts"] == 1.0
        assert counted["servers/resent_requests"] == 1.0
        assert await on_both(generator) == {0, 1}  # back in routing
    finally:
        await generator.close()


async def test_an_attached_server_that_died_is_re_probed_and_re_admitted(tmp_path: Path) -> None:
    dying = stub(tmp_path, "a", "--slow-s", "2", port=free_port())
    other = stub(tmp_path, "b", "--slow-s", "0.2")
    for server in (dying, other):
        server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", urls=[dying.url, other.url], probe_every_s=0.2
    )
    try:
        (tmp_path / "v1").mkdir()
        generator.load_adapter(tmp_path / "v1")
        request = asyncio.create_task(generator.generate([1, 2, 3], LONG))
        await until(lambda: generator.servers[0].in_flight == 1)
        await asyncio.sleep(0.3)
        assert dying.pid is not None
        os.killpg(dying.pid, signal.SIGKILL)
        answer = await request
        assert answer.server == 1 and answer.adapter_version == answer.text.split()[0] == "run-v1"
        assert generator.servers[0].served is None and generator.restarts == 0  # not ours
        dying.start(30)  # it answers again, at its URL, without the adapter
        await until(lambda: generator.servers[0].served == "run-v1")
        assert await on_both(generator) == {0, 1}
    finally:
        await generator.close()
        for server in (dying, other):
            server.stop()


async def test_every_server_dead_is_one_error_naming_each_and_its_log(tmp_path: Path) -> None:
    processes = [stub(tmp_path, "a"), stub(tmp_path, "b")]
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", processes=processes, max_restarts=0
    )
    try:
        for process in processes:
            assert process.pid is not None
            os.killpg(process.pid, signal.SIGKILL)
        with pytest.raises(GeneratorError) as caught:
            await generator.generate([1, 2, 3], SHORT)
        message = str(caught.value)
        assert "\n" not in message
        for server, process in zip(generator.servers, processes, strict=True):
            assert server.url in message and f"log: {process.log_path}" in message
    finally:
        await generator.close()


async def test_a_server_found_down_while_closing_is_not_started_again(tmp_path: Path) -> None:
    process = stub(tmp_path, "a")
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", processes=[process], probe_every_s=0.1,
        health_timeout_s=2.0,
    )  # fmt: skip
    assert process.pid is not None
    os.killpg(process.pid, signal.SIGSTOP)  # it stops answering: the watcher's probe waits
    await asyncio.sleep(0.5)
    await generator.close()  # the probe then finds it down (stopped by close itself)
    await asyncio.sleep(1.0)  # time for a restart, were one begun
    assert process.pid is None and process.starts == 1
    assert generator.restarts == 0 and not any(t.is_alive() for t in generator._threads)
