"""The `hf` engine's decode attention (`loop/generators/hf/attention.py`): parts merged by their
log-sum-exps equal plain attention over each row's whole key sequence, on both kernels.

Run: python -m pytest tests/loop/test_attention.py -q
"""

from __future__ import annotations

import pytest
import torch

from loop.generators.hf.attention import decode_attention, step_index
from loop.generators.hf.kvcache import PrefixEntry

LAYERS, KV_HEADS, GROUPS, DIM = 2, 2, 3, 8


@pytest.mark.parametrize("fused", [True, False])
def test_parts_merged_equal_attention_over_the_concatenation(fused: bool) -> None:
    """Five rows: three view entry a (to 7, 9 and 9 of its 9 tokens), one views b, one none."""
    torch.manual_seed(0)
    a = PrefixEntry(tuple(range(9)), torch.randn(LAYERS, 2, KV_HEADS, 9, DIM))
    b = PrefixEntry(tuple(range(4)), torch.randn(LAYERS, 2, KV_HEADS, 4, DIM))
    views = [(a, 7), (b, 4), (a, 9), (None, 0), (a, 9)]
    lengths = torch.tensor([3, 0, 5, 2, 1])  # own tokens before this step's
    width = int(lengths.max()) + 1
    own = torch.randn(len(views), 2, KV_HEADS, width, DIM)
    q = torch.randn(len(views), KV_HEADS * GROUPS, 1, DIM)
    step = step_index(lengths, views, GROUPS)
    layer, scale = 1, DIM**-0.5
    got = decode_attention(layer, q, own[:, 0], own[:, 1], step, scale=scale, fused=fused)
    for i, (entry, n_prefix) in enumerate(views):
        prefix = entry.kv[layer, :, :, :n_prefix] if entry else own.new_zeros(2, KV_HEADS, 0, DIM)
        kv = torch.cat([prefix, own[i, :, :, : int(lengths[i]) + 1]], dim=2)  # (2, kvh, S, D)
        keys, values = (part.repeat_interleave(GROUPS, 0) for part in kv)  # (heads, S, D)
        weights = torch.softmax(q[i] @ keys.transpose(-1, -2) * scale, dim=-1)
        want = weights @ values  # (heads, 1, D)
        assert torch.allclose(got[i], want, atol=1e-5), (i, (got[i] - want).abs().max())
