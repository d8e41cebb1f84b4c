"""The `vllm_server` generator on the wire: adapter names, publication and stopped servers,
with stand-in servers (tests/loop/stub_server.py, real processes over real HTTP).

Two runs named alike on one server each sample their own adapter (names carry the run's
nonce; a name we did not load is an error, never replaced; a resumed run clears what its
earlier life left). A group started while a slow load publishes a new version samples the
previous one. A stopped (SIGSTOP'd) server leaves routing within the health timeout, its
request finishing on another; it returns once it answers again (attached) or is killed and
restarted (ours); an attached server that forgot its adapters gets the newest one loaded
again before it serves, a request to it meanwhile waiting; a publication that unloads the
version the watcher is asking about is not taken for a forgetful server.

Run: python -m pytest tests/loop/test_server_wire.py -q
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from loop.generators.base import GeneratorError
from loop.generators.vllm.process import ServerProcess
from loop.generators.vllm.server import VLLMServerGenerator
from loop.run.rundir import RunDir
from tests.loop.test_server_failures import LONG, SHORT, on_both, stub, until

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the stand-in is tests.loop.stub_server


def adapter(tmp_path: Path, name: str) -> Path:
    (tmp_path / name).mkdir(parents=True)
    return tmp_path / name


def weights(text: str) -> str:
    """The adapter path the stand-in sampled with (its answer: `<model> <path>`)."""
    return text.split()[1]


@asynccontextmanager
async def attached(
    tmp_path: Path, name: str, *stub_args: str, prefix: str = "run", **settings: Any
) -> AsyncIterator[tuple[ServerProcess, VLLMServerGenerator]]:
    """A stand-in server started, and a generator attached to it by URL; both ended after."""
    server = stub(tmp_path, name, *stub_args)
    server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix=prefix, urls=[server.url], **settings
    )
    try:
        yield server, generator
    finally:
        await generator.close()
        server.stop()


async def test_two_runs_named_alike_on_one_server_sample_their_own_adapters(
    tmp_path: Path,
) -> None:
    server = stub(tmp_path, "shared")
    server.start(30)
    runs = [RunDir(tmp_path / place / "runs" / "x") for place in ("a", "b")]
    assert runs[0].adapter_nonce() == RunDir(runs[0].path).adapter_nonce()  # kept: a resume
    generators = [
        VLLMServerGenerator(
            base_model="base", adapter_prefix=f"x-{run.adapter_nonce()}", urls=[server.url]
        )
        for run in runs
    ]
    try:
        first, second = adapter(tmp_path, "a-1"), adapter(tmp_path, "b-1")
        generators[0].load_adapter(first)
        generators[1].load_adapter(second)  # the same run name, the same k
        ours = await generators[0].generate([1, 2, 3], SHORT)
        theirs = await generators[1].generate([1, 2, 3], SHORT)
        assert ours.adapter_version != theirs.adapter_version
        assert weights(ours.text) == str(first) and weights(theirs.text) == str(second)
    finally:
        for generator in generators:
            await generator.close()
        server.stop()


async def test_a_name_a_server_holds_that_we_did_not_load_is_an_error(tmp_path: Path) -> None:
    async with attached(tmp_path, "shared", prefix="x-n") as (server, generator):
        mine = adapter(tmp_path, "mine")
        generator.load_adapter(mine)
        other = {"lora_name": "x-n-v2", "lora_path": str(adapter(tmp_path, "other"))}
        assert httpx.post(server.url + "/load_lora_adapter", json=other).status_code == 200
        with pytest.raises(GeneratorError, match="already holds an adapter named x-n-v2") as err:
            generator.load_adapter(adapter(tmp_path, "mine-2"))
        assert "\n" not in str(err.value)
        answer = await generator.generate([1, 2, 3], SHORT)  # still ours, unchanged
        assert answer.adapter_version == "x-n-v1" and weights(answer.text) == str(mine)
        listed = httpx.get(server.url + "/models").json()["data"]
        assert {"id": "x-n-v2"} in listed  # the other's adapter was not replaced


async def test_a_resumed_run_unloads_what_its_earlier_life_left(tmp_path: Path) -> None:
    server = stub(tmp_path, "shared")
    server.start(30)
    for k in (1, 2):  # a killed earlier life of run x-n left its adapters there
        left = {"lora_name": f"x-n-v{k}", "lora_path": str(adapter(tmp_path, f"before-{k}"))}
        assert httpx.post(server.url + "/load_lora_adapter", json=left).status_code == 200
    resumed = VLLMServerGenerator(base_model="base", adapter_prefix="x-n", urls=[server.url])
    try:
        now = adapter(tmp_path, "now")
        resumed.load_adapter(now)  # x-n-v1 again, with the resumed weights
        answer = await resumed.generate([1, 2, 3], SHORT)
        assert answer.adapter_version == "x-n-v1" and weights(answer.text) == str(now)
        await resumed.close()  # an attached server is left without our adapters
        assert [m["id"] for m in httpx.get(server.url + "/models").json()["data"]] == ["base"]
    finally:
        await resumed.close()
        server.stop()


async def test_a_group_started_during_a_slow_publication_samples_the_previous_version(
    tmp_path: Path,
) -> None:
    slow = ("--load-s", "1.5")
    async with attached(tmp_path, "slow-loads", *slow, keep_versions=2) as (_, generator):
        generator.load_adapter(adapter(tmp_path, "v1"))
        publishing = threading.Thread(
            target=generator.load_adapter, args=(adapter(tmp_path, "v2"),)
        )
        publishing.start()  # collecting one iteration ahead: groups start meanwhile
        await asyncio.sleep(0.3)
        during = await generator.generate([1, 2, 3], SHORT)
        assert during.adapter_version == "run-v1" and publishing.is_alive()
        await asyncio.to_thread(publishing.join)
        after = await generator.generate([4, 5, 6], SHORT)
        assert after.adapter_version == "run-v2"


def stop(process: ServerProcess, sig: signal.Signals) -> None:
    assert process.pid is not None
    os.killpg(process.pid, sig)


async def test_a_stopped_attached_server_leaves_routing_and_returns_when_it_answers(
    tmp_path: Path,
) -> None:
    stopped, other = stub(tmp_path, "a", "--slow-s", "2"), stub(tmp_path, "b", "--slow-s", "0.2")
    for server in (stopped, other):
        server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", urls=[stopped.url, other.url],
        probe_every_s=0.2, health_timeout_s=0.5, request_timeout_s=600,
    )  # fmt: skip
    try:
        generator.load_adapter(adapter(tmp_path, "v1"))
        request = asyncio.create_task(generator.generate([1, 2, 3], LONG))
        await until(lambda: generator.servers[0].in_flight == 1)
        stop(stopped, signal.SIGSTOP)
        answer = await asyncio.wait_for(request, 10)  # not the 600 s request timeout
        assert answer.server == 1 and answer.adapter_version == "run-v1"
        assert generator.servers[0].served is None
        assert generator.stats().server_stalls == 1 and generator.resent == 1
        stop(stopped, signal.SIGCONT)
        await until(lambda: generator.servers[0].served == "run-v1")  # it kept our adapter
        assert await on_both(generator) == {0, 1}
    finally:
        stop(stopped, signal.SIGCONT)
        await generator.close()
        for server in (stopped, other):
            server.stop()


async def test_a_stopped_server_of_ours_is_killed_and_restarted(tmp_path: Path) -> None:
    processes = [stub(tmp_path, "a"), stub(tmp_path, "b")]
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", processes=processes, start_timeout_s=30,
        probe_every_s=0.2, health_timeout_s=0.5,
    )  # fmt: skip
    try:
        generator.load_adapter(adapter(tmp_path, "v1"))
        old_pid = processes[0].pid
        stop(processes[0], signal.SIGSTOP)
        await until(lambda: generator.restarts == 1)
        await until(lambda: generator.servers[0].served == "run-v1")
        assert processes[0].pid != old_pid and generator.stats().server_stalls == 1
        answers = await on_both(generator)
        assert answers == {0, 1}
    finally:
        await generator.close()


async def test_an_attached_server_that_forgot_its_adapters_gets_the_newest_before_serving(
    tmp_path: Path,
) -> None:
    async with attached(tmp_path, "forgetful", probe_every_s=0.2) as (server, generator):
        v1 = adapter(tmp_path, "v1")
        generator.load_adapter(v1)
        httpx.post(server.url.removesuffix("/v1") + "/forget", json={})  # restarted by its owner

        def lists_v1() -> bool:
            names = {m["id"] for m in httpx.get(server.url + "/models").json()["data"]}
            return "run-v1" in names

        await until(lambda: generator.stats().adapters_republished == 1)  # seen by a probe
        await until(lambda: lists_v1() and generator.servers[0].served == "run-v1")
        answer = await generator.generate([1, 2, 3], SHORT)
        assert answer.adapter_version == "run-v1" and weights(answer.text) == str(v1)


async def test_a_request_to_a_server_that_forgot_its_adapters_fails_over(tmp_path: Path) -> None:
    forgetful, other = stub(tmp_path, "a"), stub(tmp_path, "b")
    for server in (forgetful, other):
        server.start(30)
    generator = VLLMServerGenerator(
        base_model="base", adapter_prefix="run", urls=[forgetful.url, other.url],
        probe_every_s=3600.0,
    )  # fmt: skip
    try:
        v1 = adapter(tmp_path, "v1")
        generator.load_adapter(v1)
        httpx.post(forgetful.url.removesuffix("/v1") + "/forget", json={})  # before any probe
        answer = await generator.generate([1, 2, 3], SHORT)  # its 404 is not the rollout's
        assert answer.server == 1 and answer.adapter_version == "run-v1"
        assert generator.resent == 1 and generator.stats().adapters_republished == 1
        await until(lambda: generator.servers[0].served == "run-v1")  # loaded again at once
        assert await on_both(generator) == {0, 1}
    finally:
        await generator.close()
        for server in (forgetful, other):
            server.stop()


async def test_a_publication_during_a_health_probe_is_not_taken_for_a_forgetful_server(
    tmp_path: Path,
) -> None:
    """The watcher reads a server's version, asks `/health` (slow on a busy server), then
    `/models`: a publication that lands meanwhile unloads the version it read. The server
    forgot nothing and stays in routing (it used to leave, and with one server a request
    then found none)."""
    busy = ("--health-s", "0.3", "--load-s", "0.05")
    settings: dict[str, Any] = {"probe_every_s": 0.05, "keep_versions": 1}
    async with attached(tmp_path, "busy", *busy, **settings) as (_, generator):
        for k in range(1, 7):
            generator.load_adapter(adapter(tmp_path, f"v{k}"))
            await asyncio.sleep(0.2)  # the watcher is inside its health probe now and then
            answer = await generator.generate([1, 2, 3], SHORT)
            assert answer.adapter_version == f"run-v{k}"
        stats = generator.stats()
        assert stats.adapters_republished == 0 and stats.server_failures == 0, stats


async def test_a_request_to_the_only_server_waits_while_it_gets_its_adapters_again(
    tmp_path: Path,
) -> None:
    slow = ("--load-s", "0.5")
    async with attached(tmp_path, "forgetful", *slow, probe_every_s=3600.0) as (server, generator):
        v1 = adapter(tmp_path, "v1")
        generator.load_adapter(v1)
        httpx.post(server.url.removesuffix("/v1") + "/forget", json={})  # restarted by its owner
        answer = await generator.generate([1, 2, 3], SHORT)  # its 404: out, v1 loaded again
        assert answer.adapter_version == "run-v1" and weights(answer.text) == str(v1)
        assert generator.resent == 1 and generator.stats().adapters_republished == 1
