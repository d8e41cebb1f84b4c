"""DPO-MCTS's search ([P] App. C, a simplified Agent Q): a tree over turns per task, and the
persistent replay buffer of the preference pairs it finds.

One search (`search_task`) runs `iterations` times (up to 30 in [P]): UCB selects a leaf
(loop/algo/mcts.py); the leaf's state is restored by replaying its path's turns into a fresh
environment and sandbox; the policy samples the next turn there and the episode is rolled out
to the end (one rollout, scored by the environment's own tests); a second candidate turn is
sampled from the same prompt and not rolled out; the rollout's return is backed up from the
first candidate to the root. [P]'s 2 candidates per expansion are `candidates`. A candidate
that repeats a sibling's turn token for token is the same action from the same state, so the
same child: it is not added (`search/merged_candidates`), and a node whose policy is sure of its
turn grows one child, which the next selection descends through instead of pairing a turn with
itself (a warm-started policy writes its log-in turn the same way nearly every time).

Restoring by replay: `ReplayGenerator` answers the episode's first calls with the path's
recorded generations, so the real episode loop (loop/rollout/agent.py) runs their code, in
order, against a fresh reset of the task: the state after the path, given a world where the
same code from the same start gives the same state. Only a suite that says so
(`TaskSuite.replays_exactly`: the built-in world) may be searched (loop/checks.py); each replay
is still checked, token for token: the prompt the replay reaches before each recorded turn
must be the one it was sampled from (the observations are in it), and its start fingerprint
the search's first rollout's, else the iteration is counted in `search/replay_mismatches` and
skipped.

Pairs: the siblings whose Q gap exceeds `train.preference.margin` (`sibling_pairs`) become two
one-turn `Trajectory`s each: the node's prompt (never trained) and the candidate's sampled ids
(the only output), with the candidate's Q as their reward, so the trainer's preference credit
(+1 / -1) and the DPO loss (DMPO's with one turn) train them unchanged. `PairBuffer` keeps the
newest `buffer_size` pairs across iterations ([P]: a persistent offline replay buffer; saved
with each checkpoint, so a resumed run draws from the pairs and the random state it had) and
each iteration trains on `pairs_per_iteration` of them drawn at random. The rollouts
themselves are not trained on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from loop.algo.mcts import Tree, backup, select, sibling_pairs
from loop.config import AgentConfig, RunConfig
from loop.generators.base import Generation, Generator, GeneratorStats, SamplingParams
from loop.generators.tokenizer import Tokenizer
from loop.rollout.codeblocks import extract_code
from loop.rollout.collect import RolloutJob, SandboxPool, collect_rollouts
from loop.rollout.prompt import prompt_example
from loop.rollout.trajectory import Trajectory, Turn
from loop.seeds import candidate_seed, rollout_seed, search_seed
from tasks import Task, TaskSuite

CANDIDATES = 2  # candidate turns per expansion ([P] App. C)
UCB_C = 1.0  # UCB's exploration constant: returns lie in [0, 1] ([P] gives none)

Call = tuple[list[int], SamplingParams, list[dict[str, str]] | None]


@dataclass(frozen=True)
class Candidate:
    """A turn of the tree: the exact prompt it was sampled from and what was sampled."""

    prompt: list[int]
    generation: Generation


class ReplayGenerator:
    """The policy's generator, except that its first calls return `prefix`'s generations (a
    node's path, replayed); records every call's prompt and answer."""

    def __init__(self, inner: Generator, prefix: Sequence[Generation]) -> None:
        self.inner, self.prefix = inner, list(prefix)
        self.name, self.shares_weights = inner.name, inner.shares_weights
        self.calls: list[Call] = []
        self.generations: list[Generation] = []

    @property
    def version(self) -> str:
        """The inner generator's."""
        return self.inner.version

    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        messages: list[dict[str, str]] | None = None,
    ) -> Generation:
        """The next recorded generation while the prefix lasts, then the policy's sample."""
        index = len(self.calls)
        self.calls.append((list(prompt_token_ids), params, messages))
        if index < len(self.prefix):
            generation = self.prefix[index]
        else:
            generation = await self.inner.generate(prompt_token_ids, params, messages=messages)
        self.generations.append(generation)
        return generation

    def load_adapter(self, path: Path | None) -> None:
        """Not for a replay: the trainer publishes to the inner generator."""
        raise RuntimeError("a replay generator does not load adapters")

    def release_memory(self) -> None:
        """The inner generator's."""
        self.inner.release_memory()

    def stats(self) -> GeneratorStats:
        """The inner generator's."""
        return self.inner.stats()

    async def close(self) -> None:
        """Nothing: the inner generator outlives the replay."""


@dataclass
class SearchResult:
    """One task's search: its tree, its rollouts, its pairs as two-trajectory groups."""

    tree: Tree
    rollouts: list[Trajectory] = field(default_factory=list)
    pairs: list[list[Trajectory]] = field(default_factory=list)
    replay_mismatches: int = 0
    failures: int = 0  # rollouts with an infrastructure status (nothing backed up)
    merged: int = 0  # candidates that repeated a sibling's turn (not added)


@dataclass(frozen=True)
class SearchSettings:
    """One search's knobs (train.preference; [P] App. C)."""

    iterations: int  # tree iterations per task ([P]: up to 30)
    candidates: int  # candidate turns per expansion ([P]: 2)
    ucb_c: float  # UCB's exploration constant
    margin: float  # the Q gap a pair must exceed


async def search_task(
    task: Task,
    *,
    suite: TaskSuite,
    pool: SandboxPool,
    generator: Generator,
    tokenizer: Tokenizer,
    agent: AgentConfig,
    example: list[dict[str, str]],
    search: SearchSettings,
    score: Callable[[Trajectory], float],
    seed: int,
) -> SearchResult:
    """The tree search of one task (module docstring); `score` is the training reward of a
    rollout, `seed` the search's (each rollout's: loop/seeds.py `search_seed`)."""
    result = SearchResult(Tree())
    tree = result.tree
    ended_with: dict[int, float] = {}  # a terminal node -> the return its episode ended with
    start: str | None = None
    for iteration in range(search.iterations):
        leaf = select(tree, search.ucb_c)
        if tree.nodes[leaf].terminal:
            backup(tree, leaf, ended_with[leaf])
            continue
        path = [tree.nodes[i].payload for i in tree.path(leaf)[1:]]
        replay = ReplayGenerator(generator, [c.generation for c in path])
        job = RolloutJob(task, sample_index=iteration, seed=search_seed(seed, iteration))
        (traj,) = await collect_rollouts(
            [job],
            suite=suite,
            pool=pool,
            generator=replay,
            tokenizer=tokenizer,
            settings=agent,
            example=example,
            max_concurrent=1,
        )
        result.rollouts.append(traj)
        if traj.infra_failure or traj.reward is None:
            result.failures += 1
            continue
        start = start or traj.start_fingerprint  # the first scored rollout's
        if traj.start_fingerprint != start or any(
            c.prompt != call[0] for c, call in zip(path, replay.calls, strict=False)
        ):
            result.replay_mismatches += 1  # the world did not replay exactly: no back-up
            continue
        value, depth = score(traj), len(path)
        if len(traj.turns) <= depth:  # the episode ended within the path: the leaf is an end
            tree.nodes[leaf].terminal, ended_with[leaf] = True, value
            backup(tree, leaf, value)
            continue
        prompt, params, messages = replay.calls[depth]
        first = tree.add_child(leaf, Candidate(prompt, replay.generations[depth]))
        turns = [list(replay.generations[depth].token_ids)]  # the leaf's children's
        for k in range(1, search.candidates):
            seed_k = None if params.seed is None else candidate_seed(params.seed, k)
            other = dataclasses.replace(params, seed=seed_k)
            sampled = await generator.generate(prompt, other, messages=messages)
            if list(sampled.token_ids) in turns:  # the same turn: the same child
                result.merged += 1
                continue
            turns.append(list(sampled.token_ids))
            tree.add_child(leaf, Candidate(prompt, sampled))
        if len(traj.turns) == depth + 1:
            tree.nodes[first].terminal, ended_with[first] = True, value
        backup(tree, first, value)
    for chosen, rejected in sibling_pairs(tree, search.margin):
        members = [(tree.nodes[i].payload, tree.nodes[i].q) for i in (chosen, rejected)]
        result.pairs.append(
            [one_turn_trajectory(task, k, c, q, tokenizer) for k, (c, q) in enumerate(members)]
        )
    return result


def one_turn_trajectory(
    task: Task, sample_index: int, candidate: Candidate, q: float, tokenizer: Tokenizer
) -> Trajectory:
    """A pair member as the learner takes it: the prompt (not trained), the candidate's ids
    (the output) and its Q as the reward. Without the sampler's log-probs (NaN): a pair drawn
    from the buffer was sampled by older weights, and its reference is the learner's recompute
    of this iteration, so it has no parity with a sampler to report."""
    traj = Trajectory(task.id, task.scenario_id, task.difficulty, sample_index)
    traj.append(candidate.prompt, output=False)
    traj.prompt_length = start = len(traj.tokens)
    generation = candidate.generation
    traj.append(list(generation.token_ids), output=True)  # no sampler log-probs: see below
    text = generation.text
    if text is None:
        text = tokenizer.decode(generation.token_ids, skip_special_tokens=True)
    code = extract_code(text)
    traj.turns.append(Turn(start, len(traj.tokens), generation.finish_reason, text, code))
    traj.reward, traj.status = q, "ok"
    return traj


class PairBuffer:
    """The persistent replay buffer of pairs: the newest `size` kept, draws seeded."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.pairs: list[list[Trajectory]] = []
        self.rng = random.Random(seed)

    def add(self, pairs: Sequence[list[Trajectory]]) -> None:
        """Keep `pairs`, dropping the oldest beyond the size."""
        self.pairs = [*self.pairs, *pairs][-self.size :]

    def draw(self, count: int) -> list[list[Trajectory]]:
        """`count` pairs at random without replacement (all of them when fewer)."""
        return self.rng.sample(self.pairs, min(count, len(self.pairs)))

    def state_dict(self) -> dict[str, Any]:
        """The pairs (as rollout records) and the draws' random state, for a checkpoint."""
        pairs = [[member.to_json() for member in pair] for pair in self.pairs]
        return {"pairs": pairs, "rng": self.rng.getstate()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pairs = [[Trajectory.from_json(m) for m in pair] for pair in state["pairs"]]
        self.rng.setstate(state["rng"])


class SearchParts(Protocol):
    """What a search runs on (loop.parts.TrainParts)."""

    suite: TaskSuite
    pool: SandboxPool
    generator: Generator
    tokenizer: Tokenizer


async def search_pairs(
    parts: SearchParts,
    tasks: Sequence[Task],
    iteration: int,
    config: RunConfig,
    max_turns: int,
    buffer: PairBuffer,
    score: Callable[[Trajectory], float],
) -> tuple[list[list[Trajectory]], int, dict[str, float]]:
    """One iteration's collection under DPO-MCTS: a search per task (concurrently, each of
    `train.preference.search_iterations`), their pairs added to `buffer`, and
    `pairs_per_iteration` of the buffer's pairs as two-rollout groups; with 0 discarded and the
    metrics `search/*` (`return_mean`: the mean return of the searches' rollouts)."""
    preference = config.train.preference
    settings = SearchSettings(
        preference.search_iterations, CANDIDATES, UCB_C, margin=preference.margin
    )
    agent = dataclasses.replace(config.agent, max_turns=max_turns)
    example = prompt_example(parts.suite, config.agent.worked_example)
    slots = asyncio.Semaphore(config.train.max_concurrent_rollouts)  # a search: one at a time

    async def search(g: int, task: Task) -> SearchResult:
        async with slots:
            return await search_task(
                task, suite=parts.suite, pool=parts.pool, generator=parts.generator,
                tokenizer=parts.tokenizer, agent=agent, example=example, search=settings,
                score=score, seed=rollout_seed(config.seed, iteration, g, 0),
            )  # fmt: skip

    results = await asyncio.gather(*(search(g, task) for g, task in enumerate(tasks)))
    for result in results:
        buffer.add(result.pairs)
    rollouts = [t for r in results for t in r.rollouts if t.reward is not None]
    metrics = {
        "search/return_mean": sum(score(t) for t in rollouts) / max(len(rollouts), 1),
        "search/rollouts": float(sum(len(r.rollouts) for r in results)),
        "search/new_pairs": float(sum(len(r.pairs) for r in results)),
        "search/buffer_pairs": float(len(buffer.pairs)),
        "search/replay_mismatches": float(sum(r.replay_mismatches for r in results)),
        "search/failures": float(sum(r.failures for r in results)),
        "search/merged_candidates": float(sum(r.merged for r in results)),
    }
    return buffer.draw(preference.pairs_per_iteration), 0, metrics
