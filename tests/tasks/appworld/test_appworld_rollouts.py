"""AppWorld through our agent and rollout code (loop/rollout/agent.py, loop/rollout/collect.py,
evaluate.py).

A scripted generator stands in for the LLM: it finds the task in the prompt and replays a
script chosen by the rollout's seed (gold, wrong or no-op), one cell per turn, so every result
is known in advance and graded by AppWorld's own evaluator. Concurrent rollouts of one task
each get their own engine; a killed engine costs only its own rollout.
Run: python -m pytest tests/tasks/appworld/test_appworld_rollouts.py   (slow: real engines)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loop.config import AgentConfig, load_config
from loop.evaluation import run_evaluation
from loop.generators.base import Generation, SamplingParams
from loop.model.aliases import resolve_model
from loop.rollout.collect import RolloutJob, collect_rollouts
from loop.rollout.prompt import worked_example
from tasks.appworld import AppWorldSuite

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
NO_OP = ["apis.supervisor.complete_task()"]


class ScriptedGenerator:
    """Replays `scripts[(task instruction, job seed)]` (or `scripts[instruction]`) one cell
    per turn; `on_turn(instruction, turn)` runs before each reply (to kill an engine)."""

    name = "scripted"
    shares_weights = False

    def __init__(
        self,
        tokenizer: Any,
        scripts: dict[Any, list[str]],
        on_turn: Callable[[str, int], None] | None = None,
    ) -> None:
        self.tokenizer, self.scripts, self.on_turn = tokenizer, scripts, on_turn

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, *, messages: Any = None
    ) -> Generation:
        start = max(i for i, m in enumerate(messages) if "Now the real task" in m["content"])
        instruction = messages[start]["content"].rsplit("Task: ", 1)[1]
        turn = sum(m["role"] == "assistant" for m in messages[start:])
        assert params.seed is not None
        script = self.scripts.get((instruction, params.seed - turn), self.scripts.get(instruction))
        assert script is not None, f"no script for {instruction!r}"
        if self.on_turn is not None:
            self.on_turn(instruction, turn)
        text = f"Step {turn}.\n```python\n{script[min(turn, len(script) - 1)]}\n```"
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = [*ids[: params.max_new_tokens - 1], params.stop_token_ids[0]]
        return Generation(ids, [-0.5] * len(ids), "stop")

    def load_adapter(self, path: Any) -> None:
        pass

    def release_memory(self) -> None:
        pass

    async def close(self) -> None:
        pass


class NoKernels:
    """The AppWorld env runs code in its engine; rollouts need no REPL kernel from a pool."""

    async def acquire_async(self) -> None:
        return None

    async def release_async(self, sandbox: Any) -> None:
        pass


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def rollouts(suite: AppWorldSuite, jobs: list[RolloutJob], generator: Any, tokenizer: Any) -> Any:
    return asyncio.run(
        collect_rollouts(
            jobs, suite=suite, pool=NoKernels(), generator=generator, tokenizer=tokenizer,
            settings=AgentConfig(max_turns=6, max_new_tokens=400, rollout_timeout_s=600),
            example=list(worked_example(suite)), max_concurrent=len(jobs),
        )
    )  # fmt: skip


def test_gold_passes_no_op_and_wrong_fail_in_concurrent_rollouts_of_one_task(
    aw_suite: AppWorldSuite, solutions: dict[str, Any], tokenizer: Any
) -> None:
    task = aw_suite.task("c0a1b2e_1")  # phone + simple_note
    solution = solutions[task.id]
    scripts = {
        (task.instruction, 0): solution["gold"],
        (task.instruction, 1000): solution["wrong"],
        (task.instruction, 2000): NO_OP,
    }
    jobs = [RolloutJob(task, k, seed=1000 * k) for k in range(3)]
    gold, wrong, no_op = rollouts(aw_suite, jobs, ScriptedGenerator(tokenizer, scripts), tokenizer)
    assert [t.status for t in (gold, wrong, no_op)] == ["ok", "ok", "ok"], gold.error
    assert gold.success and gold.reward == 1.0
    assert not wrong.success and wrong.reward == pytest.approx(2 / 3)
    assert not no_op.success and no_op.reward == pytest.approx(1 / 3)
    assert {c["api"] for c in gold.api_calls} >= {"search_contacts", "create_note"}
    assert [c["api"] for c in no_op.api_calls] == ["complete_task"]  # nobody else's calls


def test_concurrent_gold_rollouts_do_not_see_each_others_changes(
    aw_suite: AppWorldSuite, solutions: dict[str, Any], tokenizer: Any
) -> None:
    task = aw_suite.task("c0a1b2d_1")  # "exactly one contact was added" would see the others
    generator = ScriptedGenerator(tokenizer, {task.instruction: solutions[task.id]["gold"]})
    jobs = [RolloutJob(task, k, seed=1000 * k) for k in range(3)]
    for traj in rollouts(aw_suite, jobs, generator, tokenizer):
        assert traj.status == "ok" and traj.success, (traj.error, traj.tests)


def test_a_killed_engine_marks_only_its_rollout_and_is_replaced(
    aw_suite: AppWorldSuite, solutions: dict[str, Any], tokenizer: Any, monkeypatch: Any
) -> None:
    victim, survivor = aw_suite.task("c0a1b2c_1"), aw_suite.task("c0a1b2d_2")
    envs: list[Any] = []
    make_env = aw_suite.make_env

    def recording_make_env(task: Any, sandbox: Any = None) -> Any:
        envs.append(make_env(task))
        return envs[-1]

    monkeypatch.setattr(aw_suite, "make_env", recording_make_env)

    def kill_victim_engine(instruction: str, turn: int) -> None:
        """SIGKILL the engine's process group and wait for it: the engine itself runs in a
        session of its own under bwrap (--new-session) and dies with bwrap (--die-with-parent),
        a moment later; on a loaded machine it could still answer the next request in that
        moment, and the rollout came back ok. Reaped, the engine is dead to its next request."""
        if instruction == victim.instruction and turn == 1:
            engine = next(e.engine for e in envs if e.task.id == victim.id)
            os.killpg(engine.pid, signal.SIGKILL)
            engine.popen.wait(timeout=30)

    scripts = {t.instruction: solutions[t.id]["gold"] for t in (victim, survivor)}
    generator = ScriptedGenerator(tokenizer, scripts, on_turn=kill_victim_engine)
    jobs = [RolloutJob(victim, 0, seed=0), RolloutJob(survivor, 0, seed=0)]
    crashed, finished = rollouts(aw_suite, jobs, generator, tokenizer)
    assert crashed.status == "env_crash" and crashed.reward is None  # excluded, never 0.0
    assert crashed.infra_failure
    assert "env_crash" in (crashed.error or "") and "SIGKILL" in (crashed.error or "")
    assert finished.status == "ok" and finished.success
    again = ScriptedGenerator(tokenizer, {victim.instruction: solutions[victim.id]["gold"]})
    [retry] = rollouts(aw_suite, [RolloutJob(victim, 1, seed=0)], again, tokenizer)
    assert retry.status == "ok" and retry.success


def test_evaluation_reports_tgc_and_sgc_on_the_small_root(
    aw_suite: AppWorldSuite, solutions: dict[str, Any], tokenizer: Any, tmp_path: Path
) -> None:
    config = load_config(None, ["suite=appworld", "eval.split=train", "agent.max_turns=6"])
    scripts = {t.instruction: solutions[t.id]["gold"] for t in aw_suite.tasks("train")}
    scripts[aw_suite.task("c0a1b2c_3").instruction] = solutions["c0a1b2c_3"]["wrong"]
    generator = ScriptedGenerator(tokenizer, scripts)
    metrics = asyncio.run(
        run_evaluation(
            config, suite=aw_suite, pool=NoKernels(), generator=generator, tokenizer=tokenizer,
            out_dir=tmp_path, show_progress=False,
        )
    )  # fmt: skip
    assert metrics["eval/tasks"] == 6 and metrics["eval/infra_failures"] == 0
    assert metrics["eval/tgc"] == pytest.approx(5 / 6)  # every task but c0a1b2c_3
    assert metrics["eval/sgc"] == pytest.approx(2 / 3)  # scenario c0a1b2c has a failed variant
    lines = (tmp_path / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 6 and json.loads((tmp_path / "metrics.json").read_text()) == metrics


def test_evaluate_cli_runs_appworld_from_the_environment(small_root: Path, tmp_path: Path) -> None:
    env = {**os.environ, "APPWORLD_ROOT": str(small_root)}
    base = [sys.executable, "evaluate.py", "--config", "configs/quickstart.yaml", "--split"]
    done = subprocess.run(
        [*base, "test_normal", "suite=appworld", f"output_dir={tmp_path}", "sandbox.pool_size=1",
         "agent.max_turns=1", "agent.max_new_tokens=4"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "eval/tgc" in done.stdout and "eval/sgc" in done.stdout
    metrics = json.loads((tmp_path / "quickstart/eval/test_normal/metrics.json").read_text())
    assert metrics["eval/tasks"] == 1 and metrics["eval/infra_failures"] == 0
    env.pop("APPWORLD_ROOT")
    done = subprocess.run(
        [*base, "dev", "suite=appworld"], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert done.returncode == 2 and "set APPWORLD_ROOT" in done.stderr
    assert "Traceback" not in done.stderr
