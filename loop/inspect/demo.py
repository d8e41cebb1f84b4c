"""Scripted rollouts of the built-in app world, written like evaluate.py's and train.py's files.

No LLM is involved: for each rollout a seeded script is built from the task's gold or wrong
solution (tasks/apptown) with the habits the paper measures mixed in, more of them early in
"training" than late: reading an API's doc first, a placeholder login with "dummy" values that
fails, a call before logging in that fails, giving up after it, "I assume" in the thoughts, two
code cells in one turn. Each message then goes through the real episode loop
(`loop.rollout.collect.collect_rollouts`: real tokenizer, real sandbox, real grading), so the
files hold true token-exact trajectories with real API-call sequences. Sampler log-probs are drawn
from a seeded distribution and learner log-probs are those plus noise. It feeds the inspector's
tests and gives a report with something to look at:

    python -m loop.inspect.demo /tmp/demo-run [--tasks 6] [--rollouts 3] [--iterations 2]
    python -m loop.inspect /tmp/demo-run --html /tmp/demo.html

writes `eval/dev/{rollouts.jsonl,metrics.json,config.yaml}` and `rollouts/iter-N.jsonl.gz`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
from pathlib import Path
from statistics import mean
from typing import Protocol, runtime_checkable

from loop.config import AgentConfig, RunConfig
from loop.generators.scripted import ScriptedGenerator
from loop.generators.tokenizer import Tokenizer
from loop.rollout.collect import RolloutJob, SandboxPool, collect_rollouts
from loop.rollout.prompt import worked_example
from loop.rollout.trajectory import Trajectory
from loop.run.metrics import compute_metrics
from loop.run.rundir import (
    RunDir,
    eval_rollouts_sink,
    write_config,
    write_eval_metrics,
)
from loop.run.runlog import write_rollouts
from tasks import GoldSolutions, Task, TaskSuite

CALL = re.compile(r"apis\.(\w+)\.(\w+)")
TOKENIZER_MODEL = "smollm2-135m"  # the embedded default's tokenizer (loop/model/aliases.py)
SETTINGS = AgentConfig(max_turns=12, max_new_tokens=1500, max_observation_tokens=600)


@runtime_checkable
class ScriptedSuite(TaskSuite, GoldSolutions, Protocol):
    """A suite with a right and a wrong solution per task (the built-in world)."""

    def wrong_solution(self, task: Task) -> list[str]:
        """Code cells that run but fail the task's tests."""
        ...


def script(suite: ScriptedSuite, task: Task, skill: float, rng: random.Random) -> list[str]:
    """Assistant messages for one rollout; `skill` in [0, 1] makes the good habits likelier."""
    good = rng.random() < 0.3 + 0.6 * skill
    cells = list(suite.gold_solution(task) if good else suite.wrong_solution(task))
    apis = [(a, b) for a, b in CALL.findall(" ".join(cells)) if a not in ("supervisor", "api_docs")]
    app, data_api = next(((a, b) for a, b in apis if b != "login"), ("supervisor", "show_profile"))
    thoughts = [f"Step {i + 1} of my plan." for i in range(len(cells))]
    if rng.random() < 0.6 * (1 - skill):
        thoughts[0] = "I assume the usual login flow works here."
    turns = [f"{t}\n```python\n{c}\n```" for t, c in zip(thoughts, cells, strict=True)]
    if len(turns) > 2 and rng.random() < 0.5 * (1 - skill):  # two cells in one turn
        turns[:2] = [turns[0] + "\nAnd the next step right away.\n" + turns[1].split("\n", 1)[1]]
    opening = []
    if rng.random() < 0.2 + 0.7 * skill:
        opening.append(
            f"Let me read the doc of {app}.{data_api} before calling it.\n```python\n"
            f'print(apis.api_docs.show_api_doc(app_name="{app}", api_name="{data_api}"))\n```'
        )
    if rng.random() < 0.5 * (1 - skill):
        opening.append(
            f"I'll log in with a dummy password for now.\n```python\napis.{app}.login("
            'username="dummy_user", password="dummy_password")\n```'
        )
    if rng.random() < 0.5 * (1 - skill):
        opening.append(
            f"Let me look at the data first.\n```python\nprint(apis.{app}.{data_api}())\n```"
        )
        if rng.random() < 0.6 * (1 - skill):  # give up after the failure
            return [
                *opening,
                "I assume it is done.\n```python\napis.supervisor.complete_task()\n```",
            ]
    return opening + turns


async def rollouts(
    suite: ScriptedSuite,
    pool: SandboxPool,
    tokenizer: Tokenizer,
    tasks: list[Task],
    k: int,
    skill: float,
    seed: int,
) -> list[Trajectory]:
    """K scripted rollouts of every task, through the real episode loop."""
    example = list(worked_example(suite))

    async def one(task: Task, sample: int) -> Trajectory:
        rng = random.Random(f"{seed}/{task.id}/{sample}")
        noise = random.Random(rng.randrange(1 << 30))
        generator = ScriptedGenerator(
            tokenizer,
            script(suite, task, skill, rng),
            logprob=lambda: -(abs(noise.gauss(0, 0.5)) ** 2),
        )
        [traj] = await collect_rollouts(
            [RolloutJob(task, sample, seed=seed)], suite=suite, pool=pool, generator=generator,
            tokenizer=tokenizer, settings=SETTINGS, example=example, max_concurrent=1,
        )  # fmt: skip
        return traj

    return list(await asyncio.gather(*(one(t, s) for t in tasks for s in range(k))))


def write_training_rollouts(
    path: Path, trajectories: list[Trajectory], iteration: int, seed: int
) -> None:
    """The trainer's rollouts file, through its writer: leave-one-out advantages, the |A|
    filter, and learner log-probs (the sampler's plus seeded noise, a few far off)."""
    rng = random.Random(seed)
    by_task: dict[str, list[Trajectory]] = {}
    for traj in trajectories:
        by_task.setdefault(traj.task_id, []).append(traj)
    flat: list[Trajectory] = []
    advantages: list[list[float]] = []
    kept: list[bool] = []
    learner: dict[int, list[float | None]] = {}
    for group in by_task.values():
        rewards = [t.reward or 0.0 for t in group]
        for i, traj in enumerate(group):
            others = rewards[:i] + rewards[i + 1 :]
            advantage = rewards[i] - mean(others) if others else None
            learner[len(flat)] = [
                None if math.isnan(x) else x + rng.gauss(0, 0.03 if rng.random() < 0.95 else 0.4)
                for x in traj.sampler_logprobs  # NaN off the sampled tokens
            ]
            flat.append(traj)
            advantages.append([] if advantage is None else [advantage])
            kept.append(advantage is not None and abs(advantage) >= 0.01)
    write_rollouts(path, flat, iteration, "train", advantages, kept, learner)


def write_demo_run(
    out: Path, *, tasks: int = 6, k: int = 3, iterations: int = 2, seed: int = 0
) -> Path:
    """A demo run directory: a dev evaluation and `iterations` training iterations."""
    from transformers import AutoTokenizer

    from loop.model.aliases import resolve_model
    from sandbox import KernelPool
    from tasks import get_suite

    suite = get_suite("apptown")
    assert isinstance(suite, ScriptedSuite), "the built-in world has right and wrong solutions"
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(TOKENIZER_MODEL))
    run = RunDir(out)
    eval_dir = run.eval_dir("dev")
    config = RunConfig(name=out.name, output_dir=str(out.parent))
    config.model.name, config.agent = TOKENIZER_MODEL, SETTINGS
    with KernelPool(size=4, timeout_s=30) as pool:
        dev = asyncio.run(
            rollouts(suite, pool, tokenizer, suite.tasks("dev")[:tasks], k, 0.9, seed)
        )
        with eval_rollouts_sink(eval_dir) as sink:
            sink.writelines(json.dumps(t.to_json()) + "\n" for t in dev)
        write_eval_metrics(eval_dir, compute_metrics(dev))
        write_config(eval_dir, config.to_dict())
        write_config(out, config.to_dict())
        for it in range(iterations):
            skill = it / max(1, iterations - 1)
            train = suite.tasks("train")[:tasks]
            trajs = asyncio.run(rollouts(suite, pool, tokenizer, train, k, skill, seed + it))
            write_training_rollouts(run.rollouts(it), trajs, it, seed + it)
    return out


def main() -> None:
    """`python -m loop.inspect.demo OUT_DIR`."""
    p = argparse.ArgumentParser(
        prog="python -m loop.inspect.demo", description=__doc__.split("\n")[0]
    )
    p.add_argument("out", type=Path, help="the demo run directory to write")
    p.add_argument("--tasks", type=int, default=6, help="tasks per split (default 6)")
    p.add_argument("--rollouts", type=int, default=3, help="rollouts per task (default 3)")
    p.add_argument("--iterations", type=int, default=2, help="training iterations (default 2)")
    args = p.parse_args()
    write_demo_run(args.out, tasks=args.tasks, k=args.rollouts, iterations=args.iterations)
    print(f"demo run in {args.out}; now: python -m loop.inspect {args.out} --html report.html")


if __name__ == "__main__":
    main()
