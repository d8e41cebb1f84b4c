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


def test_every_step_after_the_first_runs_beside_the_optimizers_states() -> None:
    """AdamW makes its states at its first step; a run's later steps hold them through the
    forward and backward, so the traced peak (a snapshot at its moment) holds them too."""
    lora, full = run_traces(
        [TraceRequest(SHAPES["tiny"], 2, seq_len=256, lora_rank=rank) for rank in (16, None)]
    )
    assert lora.by_kind["OptState"] > 0 and full.by_kind["OptState"] > 0


def test_one_process_holds_a_full_fine_tuning_once_tied_weights_once() -> None:
    """One process trains without FSDP: its weights, gradients and AdamW states once each (a
    tied embedding counted once), and no reduce-scatter buffers (the one-rank FSDP trace held
    float32 copies of the root group's gradients that a plain step never makes)."""
    tied = dict(SHAPES["tiny"], tie_word_embeddings=True)
    one, two = run_traces([TraceRequest(tied, n, seq_len=256, lora_rank=None) for n in (1, 2)])
    weights = parameter_count(tied) * 2  # bfloat16, the request's dtype
    assert one.trainable == one.parameters == parameter_count(tied)
    assert one.by_kind["Sharded Param"] == pytest.approx(weights, rel=0.01)
    assert one.by_kind["OptState"] == pytest.approx(2 * weights, rel=0.01)  # AdamW's two moments
    assert not one.by_kind.get("Reduce Scatter") and not one.by_kind.get("Unsharded Grad")
    assert two.by_kind["Sharded Param"] == pytest.approx(weights / 2, rel=0.05)
