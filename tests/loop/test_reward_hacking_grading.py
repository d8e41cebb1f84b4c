"""Exploits of the grader, of timeout attribution and of `reward: acted`, played as agent code.

Each test scripts one exploit as the agent's turns and runs it with `collect_rollouts` on real
AppTown tasks in real kernels (as tests/loop/test_reward_hacking.py does): an answer built to
make the grader's parser backtrack must not freeze the other rollouts; messages padded to
`max_new_tokens` must not turn the agent's own timeout into an excluded one; and reads, or a
write undone, followed by `complete_task` must not count as acting.

Run: python -m pytest tests/loop/test_reward_hacking_grading.py    (needs root, bubblewrap, cgroups)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loop.algo.credit import acted, rollout_reward
from loop.config import AgentConfig
from loop.generators.base import Generation, SamplingParams
from loop.generators.scripted import ScriptedGenerator
from loop.rollout.collect import RolloutJob, collect_rollouts
from loop.rollout.prompt import worked_example
from loop.rollout.trajectory import Trajectory
from sandbox import KernelPool
from tasks.apptown.scenario import login_cell
from tests.loop.test_reward_hacking import COMPLETE, TASK, assert_scored

pytestmark = pytest.mark.slow
ANSWER_TASK = "payments_balance_1"  # a question: its tests are the answer and the collateral check


@pytest.fixture(scope="module")
def pool() -> Iterator[KernelPool]:
    with KernelPool(size=2, timeout_s=3, strict=True) as kernel_pool:
        yield kernel_pool


class PerTask:
    """One scripted policy per task, told apart by the task's instruction in the prompt."""

    name = "per-task"
    shares_weights = False

    def __init__(self, scripts: dict[str, ScriptedGenerator]) -> None:
        self.scripts = scripts

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        text = "\n".join(m["content"] for m in messages or [])
        [script] = [g for instruction, g in self.scripts.items() if instruction in text]
        return await script.generate(prompt_token_ids, params, messages=messages)

    def load_adapter(self, path: Path | None) -> None:
        """Nothing to load."""

    def release_memory(self) -> None:
        """Nothing to free."""

    async def close(self) -> None:
        """Nothing to release."""


class TimedGenerator(ScriptedGenerator):
    """A scripted policy whose backend takes `per_call_s + per_token_s * tokens emitted`."""

    per_call_s = 0.0
    per_token_s = 0.0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        generation = await super().generate(prompt_token_ids, params, messages=messages)
        await asyncio.sleep(self.per_call_s + self.per_token_s * len(generation.token_ids))
        return generation


def collect(
    suite: Any, pool: KernelPool, tokenizer: Any, generator: Any, tasks: list[str], **settings: Any
) -> tuple[list[Trajectory], float]:
    """The rollouts of `tasks`, run together, and the longest the event loop was held meanwhile."""
    jobs = [RolloutJob(suite.task(task), 0, seed=0) for task in tasks]

    async def run() -> tuple[list[Trajectory], float]:
        held = 0.0
        done = False

        async def watch() -> None:  # how late a 10 ms sleep wakes: the loop was held that long
            nonlocal held
            while not done:
                start = time.monotonic()
                await asyncio.sleep(0.01)
                held = max(held, time.monotonic() - start - 0.01)

        watcher = asyncio.ensure_future(watch())
        try:
            trajs = await collect_rollouts(
                jobs, suite=suite, pool=pool, generator=generator, tokenizer=tokenizer,
                settings=AgentConfig(**settings), example=list(worked_example(suite)),
                max_concurrent=len(jobs),
            )  # fmt: skip
        finally:
            done = True
            await watcher
        return trajs, held

    return asyncio.run(run())


def play_task(
    suite: Any, pool: KernelPool, tokenizer: Any, task: str, cells: list[str]
) -> Trajectory:
    """One rollout of `task` whose turns run `cells`, one per turn."""
    messages = [f"Step {i}.\n```python\n{cell}\n```" for i, cell in enumerate(cells)]
    generator = ScriptedGenerator(tokenizer, messages)
    [traj], _ = collect(suite, pool, tokenizer, generator, [task], max_turns=len(cells))
    return traj


# -- 1. one answer must not freeze every rollout ------------------------------------------------


def test_a_huge_list_answer_is_refused_and_holds_up_no_other_rollout(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    """A list item of 45,000 characters skipped the 10,000-character limit of strings, and the
    grader's number pattern backtracked on it for ~19 s on the event loop: the neighbour's
    sleeping cell was charged that time and its rollout ended `timeout`."""
    huge = (
        "try: apis.supervisor.complete_task(answer=['1' * 45_000 + 'x'])\n"
        "except Exception as e: print(type(e).__name__, str(e)[:200])"
    )
    greedy = [f"Step {i}.\n```python\n{cell}\n```" for i, cell in enumerate([huge, COMPLETE])]
    neighbour = [
        f"Step {i}.\n```python\n{cell}\n```"
        for i, cell in enumerate(["import time\ntime.sleep(2)", "time.sleep(2)", COMPLETE])
    ]
    generator = PerTask({
        suite.task(ANSWER_TASK).instruction: ScriptedGenerator(tokenizer, greedy),
        suite.task(TASK).instruction: ScriptedGenerator(tokenizer, neighbour),
    })  # fmt: skip
    (first, second), held = collect(
        suite, pool, tokenizer, generator, [ANSWER_TASK, TASK], max_turns=3, rollout_timeout_s=12
    )
    observation = first.turns[0].observation or ""
    assert "ApiError 422" in observation and "10000 characters" in observation, observation
    assert first.status == "ok"
    assert_scored(first)
    assert second.status == "ok" and second.cell_time_s < 6, (second.status, second.error)
    assert_scored(second)
    assert held < 2.0, f"the event loop was held for {held:.1f} s"  # 21.6 s before


# -- 2. long messages must not turn the agent's timeout into ours -------------------------------

# Sleeping cells and messages of various lengths up to max_new_tokens (the agent's choice).
SLEEPS = ["import time", *["time.sleep(0.8)"] * 8]
PADDING = "\n# " + "pad " * 400


def padded_messages() -> list[str]:
    """The first message short, every later one padded past `max_new_tokens` (cut there)."""
    return [
        f"Step {i}.\n```python\n{cell}\n```" + (PADDING if i else "")
        for i, cell in enumerate(SLEEPS)
    ]


def play_timed(
    suite: Any, pool: KernelPool, tokenizer: Any, per_call_s: float, per_token_s: float
) -> Trajectory:
    generator = TimedGenerator(tokenizer, padded_messages())
    generator.per_call_s, generator.per_token_s = per_call_s, per_token_s
    [traj], _ = collect(
        suite, pool, tokenizer, generator, [TASK],
        max_turns=len(SLEEPS), max_new_tokens=150, rollout_timeout_s=10,
    )  # fmt: skip
    return traj


def test_long_messages_on_a_slow_backend_leave_the_timeout_the_agents(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    """Generation that takes 10 ms per emitted token: the time of the 150-token messages is the
    agent's choice, so with its cells it used most of the limit: `timeout`, scored."""
    traj = play_timed(suite, pool, tokenizer, per_call_s=0.0, per_token_s=0.01)
    assert traj.cell_time_s < 5, traj.cell_time_s  # the cells alone used less than half
    assert traj.status == "timeout", (traj.status, traj.error)
    assert_scored(traj)


def test_a_backend_slow_whatever_the_length_is_still_ours(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    """The same turns on a backend that takes 1.5 s a call whatever it emits: its time is not
    the agent's, so the rollout is `generation_timeout`, excluded."""
    traj = play_timed(suite, pool, tokenizer, per_call_s=1.5, per_token_s=0.0)
    assert traj.status == "generation_timeout", (traj.status, traj.error)
    assert traj.infra_failure and traj.reward is None


# -- 3. `reward: acted` is earned by changing the user's data or passing the task's test -------

LIKE = (  # like the first song of the catalog not liked yet
    "for song in apis.music.search_songs(page_limit=20):\n"
    "    try:\n"
    "        apis.music.like_song(song_id=song['song_id'])\n"
    "        break\n"
    "    except Exception: pass"
)


def test_reading_with_a_read_api_then_completing_has_not_acted(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    cells = [login_cell("files"), "print(apis.files.list_directory(directory='/'))", COMPLETE]
    traj = play_task(suite, pool, tokenizer, TASK, cells)
    assert traj.status == "ok"
    assert rollout_reward(traj, "fraction") == 0.5  # the collateral test passes for doing nothing
    assert rollout_reward(traj, "acted") == 0.0
    assert not acted(traj) and traj.state_changed is False


def test_a_write_undone_then_completing_has_not_acted(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    unlike = "print(apis.music.unlike_song(song_id=song['song_id']))"
    traj = play_task(
        suite, pool, tokenizer, TASK, [login_cell("music"), f"{LIKE}\n{unlike}", COMPLETE]
    )
    writes = [c for c in traj.api_calls if c["api"] in ("like_song", "unlike_song") and c["ok"]]
    assert [c["api"] for c in writes] == ["like_song", "unlike_song"], traj.api_calls
    assert traj.status == "ok"
    assert rollout_reward(traj, "acted") == 0.0
    assert not acted(traj) and traj.state_changed is False


def test_a_change_or_a_right_answer_has_acted(suite: Any, pool: KernelPool, tokenizer: Any) -> None:
    gold = play_task(suite, pool, tokenizer, TASK, suite.gold_solution(suite.task(TASK)))
    assert rollout_reward(gold, "acted") == 1.0 and acted(gold) and gold.state_changed
    stray = play_task(suite, pool, tokenizer, TASK, [login_cell("music"), LIKE, COMPLETE])
    assert rollout_reward(stray, "acted") == rollout_reward(stray, "fraction") == 0.0
    assert acted(stray) and stray.state_changed  # a wrong change is acting: it costs the test
    answer = play_task(
        suite, pool, tokenizer, ANSWER_TASK, suite.gold_solution(suite.task(ANSWER_TASK))
    )
    assert rollout_reward(answer, "acted") == 1.0
    assert acted(answer) and answer.state_changed is False  # the task's own test passed
