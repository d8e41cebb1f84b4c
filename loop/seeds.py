"""Every seed of a run, derived from `config.seed` in one documented place (STYLE.md habit 13).

Why derived so: a rollout's sampling seed depends only on *which* rollout it is (iteration,
task slot, sample), never on timing or on how many rollouts ran before it, so a resumed run
and an uninterrupted one sample the same tokens, and two rollouts of a run never share a seed.
Each formula mixes its coordinates with distinct primes (a polynomial in them), so neighbouring
coordinates give unrelated seeds; values are kept below 2**62 where a generator needs an int64.
Changing a formula changes every sampled token: the golden curve (tests/loop/test_golden_curve.py)
would say so.

    torch.manual_seed(seed)                     the model's initialisation (LoRA, value head)
    TaskSampler(seed=seed)                      the order tasks are drawn in (loop/rollout/)
    rollout_seed(seed, iteration, group, k)     training rollout k of the group-th drawn task
    eval_seed(seed, task_index, k)              evaluation rollout k of the split's task_index-th
    rft_seed(seed, pass, t_index, task_index)   warm start's rejection sampling (loop/warmstart.py)
    shuffle_seed(seed, iteration)               which samples go to which learner process
    minibatch_seed(seed, step)                  the minibatch order of an iteration (or SFT epoch)
    search_seed(task_seed, tree_iteration)      DPO-MCTS: the rollout of one tree iteration
    candidate_seed(turn_seed, k)                DPO-MCTS: a turn's k-th sibling candidate
"""

from __future__ import annotations

ROLLOUT_SEED_BOUND = 2**62  # training rollouts' seeds are reduced modulo this


def rollout_seed(seed: int, iteration: int, group: int, k: int) -> int:
    """The sampling seed of training rollout `k` of the `group`-th task drawn in `iteration`."""
    return (((seed * 1_000_003 + iteration) * 100_003 + group) * 1009 + k) % ROLLOUT_SEED_BOUND


def eval_seed(seed: int, task_index: int, k: int) -> int:
    """The sampling seed of evaluation rollout `k` of the split's `task_index`-th task (the same
    in every evaluation of a run, so evaluations differ only by the weights)."""
    return seed * 1_000_003 + task_index * 1009 + k


def rft_seed(seed: int, pass_index: int, t_index: int, task_index: int) -> int:
    """The sampling seed of a warm-start rejection-sampling rollout: ladder pass `pass_index`,
    temperature `t_index` of the ladder, the `task_index`-th task."""
    return ((seed * 1_000_003 + pass_index) * 1009 + t_index) * 100_003 + task_index


def shuffle_seed(seed: int, iteration: int) -> int:
    """The seed of the permutation that deals an iteration's samples to the learner processes."""
    return seed + iteration


def minibatch_seed(seed: int, step: int) -> int:
    """The seed of the minibatch order of an RL iteration, or of a warm-start epoch (`step`)."""
    return seed * 7919 + step


def search_seed(task_seed: int, tree_iteration: int) -> int:
    """The seed of the rollout of a task's `tree_iteration`-th DPO-MCTS iteration; `task_seed`
    is the task's `rollout_seed` (loop/rollout/search.py)."""
    return task_seed + 1000 * tree_iteration


def candidate_seed(turn_seed: int, k: int) -> int:
    """The seed of the `k`-th sibling candidate sampled beside a turn sampled with `turn_seed`
    (DPO-MCTS's expansion, loop/rollout/search.py)."""
    return (turn_seed * 31 + k) % 2**31
