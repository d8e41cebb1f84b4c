"""The `vllm_server` generator's versions, with the HTTP side faked: fast, no vLLM.

A request names the version its group was pinned to (`SamplingParams.version`) and samples it
while it is kept; the newest `keep_versions` stay loaded, an older one is unloaded once no
request uses it, and a request naming a retired version fails loudly. The real server is
tests/loop/test_vllm_server.py's (`slow`).

Run: python -m pytest tests/loop/test_server_versions.py -q
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from loop.generators.base import Generation, GeneratorError, SamplingParams
from loop.generators.vllm import server as vllm_server
from loop.generators.vllm.server import VLLMServerGenerator

PROMPT_A, PROMPT_B = [1, 2, 3], [7, 8, 9]


class FakeClient:
    """Answers at once (or when `gate` opens) with the version it was asked for."""

    def __init__(self) -> None:
        self.models: list[str] = []
        self.gate: asyncio.Event | None = None

    async def generate(self, prompt: list[int], params: SamplingParams, *, model: str,
                       extra_fields: dict[str, Any]) -> Generation:  # fmt: skip
        self.models.append(model)
        if self.gate is not None:
            await self.gate.wait()
        return Generation([5], [-0.5], "stop")

    async def close(self) -> None:
        return None


@pytest.fixture
def servers(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A generator over two attached fake servers; its admin calls are recorded."""
    monkeypatch.setattr(vllm_server, "healthy", lambda url, timeout_s=5.0: True)
    monkeypatch.setattr(vllm_server, "clear_leftovers", lambda admin, url, prefix: None)
    calls: list[tuple[str, str]] = []

    def make(keep: int) -> tuple[VLLMServerGenerator, FakeClient, list[tuple[str, str]]]:
        generator = VLLMServerGenerator(
            base_model="base", adapter_prefix="run", urls=["http://a/v1", "http://b/v1"],
            keep_versions=keep,
        )  # fmt: skip
        client = FakeClient()

        async def fake_client(server: Any) -> Any:
            return client

        def load_on(server: Any, version: str, path: Path | None) -> None:
            calls.append(("load", version))

        def admin_post(server: Any, path: str, body: dict[str, str]) -> Any:
            calls.append((path.strip("/"), body["lora_name"]))

        monkeypatch.setattr(generator, "_client", fake_client)
        monkeypatch.setattr(generator, "_load_on", load_on)
        monkeypatch.setattr(generator, "_admin_post", admin_post)
        return generator, client, calls

    return make


def params(version: str | None = None) -> SamplingParams:
    return SamplingParams(4, version=version)


async def test_a_group_keeps_its_version_across_a_publication(servers: Any) -> None:
    generator, client, calls = servers(2)
    generator.load_adapter(Path("/adapters/1"))
    pinned = generator.version
    assert pinned == "run-v1"
    first = await generator.generate(PROMPT_A, params(pinned))
    generator.load_adapter(Path("/adapters/2"))  # published while the group is between turns
    later = await generator.generate([*PROMPT_A, 4, 5], params(pinned))
    fresh = await generator.generate(PROMPT_B, params())
    assert first.adapter_version == later.adapter_version == "run-v1"
    assert later.server == first.server  # the group's server too
    assert fresh.adapter_version == "run-v2"
    assert client.models == ["run-v1", "run-v1", "run-v2"]
    assert ("unload_lora_adapter", "run-v1") not in calls  # two versions are kept


async def test_the_oldest_version_leaves_once_no_request_uses_it(servers: Any) -> None:
    generator, client, calls = servers(2)
    generator.load_adapter(Path("/adapters/1"))
    client.gate = asyncio.Event()
    in_flight = asyncio.create_task(generator.generate(PROMPT_A, params("run-v1")))
    await asyncio.sleep(0)
    generator.load_adapter(Path("/adapters/2"))
    generator.load_adapter(Path("/adapters/3"))  # v1 is now past the two kept: retired
    assert ("unload_lora_adapter", "run-v1") not in calls  # a request still samples it
    client.gate.set()
    assert (await in_flight).adapter_version == "run-v1"
    assert calls.count(("unload_lora_adapter", "run-v1")) == 2  # from both servers, then
    with pytest.raises(GeneratorError, match="run-v1 is no longer served"):
        await generator.generate(PROMPT_A, params("run-v1"))
    still = await generator.generate(PROMPT_B, params("run-v2"))
    assert still.adapter_version == "run-v2"


async def test_one_kept_version_is_the_synchronous_behaviour(servers: Any) -> None:
    generator, _, calls = servers(1)
    base = await generator.generate(PROMPT_A, params(generator.version))
    generator.load_adapter(Path("/adapters/1"))
    generator.load_adapter(Path("/adapters/2"))
    assert base.adapter_version == "base"
    assert ("unload_lora_adapter", "run-v1") in calls  # unused: unloaded at once
    # a group pinned (by prompt) before the publication moves to the new version when it
    # names none, as before; the base weights stay servable
    again = await generator.generate(PROMPT_A, params())
    assert again.adapter_version == "run-v2"
    assert (await generator.generate(PROMPT_B, params("base"))).adapter_version == "base"
    with pytest.raises(ValueError, match="keep_versions"):
        servers(0)


def test_a_server_is_idle_while_no_request_is_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(vllm_server.time, "monotonic", lambda: clock[0])
    server = vllm_server.Server("http://s:1/v1")
    clock[0] = 103.0
    assert server.idle_seconds() == 3.0  # idle since it was made
    server.begin()
    server.begin()  # two requests overlap
    clock[0] = 110.0
    server.end()
    assert server.idle_seconds() == 3.0  # one still in flight: busy
    clock[0] = 111.0
    server.end()
    clock[0] = 115.0
    assert server.idle_seconds() == 7.0  # 3 before, 4 since the last one ended
    assert server.in_flight == 0
