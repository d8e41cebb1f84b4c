"""The traced learner step (loop/preflight/trace.py) on a tiny shape, in one subprocess.

Run: python -m pytest tests/preflight/test_trace.py      (about 20 s on 2 cores: the imports)
"""

from __future__ import annotations

import pytest

from loop.preflight.shapes import SHAPES, lora_parameter_count, parameter_count
from loop.preflight.trace import TraceRequest, run_traces


def test_two_ranks_hold_half_the_parameters_of_one() -> None:
    one, two = run_traces([TraceRequest(SHAPES["tiny"], n, seq_len=256) for n in (1, 2)])
    sharded = [r.by_kind["Sharded Param"] for r in (one, two)]
    assert sharded[1] == pytest.approx(sharded[0] / 2, rel=0.02), sharded
    assert one.parameters == two.parameters == parameter_count(SHAPES["tiny"])
    assert one.trainable == two.trainable == lora_parameter_count(SHAPES["tiny"], 16)
    assert "Unsharded Param" not in one.by_kind  # one process holds no gathered copy
    assert one.peak_bytes > 0 and two.by_kind["Unsharded Param"] > 0


def test_activations_grow_linearly_with_the_rollout() -> None:
    """8x the tokens, 8x the activations: no (T, T) causal mask, which transformers keeps for
    fake inputs and the real (unpadded) step never holds."""
    short, long = run_traces([TraceRequest(SHAPES["tiny"], 1, seq_len=n) for n in (256, 2048)])
    ratio = long.by_kind["Activation"] / short.by_kind["Activation"]
    assert 7 < ratio < 9, ratio
