"""The memory stress test (`train.stress_test`): before the first iteration, forward and backward
one synthetic rollout of `train.max_seq_len` tokens with every loss term on, so a configuration
that cannot fit fails in seconds with a one-line error, not after an iteration's rollouts."""

from __future__ import annotations

import math
import sys
import time

import torch

from loop.config import ConfigError
from loop.learner.batch import Sample
from loop.learner.learner import Learner


def stress_test(learner: Learner, seq_len: int) -> float:
    """Forward and backward `stress_rollout` on `learner` (no step; gradients cleared); returns
    the loss. Out of memory is a `ConfigError` naming the settings that lower the peak."""
    started = time.monotonic()
    try:
        loss = learner.loss_backward(stress_rollout(learner, seq_len))
    except torch.OutOfMemoryError:
        raise ConfigError(
            f"the stress test ran out of memory at train.max_seq_len={seq_len}: lower "
            "train.max_seq_len, enable model.gradient_checkpointing, lower "
            "train.logprob_chunk_size, or use a smaller model / model.load_in_4bit"
        ) from None
    elapsed = time.monotonic() - started
    print(f"stress test: {seq_len} tokens forward+backward in {elapsed:.1f} s", file=sys.stderr)
    return loss


def stress_rollout(learner: Learner, seq_len: int) -> Sample:
    """A rollout of `seq_len` tokens: a repeated ordinary token with its last 90% marked as
    output (as the reference code does), with what each of the learner's terms reads (old
    values and returns for a critic, reference log-probs for a KL)."""
    tokens = torch.full((seq_len,), filler_token(learner), dtype=torch.long)
    is_output = torch.zeros(seq_len, dtype=torch.bool)
    is_output[seq_len // 10 :] = True
    advantages = torch.where(is_output, 1.0, 0.0)
    sample = Sample(
        tokens,
        is_output,
        torch.full((seq_len,), math.nan),
        torch.where(is_output, 0, -1),
        advantages,
        old_logprobs=torch.zeros(seq_len),
    )
    if learner.critic is not None:
        sample.old_values, sample.returns = torch.zeros(seq_len), torch.ones(seq_len)
    if learner.needs_reference:
        sample.ref_logprobs = torch.zeros(seq_len)
    return sample


def filler_token(learner: Learner) -> int:
    """The id of " the" in the policy's tokenizer (0 if it has none)."""
    ids = learner.policy.tokenizer(" the", add_special_tokens=False)["input_ids"]
    return int(ids[0]) if ids else 0
