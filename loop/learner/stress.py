"""The memory stress test (`train.stress_test`): before the first iteration, forward and backward
one synthetic rollout of `train.max_seq_len` tokens with every loss term on, so a configuration
that cannot fit fails in seconds with a one-line error, not after an iteration's rollouts
(`Learner.stress_test` runs the rollout of `stress_rollout`)."""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from loop.config import ConfigError
from loop.learner.batch import Sample


def stress_test(forward_backward: Callable[[int], float], seq_len: int) -> float:
    """`forward_backward(seq_len)` (the learner's `stress_test`), timed on stderr; returns the
    loss. Out of memory is a `ConfigError` naming the settings that lower the peak."""
    started = time.monotonic()
    try:
        loss = forward_backward(seq_len)
    except torch.OutOfMemoryError:
        raise ConfigError(
            f"the stress test ran out of memory at train.max_seq_len={seq_len}: lower "
            "train.max_seq_len, enable model.gradient_checkpointing, lower "
            "train.logprob_chunk_size, or use a smaller model / model.load_in_4bit"
        ) from None
    elapsed = time.monotonic() - started
    print(f"stress test: {seq_len} tokens forward+backward in {elapsed:.1f} s", file=sys.stderr)
    return loss


def stress_rollout(seq_len: int, tokenizer: Any, *, values: bool, reference: bool) -> Sample:
    """A rollout of `seq_len` tokens: a repeated ordinary token (`filler_token`) with its last
    90% marked as output (as the reference code does), with what the optional terms read: old
    values and returns (`values`: a critic), reference log-probs (`reference`: a KL)."""
    tokens = torch.full((seq_len,), filler_token(tokenizer), dtype=torch.long)
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
    if values:
        sample.old_values, sample.returns = torch.zeros(seq_len), torch.ones(seq_len)
    if reference:
        sample.ref_logprobs = torch.zeros(seq_len)
    return sample


def filler_token(tokenizer: Any) -> int:
    """The id of " the" in `tokenizer` (0 if it has none)."""
    ids = tokenizer(" the", add_special_tokens=False)["input_ids"]
    return int(ids[0]) if ids else 0
