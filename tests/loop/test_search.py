"""DPO-MCTS: the tree's UCB and back-up on a toy tree by hand, its pairs, the restore of a
turn's state by replay on the built-in world, and one search on the word task.

    python -m pytest tests/loop/test_search.py -q        (about 40 s on 2 cores; the app-world
                                                          test needs the sandbox's kernels)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loop.algo.mcts import Tree, backup, select, sibling_pairs, ucb
from loop.checks import check_run
from loop.config import AgentConfig, ConfigError, load_config
from loop.generators.scripted import ScriptedGenerator
from loop.rollout.collect import RolloutJob, collect_rollouts
from loop.rollout.prompt import worked_example
from loop.rollout.search import PairBuffer, ReplayGenerator, SearchSettings, search_task
from loop.rollout.trajectory import Trajectory
from tests.loop.synthetic import (
    MultiTurnWordEnv,
    MultiTurnWordSuite,
    NoSandboxPool,
    run_synthetic,
    synthetic_policy,
)

ROOT = Path(__file__).resolve().parents[2]


def toy_tree() -> Tree:
    """root -> a, b; a -> c, d. Returns backed up: 1.0 through c, 0.0 through d, 0.5 through
    b, 1.0 through c again."""
    tree = Tree()
    a, b = tree.add_child(0, "a"), tree.add_child(0, "b")
    c, d = tree.add_child(a, "c"), tree.add_child(a, "d")
    for node, value in ((c, 1.0), (d, 0.0), (b, 0.5), (c, 1.0)):
        backup(tree, node, value)
    return tree


def test_backup_adds_a_visit_and_the_return_along_the_path() -> None:
    tree = toy_tree()
    visits = [n.visits for n in tree.nodes]
    sums = [n.value_sum for n in tree.nodes]
    assert visits == [4, 3, 1, 2, 1]  # root, a, b, c, d
    assert sums == [2.5, 2.0, 0.5, 2.0, 0.0]
    assert tree.nodes[1].q == pytest.approx(2 / 3) and math.isnan(Tree().nodes[0].q)
    assert tree.path(4) == [0, 1, 4]


def test_ucb_by_hand() -> None:
    # q + c sqrt(ln N / n): 0.5 + 2 sqrt(ln 4 / 1) = 0.5 + 2 * 1.17741
    assert ucb(0.5, 1, 4, 2.0) == pytest.approx(0.5 + 2 * math.sqrt(math.log(4)))
    assert ucb(0.0, 0, 4, 1.0) == math.inf  # never visited: first


def test_select_descends_by_ucb_and_tries_unvisited_children_first() -> None:
    tree = toy_tree()
    # at the root (N = 4): a = 2/3 + sqrt(ln 4 / 3) = 1.3464, b = 0.5 + sqrt(ln 4) = 1.6774
    assert select(tree, 1.0) == 2
    # with c = 0.1: a = 0.6667 + 0.0680 = 0.7347 > b = 0.5 + 0.1177 = 0.6177; then at a
    # (N = 3): c = 1 + 0.1 sqrt(ln 3 / 2) = 1.0741, d = 0 + 0.1 sqrt(ln 3) = 0.1048 -> c
    assert select(tree, 0.1) == 3
    e = tree.add_child(3, "e")  # an unvisited child beats any visited sibling
    tree.add_child(3, "f")
    assert select(tree, 0.1) == e


def test_pairs_are_siblings_whose_q_gap_exceeds_the_margin() -> None:
    tree = toy_tree()
    # root's children: a (2/3) and b (0.5), gap 1/6; a's: c (1.0) and d (0.0), gap 1
    assert sibling_pairs(tree, 0.1) == [(1, 2), (3, 4)]
    assert sibling_pairs(tree, 0.5) == [(3, 4)]
    assert sibling_pairs(tree, 1.0) == []  # more than the margin, not equal to it


def test_the_buffer_keeps_the_newest_pairs_and_draws_without_replacement() -> None:
    buffer = PairBuffer(size=3, seed=0)
    pairs = [[Trajectory(f"t{i}", "t", 1, 0)] for i in range(5)]
    buffer.add(pairs[:2])
    buffer.add(pairs[2:])
    assert [p[0].task_id for p in buffer.pairs] == ["t2", "t3", "t4"]
    drawn = buffer.draw(2)
    assert len(drawn) == 2 and len({id(p) for p in drawn}) == 2
    assert len(buffer.draw(10)) == 3


# -- the restore by replay on the built-in world ---------------------------------------------


TASK = "phone_update_contact_email_1"


@pytest.fixture(scope="module")
def pool() -> Iterator[Any]:
    from sandbox import KernelPool

    with KernelPool(size=1, timeout_s=10) as kernel_pool:
        yield kernel_pool


class Recording:
    """The app-world suite, keeping every environment it makes (to read its state after)."""

    def __init__(self, suite: Any) -> None:
        self.suite = suite
        self.envs: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.suite, name)

    def make_env(self, task: Any, sandbox: Any) -> Any:
        self.envs.append(self.suite.make_env(task, sandbox))
        return self.envs[-1]


def play(suite: Any, pool: Any, tokenizer: Any, generator: Any, turns: int) -> Trajectory:
    [traj] = asyncio.run(
        collect_rollouts(
            [RolloutJob(suite.task(TASK), 0, seed=0)], suite=suite, pool=pool,
            generator=generator, tokenizer=tokenizer,
            settings=AgentConfig(max_turns=turns, max_new_tokens=400),
            example=list(worked_example(suite)), max_concurrent=1,
        )
    )  # fmt: skip
    assert not traj.infra_failure, (traj.status, traj.error)
    return traj


def test_replaying_a_paths_turns_restores_the_app_worlds_state(
    suite: Any, pool: Any, tokenizer: Any
) -> None:
    assert suite.replays_exactly
    recording = Recording(suite)
    cells = suite.gold_solution(suite.task(TASK))  # log in, look up, update: the state changes
    messages = [f"Step {i}.\n```python\n{cell}\n```" for i, cell in enumerate(cells)]
    original = ReplayGenerator(ScriptedGenerator(tokenizer, messages), [])
    first = play(recording, pool, tokenizer, original, len(cells))
    changed = recording.envs[-1].state_fingerprint()
    assert changed != recording.envs[-1].start_fingerprint  # the cells did change the world
    # A fresh environment and kernel, the recorded generations replayed: the same world.
    never = ScriptedGenerator(tokenizer, ["the replay must not sample"])
    replay = ReplayGenerator(never, original.generations)
    second = play(recording, pool, tokenizer, replay, len(cells))
    assert recording.envs[-1].state_fingerprint() == changed
    assert [c[0] for c in replay.calls] == [c[0] for c in original.calls]  # same observations
    assert second.tokens == first.tokens and never.turn == 0
    # Restored to the state after the first turn only: not the final one.
    replay = ReplayGenerator(never, original.generations[:1])
    play(recording, pool, tokenizer, replay, 1)
    assert recording.envs[-1].state_fingerprint() != changed


# -- one search on the word task -------------------------------------------------------------


def test_a_search_backs_up_every_rollout_and_pairs_siblings() -> None:
    suite, policy = MultiTurnWordSuite(turns=2), synthetic_policy()
    from loop.generators.hf.generator import HFGenerator

    task = suite.tasks("train")[0]
    settings = SearchSettings(iterations=6, candidates=2, ucb_c=1.0, margin=0.0)
    result = asyncio.run(
        search_task(
            task, suite=suite, pool=NoSandboxPool(), generator=HFGenerator(policy),
            tokenizer=policy.tokenizer,
            agent=AgentConfig(max_turns=2, max_new_tokens=4, max_context_tokens=400),
            example=[], search=settings, score=lambda t: float(t.reward or 0.0), seed=0,
        )
    )  # fmt: skip
    tree = result.tree
    assert result.replay_mismatches == 0 and result.failures == 0
    # every iteration backed up a return through the root: a rollout's, or a terminal leaf's
    # own again (no rollout: its episode had ended there)
    assert tree.nodes[0].visits == 6 and 2 <= len(result.rollouts) <= 6
    assert any(node.terminal for node in tree.nodes)
    assert len(tree.nodes[0].children) == 2  # the first expansion's two candidates
    for index, node in enumerate(tree.nodes[1:], start=1):
        assert node.depth <= 2 and tree.nodes[node.parent or 0].children.count(index) == 1
    for chosen, rejected in result.pairs:  # one turn each, Q as the reward, the prompt shared
        assert (chosen.reward or 0.0) > (rejected.reward or 0.0)
        assert len(chosen.turns) == len(rejected.turns) == 1
        start = chosen.turns[0].output_start
        assert chosen.tokens[:start] == rejected.tokens[:start]
        assert not any(chosen.is_output[:start]) and all(chosen.is_output[start:])


def test_a_candidate_that_repeats_its_siblings_turn_is_the_same_child() -> None:
    """A policy sure of every turn (a script): one child a node, no pair of a turn with itself,
    and the search descends the chain to the episode's end."""
    suite, policy = MultiTurnWordSuite(turns=2), synthetic_policy()
    script = ScriptedGenerator(policy.tokenizer, ["apple pear"])
    settings = SearchSettings(iterations=4, candidates=2, ucb_c=1.0, margin=0.0)
    result = asyncio.run(
        search_task(
            suite.tasks("train")[0], suite=suite, pool=NoSandboxPool(), generator=script,
            tokenizer=policy.tokenizer,
            agent=AgentConfig(max_turns=2, max_new_tokens=4, max_context_tokens=400),
            example=[], search=settings, score=lambda t: float(t.reward or 0.0), seed=0,
        )
    )  # fmt: skip
    nodes = result.tree.nodes
    assert [len(node.children) for node in nodes] == [1, 1, 0]  # root -> turn 1 -> turn 2
    assert nodes[2].terminal and nodes[0].visits == 4 and len(result.rollouts) == 2
    assert result.merged == 2 and result.pairs == []


class DriftingEnv(MultiTurnWordEnv):
    """Its observations carry a count of the environments made (as a word of the tokenizer's
    vocabulary, so the prompt's ids show it): no two episodes agree."""

    made = 0

    def step(self, code: str) -> str:
        return f"{super().step(code)} w{100 + DriftingEnv.made % 50}"


class DriftingSuite(MultiTurnWordSuite):
    def make_env(self, task: Any, sandbox: Any) -> DriftingEnv:
        DriftingEnv.made += 1
        return DriftingEnv(task, turns=self.turns)


def test_a_world_that_does_not_replay_exactly_is_caught_and_not_backed_up() -> None:
    suite, policy = DriftingSuite(turns=3), synthetic_policy()
    from loop.generators.hf.generator import HFGenerator

    settings = SearchSettings(iterations=10, candidates=2, ucb_c=1.0, margin=0.0)
    result = asyncio.run(
        search_task(
            suite.tasks("train")[0], suite=suite, pool=NoSandboxPool(),
            generator=HFGenerator(policy), tokenizer=policy.tokenizer,
            agent=AgentConfig(max_turns=3, max_new_tokens=4, max_context_tokens=400),
            example=[], search=settings, score=lambda t: float(t.reward or 0.0), seed=0,
        )
    )  # fmt: skip
    # a path of two turns or more replays an observation (in its second turn's prompt) that
    # differs from the one recorded: caught, and nothing backed up for it
    assert result.replay_mismatches > 0 and result.failures == 0
    assert result.tree.nodes[0].visits == 10 - result.replay_mismatches


# -- DPO-MCTS learns on the word task -------------------------------------------------------

DPO_MCTS = [
    "train.advantage=preference", "train.loss=dpo", "train.strictly_on_policy=true",
    "train.epochs=1", "train.preference.beta=1.0", "train.preference.search_iterations=4",
    "train.tasks_per_iteration=4",
]  # fmt: skip
SEEDS = (0, 1)


def search_returns(tmp_path: Path) -> tuple[float, float, list[list[float]]]:
    """The mean over SEEDS of iteration 0's search return and of the last two iterations'."""
    curves = [
        [
            r["search/return_mean"]
            for r in run_synthetic(tmp_path / f"{s}", 6, *DPO_MCTS, f"seed={s}")
        ]
        for s in SEEDS
    ]
    start = sum(c[0] for c in curves) / len(curves)
    return start, sum(sum(c[-2:]) / 2 for c in curves) / len(curves), curves


def test_dpo_mcts_raises_the_return_of_its_searches(tmp_path: Path) -> None:
    """The searches' rollouts are the policy's samples: their mean return must rise."""
    start, end, curves = search_returns(tmp_path)
    assert end > start + 0.1, curves


def test_dpo_mcts_with_the_preferences_flipped_does_not_raise_it(
    tmp_path: Path, flipped_preferences: None
) -> None:
    start, end, curves = search_returns(tmp_path)
    assert end < start, curves


def test_the_shipped_config_is_the_papers_dpo_mcts() -> None:
    config = load_config(ROOT / "configs/table1/dpo-mcts.yaml")
    preference = config.train.preference
    assert (config.train.advantage, config.train.loss) == ("preference", "dpo")
    assert preference.search_iterations == 30 and config.train.strictly_on_policy


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["suite=appworld"], "DPO-MCTS restores states by replay, which suite appworld cannot"),
        (["train.off_policy.old_logprobs=sampler", "generator.backend=hf", "model.dtype=float32"],
         "train.off_policy.old_logprobs: DPO-MCTS needs recompute"),
        (["train.reward=success"], "DPO-MCTS's pairs carry Q values"),
    ],
)  # fmt: skip
def test_dpo_mcts_refuses_what_cannot_restore_or_reference(
    overrides: list[str], message: str
) -> None:
    config = load_config(ROOT / "configs/table1/dpo-mcts.yaml", overrides)
    with pytest.raises(ConfigError, match=message) as caught:
        check_run(config, world_size=1)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "override", ["train.preference.search_iterations=-1", "train.preference.buffer_size=0"]
)
def test_bad_search_settings_are_one_line_errors(override: str) -> None:
    with pytest.raises(ConfigError, match=r"^train\.preference"):
        load_config(ROOT / "configs/table1/dpo-mcts.yaml", [override])
