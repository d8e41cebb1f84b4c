"""Decode attention for the `hf` engine: one query per row over its prefix view and its own slot.

Each part (the row's own slot; each prefix entry, read once for every row that views it) gives
its softmax-normalised output and its log-sum-exp, and the parts are merged exactly:
`out = sum_p exp(lse_p - lse) out_p` with `lse = log sum_p exp(lse_p)`, as cascade attention
does, so a row's output equals attention over the concatenation of its keys.

Two kernels compute a part: `fused=True` runs torch's CPU flash-attention kernel, which returns
the log-sum-exp with the output in one pass (1.7x the math version's speed per layer at 8 rows
over a 1,500-token prefix, benchmarks/README.md); `fused=False` runs the same math as matrix
products and a softmax, on any device (the reference, and the path on GPUs).

`StepIndex` holds what one decode step's layers share (masks, each entry's rows), built once per
step rather than once per layer. Shapes: B rows, kvh key/value heads, G query heads per key
head, D head dim, W own-slot width, P an entry's width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from loop.generators.hf.kvcache import PrefixEntry


@dataclass
class PrefixGroup:
    """The rows viewing one prefix entry, and their mask over its first `width` tokens."""

    entry: PrefixEntry
    members: Tensor  # (b,) indices of the rows (their slots), ascending
    width: int  # the longest view among them
    bias: Tensor  # (1, 1, b * G, width): 0, or -inf past a row's view; queries row-major


@dataclass
class StepIndex:
    """The index tensors of one decode step, shared by every layer."""

    own_bias: Tensor  # (B, 1, 1, W): 0, or -inf past a row's length
    prefixes: list[PrefixGroup]


def step_index(
    lengths: Tensor, views: list[tuple[PrefixEntry | None, int]], groups: int
) -> StepIndex:
    """lengths: (B,) own tokens before this step's; views: each row's (entry, n_prefix)."""
    device = lengths.device
    own_past = torch.arange(int(lengths.max()) + 1, device=device)[None] > lengths[:, None]
    members: dict[PrefixEntry, list[int]] = {}
    for i, (entry, n_prefix) in enumerate(views):
        if entry is not None and n_prefix:
            members.setdefault(entry, []).append(i)
    prefixes = []
    for entry, rows in members.items():
        limits = torch.tensor([views[i][1] for i in rows], device=device)
        width = int(limits.max())
        past = torch.arange(width, device=device)[None] >= limits[:, None]  # (b, width)
        bias = _bias(past.repeat_interleave(groups, 0))[None, None]
        prefixes.append(PrefixGroup(entry, torch.tensor(rows, device=device), width, bias))
    return StepIndex(_bias(own_past)[:, None, None], prefixes)


def decode_attention(
    index: int,
    q: Tensor,
    keys: Tensor,
    values: Tensor,
    step: StepIndex,
    *,
    scale: float,
    fused: bool,
) -> Tensor:
    """Layer `index`'s attention. q: (B, kvh * G, 1, D); keys/values: (B, kvh, W, D) own
    slots (float32). Returns (B, kvh * G, 1, D)."""
    batch, kv_heads, _, head_dim = keys.shape
    qg = q.view(batch, kv_heads, -1, head_dim)  # (B, kvh, G, D)
    out, lse = _part(qg, keys, values, step.own_bias, scale, fused)
    for group in step.prefixes:
        kv = group.entry.kv[index, :, :, : group.width].float()  # (2, kvh, P, D)
        b = len(group.members)
        every = b == batch  # every row views it: no gather or scatter
        rows_q = qg if every else qg[group.members]
        shared_q = rows_q.permute(1, 0, 2, 3).reshape(1, kv_heads, -1, head_dim)
        p_out, p_lse = _part(shared_q, kv[0][None], kv[1][None], group.bias, scale, fused)
        p_out = p_out.view(kv_heads, b, -1, head_dim).transpose(0, 1)  # (b, kvh, G, D)
        p_lse = p_lse.view(kv_heads, b, -1).transpose(0, 1)  # (b, kvh, G)
        r_out, r_lse = (out, lse) if every else (out[group.members], lse[group.members])
        top = torch.maximum(r_lse, p_lse)
        a, c = torch.exp(r_lse - top), torch.exp(p_lse - top)
        merged_out = (a[..., None] * r_out + c[..., None] * p_out) / (a + c)[..., None]
        merged_lse = top + torch.log(a + c)
        if every:
            out, lse = merged_out, merged_lse
        else:
            out = out.index_copy(0, group.members, merged_out)
            lse = lse.index_copy(0, group.members, merged_lse)
    return out.reshape(batch, -1, 1, head_dim)


def _part(
    q: Tensor, keys: Tensor, values: Tensor, bias: Tensor, scale: float, fused: bool
) -> tuple[Tensor, Tensor]:
    """q (N, h, L, D) over keys/values (N, h, S, D) with an additive mask `bias` broadcast to
    (N, h, L, S): the normalised output (N, h, L, D) and the log-sum-exp (N, h, L)."""
    if fused:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, keys, values, attn_mask=bias, scale=scale
        )
        return out, lse
    scores = torch.matmul(q, keys.transpose(-1, -2)) * scale + bias  # (N, h, L, S)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), values), lse


def _bias(past: Tensor) -> Tensor:
    """0 where attended, -inf past the end (float32)."""
    return torch.zeros(past.shape, device=past.device).masked_fill(past, float("-inf"))
