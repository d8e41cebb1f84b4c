"""From finished rollouts to what the learner trains on: one `Sample` of tensors per rollout.

A sample keeps the rollout's flat token sequence and its loss mask exactly as collected
(loop/rollout/trajectory.py): `is_output` is True only for ids the policy sampled, so the
prompt, the chat-template glue and every observation get no gradient. The advantage is stored per
token so that trajectory-level credit (one scalar broadcast to all output tokens, the paper's
default) and turn-level credit (MT-GRPO) share one code path. `turn_ids` names each output token's
turn for per-turn importance weights.

Rollouts longer than `max_seq_len` are cut to their first `max_seq_len` tokens and still
trained on (as the reference code does); the cut is counted by the caller.

A rollout generated with a memory window (`agent.memory_turns`, Verlog) becomes one sample per
turn instead (`make_samples`): the turn's exact prompt ids (`Trajectory.prompt_ids`) and its
sampled ids, with `positions` mapping each token back to the episode, so the learner batches
turns and the rollouts file still gets the log-probs of the whole episode.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from loop.rollout.trajectory import Trajectory


@dataclass
class Sample:
    """One rollout, ready for the learner. All tensors are (T,) on the CPU."""

    tokens: Tensor  # int64
    is_output: Tensor  # bool: the loss mask
    sampler_logprobs: Tensor  # float32, NaN where not output (or the backend gave none)
    turn_ids: Tensor  # int64: the turn of each output token, -1 elsewhere
    advantages: Tensor  # float32: the advantage each token is trained with (0 off the mask)
    truncated: bool = False
    old_logprobs: Tensor | None = None  # float32, set by the learner's recompute step
    source: int = -1  # the rollout's position in its iteration (to write its log-probs back)
    reward: float = 0.0  # the rollout's training reward (the learned-critic methods' outcome)
    old_values: Tensor | None = None  # float32 V(s_t), set by the recompute step with a critic
    returns: Tensor | None = None  # float32 value targets, set with the GAE advantages
    ref_logprobs: Tensor | None = None  # float32 log-probs with the LoRA adapter disabled
    turn: int = -1  # a windowed rollout's turn (one sample per turn); -1: the whole rollout
    positions: Tensor | None = None  # int64 index of each token in the episode (None: same)

    @property
    def num_output_tokens(self) -> int:
        """How many tokens of this rollout are trained."""
        return int(self.is_output.sum())


def make_sample(
    traj: Trajectory,
    turn_advantages: Sequence[float],
    max_seq_len: int,
    source: int = -1,
    reward: float = 0.0,
) -> Sample:
    """A `Sample` of `traj` whose turn t's output tokens carry `turn_advantages[t]`.

    For trajectory-level credit pass the same advantage for every turn.
    """
    if len(turn_advantages) < len(traj.turns):
        raise ValueError(f"{len(turn_advantages)} turn advantages for {len(traj.turns)} turns")
    length = min(len(traj.tokens), max_seq_len)
    tokens = torch.tensor(traj.tokens[:length], dtype=torch.long)
    is_output = torch.tensor(traj.is_output[:length], dtype=torch.bool)
    sampler = torch.tensor(
        [math.nan if x is None else x for x in traj.sampler_logprobs[:length]],
        dtype=torch.float32,
    )
    turn_ids = torch.full((length,), -1, dtype=torch.long)
    advantages = torch.zeros(length, dtype=torch.float32)
    for index, turn in enumerate(traj.turns):
        start, end = min(turn.output_start, length), min(turn.output_end, length)
        turn_ids[start:end] = index
        advantages[start:end] = float(turn_advantages[index])
    turn_ids[~is_output] = -1
    advantages[~is_output] = 0.0
    truncated = len(traj.tokens) > length
    return Sample(
        tokens, is_output, sampler, turn_ids, advantages, truncated, source=source, reward=reward
    )


def make_samples(
    traj: Trajectory,
    turn_advantages: Sequence[float],
    max_seq_len: int,
    source: int = -1,
    reward: float = 0.0,
) -> list[Sample]:
    """The samples of one rollout: one (`make_sample`), or one per turn with a memory window."""
    if traj.memory_turns is None:
        return [make_sample(traj, turn_advantages, max_seq_len, source, reward)]
    if len(turn_advantages) < len(traj.turns):
        raise ValueError(f"{len(turn_advantages)} turn advantages for {len(traj.turns)} turns")
    samples = []
    for index, turn in enumerate(traj.turns):
        ranges = [*traj.prompt_ranges(index), (turn.output_start, turn.output_end)]
        positions = torch.cat([torch.arange(a, b) for a, b in ranges])[:max_seq_len]
        tokens = torch.tensor(traj.tokens, dtype=torch.long)[positions]
        is_output = torch.tensor(traj.is_output, dtype=torch.bool)[positions]
        is_output &= positions >= turn.output_start  # this turn's sampled ids only
        sampler = torch.tensor(
            [math.nan if x is None else x for x in traj.sampler_logprobs], dtype=torch.float32
        )[positions]
        turn_ids = torch.where(is_output, index, -1)
        advantages = torch.where(is_output, float(turn_advantages[index]), 0.0)
        truncated = sum(b - a for a, b in ranges) > max_seq_len
        samples.append(Sample(
            tokens, is_output, sampler, turn_ids, advantages, truncated, source=source,
            reward=reward, turn=index, positions=positions,
        ))  # fmt: skip
    return samples


def take_sampler_logprobs(samples: Sequence[Sample]) -> dict[str, float]:
    """Set each sample's `old_logprobs` to its sampler's (`train.off_policy.old_logprobs:
    sampler`), 0.0 off the output mask, instead of the learner's recompute pass; returns the
    count as `old_logprobs/sampler_tokens`. Every output token must have one."""
    tokens = 0
    for sample in samples:
        picked = sample.sampler_logprobs[sample.is_output]
        if missing := int((~torch.isfinite(picked)).sum()):
            raise ValueError(
                f"rollout {sample.source}: {missing} output tokens without a sampler log-prob "
                "(train.off_policy.old_logprobs sampler needs every one: use recompute)"
            )
        sample.old_logprobs = torch.where(sample.is_output, sample.sampler_logprobs, 0.0)
        tokens += len(picked)
    return {"old_logprobs/sampler_tokens": float(tokens)}


@dataclass
class Batch:
    """Samples right-padded to one length: every tensor is (B, T_max)."""

    input_ids: Tensor
    attention_mask: Tensor
    is_output: Tensor
    advantages: Tensor
    turn_ids: Tensor
    old_logprobs: Tensor | None
    sampler_logprobs: Tensor
    old_values: Tensor | None = None
    returns: Tensor | None = None
    ref_logprobs: Tensor | None = None


def collate(samples: Sequence[Sample], pad_id: int, device: torch.device) -> Batch:
    """Right-pad `samples` into one batch (padding is masked out of attention and loss)."""
    if not samples:
        raise ValueError("cannot collate an empty list of samples")
    width = max(len(s.tokens) for s in samples)

    def pad(name: str, value: float | int | bool) -> Tensor:
        rows = []
        for sample in samples:
            row = getattr(sample, name)
            filler = torch.full((width - len(row),), value, dtype=row.dtype)
            rows.append(torch.cat([row, filler]))
        return torch.stack(rows).to(device)

    lengths = torch.tensor([len(s.tokens) for s in samples])
    attention_mask = (torch.arange(width)[None, :] < lengths[:, None]).long().to(device)

    def pad_if_set(name: str) -> Tensor | None:
        return pad(name, 0.0) if all(getattr(s, name) is not None for s in samples) else None

    return Batch(
        input_ids=pad("tokens", pad_id),
        attention_mask=attention_mask,
        is_output=pad("is_output", False),
        advantages=pad("advantages", 0.0),
        turn_ids=pad("turn_ids", -1),
        old_logprobs=pad_if_set("old_logprobs"),
        sampler_logprobs=pad("sampler_logprobs", math.nan),
        old_values=pad_if_set("old_values"),
        returns=pad_if_set("returns"),
        ref_logprobs=pad_if_set("ref_logprobs"),
    )


def learner_logprobs(
    samples: Sequence[Sample], lengths: Sequence[int]
) -> dict[int, list[float | None]]:
    """Rollout index -> the samples' recomputed old log-probs on their loss masks, parallel to
    that rollout's `lengths[i]` tokens (None elsewhere), for the rollouts file. A windowed
    rollout has one sample per turn; samples without old log-probs are skipped."""
    values: dict[int, list[float | None]] = {}
    for sample in samples:
        if sample.old_logprobs is None:
            continue
        row = values.setdefault(sample.source, [None] * lengths[sample.source])
        for position in sample.is_output.nonzero().flatten().tolist():
            where = position if sample.positions is None else int(sample.positions[position])
            row[where] = float(sample.old_logprobs[position])
    return values
