"""Credit assignment for one iteration: rewards of grouped rollouts -> an advantage per turn.

The glue between trajectories and the pure math of loop/algo/advantages.py: pack the groups (the K
rollouts of each drawn task) into padded (G, K) tensors, call the configured estimator, filter
by |A|, and unpack. Rollouts that failed for an infrastructure reason, or were not scored, are
"not present": excluded from the baseline of their group and from learning, and counted.

`rollout_reward` is the training reward: `fraction` (of tests passed, the paper's), `success`
(1.0 when all passed), or `acted`: the fraction where the collateral test (nothing else was
changed) counts only once the agent acted. Without it a rollout that does nothing earns the
collateral test's share (0.5 on a two-test task) and can beat a plausible wrong attempt, so a
policy can learn to do nothing. Acting is read off the outcome, never off what was called: the
final state differs from the initial one (`TestReport.state_changed`: a change undone is none),
or a test other than the collateral one passed (the right answer to a question changes
nothing). So reads, a write undone, or `complete_task` alone earn nothing, whatever the APIs
are named. What is collateral and whether the state changed is the suite's knowledge, not
ours: its grader marks both; a suite that does not (`TaskSuite.marks_collateral` False) is
refused `reward: acted` by `loop.checks.check_run`.

`turn_rewards` is the one named per-turn reward used by the turn-level (MT-GRPO) estimator: a
turn earns 1.0 when its code ran without an error, a timeout or a crash and every API call it
made succeeded; 0.0 otherwise (including a turn with no code).

The learned-critic methods (`gae`, `verlog`) need no group: every scored rollout is kept, its
turn advantages stay 0 here, and the per-token advantages come later from the value head's
predictions (loop/learner/critic.py `assign_gae`), with the reward recorded in `Credit.rewards`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from loop.algo.advantages import (
    Advantages,
    compute_filter_advantages,
    compute_group_advantages,
    compute_loo_advantages,
    compute_reinforce_advantages,
    compute_turn_advantages,
    filter_by_magnitude,
)
from loop.algo.preference import preference_signs


@dataclass
class Credit:
    """Per-rollout results, parallel to the flattened groups."""

    turn_advantages: list[list[float]]  # the advantage of each turn of each rollout
    magnitude: list[float]  # max |A| over the rollout's turns (the filter's key)
    keep: list[bool]  # trained on this iteration
    present: list[bool]  # scored and not an infrastructure failure
    groups_dropped: int  # groups left with fewer survivors than the estimator needs
    excluded: int  # rollouts not present
    rewards: list[float] = field(default_factory=list)  # the training reward of each rollout

    def with_turn_advantages(self, means: Mapping[int, Mapping[int, float]]) -> Credit:
        """A copy whose rollouts' per-turn advantages are replaced where `means` has them
        (rollout index -> turn -> advantage: the learned critic's per-turn means)."""
        turns = [list(advantages) for advantages in self.turn_advantages]
        for rollout, by_turn in means.items():
            for turn, value in by_turn.items():
                if 0 <= turn < len(turns[rollout]):
                    turns[rollout][turn] = value
        return dataclasses.replace(self, turn_advantages=turns)

    @classmethod
    def empty(cls, groups_dropped: int = 0) -> Credit:
        """No rollouts yet (filled in group order by `assign_credit`)."""
        return cls(
            turn_advantages=[], magnitude=[], keep=[], present=[],
            groups_dropped=groups_dropped, excluded=0,
        )  # fmt: skip


class ScoredTurn(Protocol):
    """What credit assignment reads of one turn (loop.rollout.trajectory.Turn)."""

    @property
    def code(self) -> str | None: ...
    @property
    def error(self) -> str | None: ...
    @property
    def timed_out(self) -> bool: ...
    @property
    def crashed(self) -> bool: ...
    @property
    def api_calls(self) -> list[dict[str, Any]]: ...


class Scored(Protocol):
    """What credit assignment reads of one rollout (loop.rollout.trajectory.Trajectory): its
    outcome, its tests and API calls as recorded (`tasks.core.TestResult` / `ApiCall` fields),
    and its turns."""

    @property
    def status(self) -> str: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def success(self) -> bool | None: ...
    @property
    def tests(self) -> list[dict[str, Any]]: ...
    @property
    def state_changed(self) -> bool | None: ...
    @property
    def api_calls(self) -> list[dict[str, Any]]: ...
    @property
    def turns(self) -> Sequence[ScoredTurn]: ...
    @property
    def infra_failure(self) -> bool: ...


def rollout_reward(traj: Scored, kind: str) -> float:
    """The training reward (see the module docstring): fraction, success or acted."""
    if kind == "success":
        return float(bool(traj.success))
    if kind == "acted" and traj.tests and not acted(traj):
        return 0.0  # it passed no test but the collateral one, which then does not count
    return float(traj.reward or 0.0)


def acted(traj: Scored) -> bool:
    """The agent changed the apps' data (its suite says the final state differs from the
    initial one) or passed a test that is not collateral (e.g. answered a question right)."""
    if traj.state_changed:
        return True
    return any(t["passed"] and not t.get("collateral", False) for t in traj.tests)


def turn_rewards(traj: Scored) -> list[float]:
    """1.0 for a turn whose code ran cleanly and whose API calls all succeeded, else 0.0."""
    rewards = []
    for turn in traj.turns:
        clean = turn.code is not None and not (turn.error or turn.timed_out or turn.crashed)
        calls_ok = all(call.get("ok", call.get("error") is None) for call in turn.api_calls)
        rewards.append(1.0 if clean and calls_ok else 0.0)
    return rewards


def assign_credit(
    groups: Sequence[Sequence[Scored]],
    *,
    method: str,
    reward: str,
    threshold: float,
    normalize: bool = False,
    turn_coef: float = 1.0,
    return_threshold: float = 1.0,
    margin: float = 0.0,
) -> Credit:
    """Advantages for every rollout of every group (method: loo, grpo, turn, reinforce,
    filter or preference; `return_threshold` is filter's, `margin` preference's: A = +1 / -1
    for the chosen / rejected member of a pair, loop/algo/preference.py)."""
    if not any(groups):  # nothing collected (or a learner process that collects nothing)
        return Credit.empty()
    width = max(len(g) for g in groups)
    shape = (len(groups), width)
    rewards = torch.zeros(shape, dtype=torch.float64)
    present = torch.zeros(shape, dtype=torch.bool)
    max_turns = max((len(t.turns) for g in groups for t in g), default=0) or 1
    turn_r = torch.zeros((*shape, max_turns), dtype=torch.float64)
    turn_mask = torch.zeros((*shape, max_turns), dtype=torch.bool)
    for g, group in enumerate(groups):
        for k, traj in enumerate(group):
            present[g, k] = not traj.infra_failure and traj.reward is not None
            rewards[g, k] = rollout_reward(traj, reward)
            per_turn = turn_rewards(traj)
            turn_r[g, k, : len(per_turn)] = torch.tensor(per_turn, dtype=torch.float64)
            turn_mask[g, k, : len(per_turn)] = True
    if method == "turn":
        out = compute_turn_advantages(rewards, turn_r, present, turn_mask, turn_coef=turn_coef)
        per_turn_adv, valid, kept_groups = out.turn_advantages, out.valid, out.kept_groups
        magnitude = per_turn_adv.abs().masked_fill(~turn_mask, 0).amax(dim=-1)
    else:
        if method == "loo":
            adv = compute_loo_advantages(rewards, present, normalize_std=normalize)
        elif method == "grpo":
            adv = compute_group_advantages(rewards, present)
        elif method == "reinforce":
            adv = compute_reinforce_advantages(rewards, present)
        elif method == "filter":
            adv = compute_filter_advantages(rewards, present, threshold=return_threshold)
        elif method == "preference":
            adv = Advantages(*preference_signs(rewards, present, margin=margin))
        elif method in ("gae", "verlog"):  # per token, from the critic, after this step
            adv = compute_reinforce_advantages(rewards, present)
            adv = adv._replace(advantages=torch.zeros_like(adv.advantages))
            threshold = 0.0  # nothing to filter on yet: every scored rollout is trained
        else:
            raise ValueError(f"unknown advantage estimator {method!r}")
        valid, kept_groups = adv.valid, adv.kept_groups
        per_turn_adv = adv.advantages[..., None].expand(*shape, max_turns)
        magnitude = adv.advantages.abs()
    valid_magnitude = torch.where(valid, magnitude, torch.zeros_like(magnitude))
    keep = filter_by_magnitude(valid_magnitude, valid, threshold)
    credit = Credit.empty(groups_dropped=int((~kept_groups).sum()))
    for g, group in enumerate(groups):
        for k, traj in enumerate(group):
            credit.turn_advantages.append(per_turn_adv[g, k, : max(len(traj.turns), 1)].tolist())
            credit.magnitude.append(float(magnitude[g, k]))
            credit.keep.append(bool(keep[g, k]))
            credit.present.append(bool(present[g, k]))
            credit.excluded += not bool(present[g, k])
            credit.rewards.append(float(rewards[g, k]))
    return credit
