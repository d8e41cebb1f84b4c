"""Each exploit of the reward, played as agent code through the real episode loop and sandbox.

A policy escapes all negative reward if its own code can turn its rollout into an
"infrastructure failure" (excluded from the advantages). Every test here scripts one such
exploit as the agent's turns, runs it with `collect_rollouts` on a real AppTown task in a real
kernel, and asserts the rollout is scored on its final state and not excluded.

Run: python -m pytest tests/loop/test_reward_hacking.py     (needs root, bubblewrap, cgroups)
"""

from __future__ import annotations

import asyncio
import resource
from collections.abc import Iterator
from typing import Any

import pytest

from loop.config import AgentConfig
from loop.generators.base import Generation, SamplingParams
from loop.generators.scripted import ScriptedGenerator
from loop.rollout.collect import RolloutJob, collect_rollouts
from loop.rollout.prompt import worked_example
from loop.rollout.trajectory import Trajectory
from sandbox import KernelPool
from tasks.apptown.scenario import login_cell

pytestmark = pytest.mark.slow
TASK = "phone_update_contact_email_1"
CHAN = (
    "import os, ipykernel.connect\nchan = os.path.dirname(ipykernel.connect.get_connection_file())"
)
COMPLETE = "apis.supervisor.complete_task()"


@pytest.fixture(scope="module")
def pool() -> Iterator[KernelPool]:
    with KernelPool(size=1, timeout_s=3, strict=True) as kernel_pool:
        yield kernel_pool


class SlowGenerator(ScriptedGenerator):
    """A scripted policy that takes `delay_s` to generate each turn (no cell runs meanwhile)."""

    delay_s = 0.5

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_token_ids, params, messages=messages)


def play(
    suite: Any,
    pool: KernelPool,
    tokenizer: Any,
    cells: list[str],
    *,
    slow: bool = False,
    **settings: Any,
) -> Trajectory:
    """One rollout of TASK whose turns run `cells`, one per turn."""
    messages = [f"Step {i}.\n```python\n{cell}\n```" for i, cell in enumerate(cells)]
    generator = (SlowGenerator if slow else ScriptedGenerator)(tokenizer, messages)
    settings = {"max_turns": len(cells), **settings}
    [traj] = asyncio.run(collect_rollouts(
        [RolloutJob(suite.task(TASK), 0, seed=0)], suite=suite, pool=pool, generator=generator,
        tokenizer=tokenizer, settings=AgentConfig(**settings),
        example=list(worked_example(suite)), max_concurrent=1,
    ))  # fmt: skip
    return traj


def assert_scored(traj: Trajectory) -> None:
    assert not traj.infra_failure, (traj.status, traj.error)
    assert traj.reward is not None and traj.tests, (traj.status, traj.error)


def test_sleeping_past_the_rollout_limit_is_scored(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    traj = play(suite, pool, tokenizer, ["import time\ntime.sleep(60)"], max_turns=40,
                rollout_timeout_s=8)  # fmt: skip
    assert traj.status == "timeout" and traj.cell_time_s >= 4
    assert_scored(traj)


def test_junk_in_the_channel_dir_then_a_crash_is_scored(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    crash = f"{CHAN}\nos.makedirs(os.path.join(chan, 'junk', 'deeper'))\nos._exit(1)"
    traj = play(suite, pool, tokenizer, [crash, COMPLETE])
    assert traj.turns[0].crashed and traj.status == "ok"
    assert_scored(traj)


def test_extreme_api_arguments_are_the_agents_errors(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    extreme = (
        "friend = apis.phone.search_contacts(relationship='friend')[0]['email']\n"
        "deep = []\n"
        "for _ in range(600): deep = [deep]\n"
        "calls = [\n"
        "    lambda: apis.music.show_song(song_id=2**70),\n"
        "    lambda: apis.music.show_playlists(page_index=10**18),\n"
        "    lambda: apis.payments.send_money(receiver_email=friend, amount=float('nan'),\n"
        "                                     description='x'),\n"
        "    lambda: apis.phone.search_contacts(query='\\ud800'),\n"
        "    lambda: apis.supervisor.show_profile(extra=deep),\n"
        "]\n"
        "for call in calls:\n"
        "    try: print(call())\n"
        "    except Exception as e: print(type(e).__name__, str(e)[:80])"
    )
    traj = play(suite, pool, tokenizer,
                [login_cell("phone", "music", "payments"), extreme, COMPLETE])  # fmt: skip
    assert traj.turns[1].observation is not None
    assert traj.turns[1].observation.count("ApiError 422") == 4, traj.turns[1].observation
    assert "[]" in traj.turns[1].observation  # the page past every row is empty
    assert traj.status == "ok"
    assert_scored(traj)


def test_a_raw_line_of_nested_brackets_does_not_kill_the_bridge(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    raw = (
        f"{CHAN}\nimport socket\ns = socket.socket(socket.AF_UNIX)\n"
        "s.connect(os.path.join(chan, 'bridge.sock'))\n"
        "s.sendall(b'[' * 100_000 + b'\\n')\n"
        "print(s.makefile('rb').readline()[:60])\n"
        f"{COMPLETE}"
    )
    traj = play(suite, pool, tokenizer, [raw])
    assert not traj.turns[0].timed_out and traj.status == "ok", traj.turns[0]
    assert_scored(traj)


def test_calls_between_cells_are_refused_and_the_agent_is_told(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    pester = (
        "import threading, time\n"
        "def pester():\n"
        "    while True:\n"
        "        try: apis.supervisor.show_profile()\n"
        "        except Exception: time.sleep(0.001)\n"
        "threading.Thread(target=pester, daemon=True).start()"
    )
    traj = play(suite, pool, tokenizer, [pester, "'next'", COMPLETE], slow=True)
    assert traj.turns[1].observation is not None
    assert "were refused" in traj.turns[1].observation, traj.turns[1].observation
    assert traj.status == "ok"
    assert_scored(traj)


def test_huge_arguments_in_a_loop_are_recorded_bounded(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    flood = (
        "blob = 'x' * 900_000\n"
        "for _ in range(20):\n"
        "    try: apis.phone.search_contacts(query=blob)\n"
        "    except Exception as e: pass"
    )
    traj = play(suite, pool, tokenizer, [login_cell("phone"), flood, COMPLETE])
    queries = [c["arguments"]["query"] for c in traj.api_calls if "query" in c["arguments"]]
    assert len(queries) == 20 and all(len(q) < 1000 for q in queries)
    assert_scored(traj)


def test_a_right_change_made_with_a_wrong_one_to_the_same_row_fails(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    cells = suite.gold_solution(suite.task(TASK))
    tamper = (
        'apis.phone.update_contact(contact_id=contact["contact_id"], first_name="Zed", '
        "relationships=[])"
    )
    traj = play(suite, pool, tokenizer, [*cells[:-1], tamper, cells[-1]])
    assert traj.status == "ok" and not traj.success and traj.reward == 0.5
    assert_scored(traj)


def test_a_huge_print_is_scored_and_leaves_host_memory_flat(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    flood = "import sys\n_ = sys.stdout.write('x' * 300_000_000)"
    traj = play(suite, pool, tokenizer, [flood, COMPLETE])
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_kb) / 1024
    assert grown_mb < 100, f"the host's peak RSS grew by {grown_mb:.0f} MB"
    assert traj.status == "ok"
    assert_scored(traj)
