"""Our suite over the wire equals our suite played locally, and bad input is refused cleanly.

An episode played through `OpenEnvSuite` (the import side) against our server (the export side)
sees the same task context, the same observations and the same reward and report as the same
cells played locally, for a gold and a wrong solution; through the episode loop, the same
token ids. Malformed actions, oversized cells and messages get a clear error, and nothing else
breaks: other sessions go on and no sandbox is left behind.

Run: python -m pytest tests/tasks/openenv/test_wire.py     (slow: real kernels, about a minute)
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from openenv.core.generic_client import GenericEnvClient
from websockets.asyncio.client import connect

from loop.config import AgentConfig
from loop.generators.scripted import ScriptedGenerator
from loop.rollout.collect import RolloutJob, collect_rollouts
from sandbox import KernelPool
from tasks.apptown import AppTownSuite
from tasks.core import EnvironmentFailureError, format_assistant
from tasks.openenv.suite import OpenEnvSuite
from tasks.openenv.wire import MAX_CODE_CHARS
from tests.tasks.openenv.conftest import MAX_MESSAGE_BYTES, Served

pytestmark = pytest.mark.slow
TASK = "music_count_library_genre_1"  # a dev task of the built-in world


def play_locally(suite: AppTownSuite, task_id: str, cells: list[str]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        with KernelPool(size=1, timeout_s=10) as pool:
            sandbox = await pool.acquire_async()
            env = suite.make_env(suite.task(task_id), sandbox)
            context = await env.areset()
            observations = [await env.astep(cell) for cell in cells]
            sandbox.set_handler(None)
            report = await env.aevaluate()
            await pool.release_async(sandbox)
            return {"context": context, "observations": observations, "report": report}

    return asyncio.run(go())


def play_remotely(remote: OpenEnvSuite, task_id: str, cells: list[str]) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        env = remote.make_env(remote.task(task_id))
        try:
            context = await env.areset()
            observations = [await env.astep(cell) for cell in cells]
            report = await env.aevaluate()
        finally:
            await env.aclose()
        return {"context": context, "observations": observations, "report": report,
                "calls": env.api_calls, "start": env.start_fingerprint}  # fmt: skip

    return asyncio.run(go())


@pytest.mark.parametrize("solution", ["gold", "wrong"])
def test_an_episode_over_the_wire_equals_the_same_cells_played_locally(
    apptown: AppTownSuite, server: Served, solution: str
) -> None:
    task = apptown.task(TASK)
    cells = apptown.gold_solution(task) if solution == "gold" else apptown.wrong_solution(task)
    local = play_locally(apptown, TASK, cells)
    remote = play_remotely(OpenEnvSuite(server.url), TASK, cells)
    assert remote["context"] == local["context"]
    assert remote["observations"] == local["observations"]
    assert remote["report"].reward == local["report"].reward
    assert remote["report"].success == local["report"].success == (solution == "gold")
    assert remote["report"].is_external and remote["report"].tests == local["report"].tests
    assert remote["calls"] and remote["start"] is not None and len(remote["start"]) == 64
    server.wait_until_none_leased()


def test_the_episode_loop_over_the_wire_is_token_exact(
    apptown: AppTownSuite, server: Served, tokenizer: Any
) -> None:
    """The same scripted turns through collect_rollouts: the same ids, reward and status."""
    task = apptown.task(TASK)
    messages = [format_assistant("Next step.", cell) for cell in apptown.gold_solution(task)]
    settings = AgentConfig(max_turns=5, max_new_tokens=400, max_context_tokens=8192)

    def collect(suite: Any) -> Any:
        async def go() -> Any:
            with KernelPool(size=1, timeout_s=10) as pool:
                [traj] = await collect_rollouts(
                    [RolloutJob(suite.task(TASK), 0, seed=0)], suite=suite, pool=pool,
                    generator=ScriptedGenerator(tokenizer, messages), tokenizer=tokenizer,
                    settings=settings, example=suite.example_messages(), max_concurrent=1,
                )  # fmt: skip
                return traj

        return asyncio.run(go())

    local, remote = collect(apptown), collect(OpenEnvSuite(server.url))
    assert remote.status == local.status == "ok" and remote.reward == local.reward == 1.0
    assert remote.tokens == local.tokens and remote.is_output == local.is_output
    assert [t.observation for t in remote.turns] == [t.observation for t in local.turns]
    assert remote.start_fingerprint == local.start_fingerprint
    server.wait_until_none_leased()


async def _error_of(env: GenericEnvClient, action: dict[str, Any]) -> str:
    with pytest.raises(RuntimeError) as caught:
        await env.step(action)
    return str(caught.value)


def test_bad_input_gets_a_clear_error_and_nothing_else_breaks(server: Served) -> None:
    async def go() -> None:
        async with GenericEnvClient(base_url=server.url) as bystander:
            await bystander.reset(task_id=TASK)
            async with GenericEnvClient(base_url=server.url) as env:
                assert "no episode: send reset first" in await _error_of(env, {"code": "1"})
                with pytest.raises(RuntimeError, match="no task 'nope'"):
                    await env.reset(task_id="nope")
                with pytest.raises(RuntimeError, match="not 'colour'"):
                    await env.reset(task_id=TASK, colour="red")
                await env.reset(task_id=TASK)
                long = await _error_of(env, {"code": "x" * (MAX_CODE_CHARS + 1)})
                assert f"{MAX_CODE_CHARS + 1} characters, more than the {MAX_CODE_CHARS}" in long
                assert "VALIDATION_ERROR" in await _error_of(env, {"cmd": "1"})
                assert "VALIDATION_ERROR" in await _error_of(env, {"code": 5})
                step = await env.step({"code": "print(6 * 7)"})  # the session goes on
                assert step.observation["text"] == "42" and not step.done
            # A message past the server's size limit closes that connection, and only it.
            async with connect(server.url.replace("http", "ws") + "/ws", max_size=None) as raw:
                await raw.send(json.dumps({"type": "reset", "data": {"task_id": TASK}}))
                assert json.loads(await raw.recv())["type"] == "observation"
                big = {"type": "step", "data": {"code": "#" * MAX_MESSAGE_BYTES}}
                await raw.send(json.dumps(big))
                await raw.wait_closed()
                assert raw.close_code == 1009  # message too big
            step = await bystander.step({"code": "print('still here')"})
            assert step.observation["text"] == "still here"

    asyncio.run(go())
    server.wait_until_none_leased()


def test_a_lost_server_is_an_infrastructure_failure_not_a_score(apptown: AppTownSuite) -> None:
    from tests.tasks.openenv.conftest import served

    async def go(remote: OpenEnvSuite) -> None:
        env = remote.make_env(remote.task(TASK))
        await env.areset()
        stop.set()
        while not stopped.is_set():
            await asyncio.sleep(0.05)
        with pytest.raises(EnvironmentFailureError, match="OpenEnv step failed"):
            await env.astep("print(1)")
        with pytest.raises(EnvironmentFailureError):
            await env.aevaluate()
        await env.aclose()

    import threading

    stop, stopped = threading.Event(), threading.Event()

    def run_server() -> None:
        with served(apptown, "dev", max_sessions=2, pool_size=1) as running:
            urls.append(running.url)
            stop.wait(60)
        stopped.set()

    urls: list[str] = []
    thread = threading.Thread(target=run_server)
    thread.start()
    while not urls:
        assert thread.is_alive()
        threading.Event().wait(0.05)
    asyncio.run(go(OpenEnvSuite(urls[0])))
    thread.join()
