"""The `hf` generator's decoding engine for Llama-family models: KV reuse and row slots.

It runs the policy's own modules (embeddings, each layer's norms, the LM head) and their
weights; the projections run fused, one matrix product per group of modules sharing an input
with their LoRA factors (`loop/generators/hf/fused.py`, on the same storage: one copy of the
weights; on a CPU in float32 the products and the LM head read packed copies made while
sampling, `packed=False` for none), `refresh()` re-reads them after a weight change and
`unpack()` drops the packed copies. `fused=False` calls each module
instead (the reference the fused path is tested against). The attention and the cache are
ours. A row's keys and values live in two parts:

- a **prefix view**: the first `n_prefix` tokens of a frozen `PrefixEntry` (`loop/generators/
  kvcache.py`), shared by every row that starts with the same ids and read once per decode
  step for all of them;
- its **own slot**: row i of a preallocated (rows, layers, 2, kv_heads, capacity, head_dim)
  tensor, written in place, one position per decode step (no per-step copy of the cache).

Attention over the two parts is computed separately and merged exactly with their
log-sum-exps (as cascade/shared-prefix attention does), so a row's output equals attention over
the concatenation (`loop/generators/hf/attention.py`; on a CPU by torch's flash kernel unless
`fused=False`). Prefill attention is torch's SDPA, which on a CPU (torch 2.13) already runs the
flash kernel with our boolean mask and grouped heads.

On a GPU keys and values are stored in the model's dtype: they come out of its projections and
rotary embedding in that dtype, so storing them loses nothing (a bfloat16 7B model's 32 rows at
8K tokens hold 14 GiB, not the 28 GiB of float32). The attention math runs in float32 whatever
the model's dtype, as the learner's CPU attention kernel accumulates in float32; so on a CPU,
where memory is plentiful and bytes moved are the cost, they are stored in float32 (the same
values, exactly): a bfloat16 cache would be converted for every layer of every decode step,
which on SmolLM2-135M at 24 rows costs about what its packed bfloat16 products save.
Active rows always occupy slots 0..B-1 in order: a leaving row's slot is filled by the last one.

Memory: the slots' token capacity is the longest row's. `reserve(n)` grows it (by at least a
quarter, so growth is rare, copying once; `slot_capacity`) and the generator calls it when a
request joins, for the request's whole prompt plus `max_new_tokens` at once, before the row's
keys go in (never past `max_tokens`, the generator's `max_context_tokens`): a growth that does
not fit fails that request alone, before it decodes, never a decode step shared by every row.
A growth under active rows holds the old slots beside the new while it copies; with no row
active the old ones are freed first. `loop/generators/hf/memory.py` states what that makes on a
GPU, the rule the preflight plans with. `release()` frees the slots when no row is
active (between turns and while the learner trains). On a CPU the slots are paged in by need
(`loop/generators/hf/pages.py`): the capacity is address space, and only the pages rows write
are resident, so the slots hold about the rows' own tokens, not rows x capacity; with a context
cap (`max_tokens`) the first `reserve` takes the cap at once, so they never grow (a growth would
hold each row's tokens twice while it copies them), and a leaving row's pages go back at once.

Supported: `model_type` llama, mistral, qwen2 and qwen3 (those whose layers are
`input_layernorm -> self_attn(q, k, v, o) -> post_attention_layernorm -> mlp`, full
attention, rotary embeddings). `supports(model)` says whether a model qualifies; the generator
falls back to the plain transformers forward otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from loop.generators.hf.attention import decode_attention, step_index
from loop.generators.hf.fused import Head, LayerProjections, own_storage
from loop.generators.hf.kvcache import PrefixEntry
from loop.generators.hf.memory import slot_capacity
from loop.generators.hf.pages import SlotMemory
from loop.model.aliases import causal_lm

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def supports(model: Any) -> bool:
    """True when `model` (peft-wrapped or not) has a layer layout this engine runs."""
    base = causal_lm(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) not in MODEL_TYPES:
        return False
    layer_types = getattr(config, "layer_types", None) or ()
    if getattr(config, "use_sliding_window", False) or set(layer_types) - {"full_attention"}:
        return False
    inner = getattr(base, "model", None)
    return all(hasattr(inner, name) for name in ("embed_tokens", "layers", "norm", "rotary_emb"))


@dataclass(eq=False)
class Row:
    """One sequence being decoded: its prefix view, its slot and what its KV covers."""

    ids: list[int]  # every id whose KV is cached (prefix view, then own slot), in order
    entry: PrefixEntry | None = None
    n_prefix: int = 0
    slot: int = -1
    reserved: int = 0  # own tokens the row may come to hold (its prompt's and max_new_tokens)

    @property
    def own_length(self) -> int:
        return len(self.ids) - self.n_prefix


class DecoderEngine:
    """Prefill and decode over row slots (see the module docstring). Not thread-safe."""

    def __init__(
        self,
        model: Any,
        *,
        max_rows: int,
        prefill_chunk: int = 512,
        fused: bool = True,
        packed: bool = True,
        max_tokens: int | None = None,
        kv_dtype: torch.dtype | None = None,
    ):
        if max_rows < 1 or prefill_chunk < 1 or (max_tokens or 1) < 1:
            raise ValueError(
                f"bad engine sizes: max_rows={max_rows}, chunk={prefill_chunk}, "
                f"max_tokens={max_tokens}"
            )
        self.max_tokens = max_tokens  # the slots' capacity never grows past it (None: no cap)
        self.model = model
        self.base = causal_lm(model)
        weight = self.base.model.embed_tokens.weight
        # the cache's dtype (None: the model's on a GPU, float32 on a CPU; module docstring)
        self.kv_dtype = kv_dtype or (torch.float32 if weight.device.type == "cpu" else weight.dtype)
        config = self.base.config
        self.layers = list(self.base.model.layers)
        self.kv_heads = config.num_key_value_heads
        self.heads = config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.groups = self.heads // self.kv_heads
        self.scale = self.head_dim**-0.5
        self.max_rows = max_rows
        self.prefill_chunk = prefill_chunk
        self.rows: list[Row] = []
        self.slots = self._slots(0)  # the memory of `own`, paged in by need on a CPU
        self.own = self.slots.tensor  # (rows, layers, 2, kv_heads, capacity, head_dim)
        # fused projections (loop/generators/hf/fused.py); None: each module called, the reference
        self.fused = (
            [LayerProjections(layer, packed=packed) for layer in self.layers] if fused else None
        )
        if self.fused is not None:  # the model file's mapping released (fused.own_storage)
            own_storage(model, self.fused)
        self.head = Head(self.base.lm_head, packed=fused and packed)  # the LM head
        # decode attention by torch's CPU flash kernel (loop/generators/hf/attention.py)
        self.fused_attention = fused and self.own.device.type == "cpu"

    def refresh(self) -> None:
        """Re-read the weights into the fused projections (call after any weight change)."""
        for projections in self.fused or ():
            projections.refresh()

    def drop(self) -> None:
        """Pack every fused group now and give its plain weight's pages back (on a CPU while
        sampling: one copy of the frozen weights; fused.Projection.drop). `unpack` and any
        call of the model's modules bring them back."""
        for projections in self.fused or ():
            projections.drop()

    def unpack(self) -> None:
        """Drop the packed weight copies (made again on first use; see loop/generators/
        fused.py)."""
        for projections in self.fused or ():
            projections.unpack()
        self.head.unpack()

    @property
    def nbytes(self) -> int:
        """Bytes of the row slots' capacity (on a CPU only the pages rows wrote are resident)."""
        return self.own.numel() * self.own.element_size()

    def add(self, row: Row, own: Tensor | None) -> None:
        """Give `row` the next free slot, holding `own` (its cached KV past the prefix view)."""
        if len(self.rows) >= self.max_rows:
            raise RuntimeError(f"all {self.max_rows} row slots are taken")
        if own is not None and own.shape[3]:
            self.reserve(own.shape[3])
        row.slot = len(self.rows)
        self.rows.append(row)
        if own is not None and own.shape[3]:
            self.own[row.slot, :, :, :, : own.shape[3]] = own

    def release(self) -> None:
        """Free the slots' memory (no row may be active)."""
        assert not self.rows, "release() with active rows"
        self.slots = self._slots(0)
        self.own = self.slots.tensor

    def remove(self, row: Row, *, keep: bool = True) -> Tensor | None:
        """Free `row`'s slot; returns a copy of its own KV (layers, 2, kv_heads, n, head_dim)
        when `keep` (else None: nothing copied). The last row moves into the freed slot; the
        pages no row uses any more go back."""
        length = row.own_length
        own = None
        if keep:
            own = self._outside(self.own_kv(row).shape)
            own.copy_(self.own_kv(row))
        last = self.rows.pop()
        if last is not row:
            n = last.own_length
            self.own[row.slot, :, :, :, :n] = self.own[last.slot, :, :, :, :n]
            if length > n:  # the tail the longer row used, head by head
                for part in self.own[row.slot, :, :, :, n:].flatten(0, 2):
                    self.slots.give_back(part)
            last.slot, self.rows[row.slot] = row.slot, last
        self.slots.give_back(self.own[len(self.rows)])  # the slot left empty
        row.slot = -1
        return own

    def own_kv(self, row: Row) -> Tensor:
        """A view of `row`'s own KV."""
        return self.own[row.slot, :, :, :, : row.own_length]

    def prefill(self, row: Row, new_ids: list[int], store: Tensor | None = None) -> Tensor:
        """Run `new_ids` after what `row` covers (in chunks); (vocab,) float logits of the last.

        The new keys and values go to `row`'s slot, or into `store` (layers, 2, kv_heads, n,
        head_dim) for a row without a slot and without own KV yet, such as a prompt about to
        become a prefix entry: the slots then never grow to a whole prompt's length.
        """
        hidden = None
        for start in range(0, len(new_ids), self.prefill_chunk):
            chunk = new_ids[start : start + self.prefill_chunk]
            if store is None:
                self.reserve(row.own_length + len(chunk))
            hidden = self._prefill_chunk(row, chunk, self.own[row.slot] if store is None else store)
        assert hidden is not None, "prefill needs at least one new id"
        return self.head(hidden[:, -1]).float()[0]

    def prefill_rows(self, rows: list[Row], new_ids: list[list[int]]) -> Tensor:
        """Run each row's `new_ids` after what it covers, every row in one forward: (R, vocab)
        float logits of each row's last new id.

        The rows hold slots with room for their new ids (`reserve`). Their ids are packed into
        one sequence, so the projections and the MLP read each weight once for all of them (on
        a CPU a few dozen tokens cost about what one does: the products are bound by reading
        the weights) and no padding is computed; attention runs row by row, each row's
        queries over its own keys. A row's results equal its `prefill` up to float rounding
        (other matrix shapes).
        """
        device = self.own.device
        ends = torch.tensor([len(ids) for ids in new_ids]).cumsum(0).tolist()
        spans = [(end - len(ids), end) for ids, end in zip(new_ids, ends, strict=True)]
        starts = [row.own_length for row in rows]
        packed = torch.tensor([[token for ids in new_ids for token in ids]], device=device)
        positions = torch.cat(
            [
                torch.arange(len(row.ids), len(row.ids) + len(ids))
                for row, ids in zip(rows, new_ids, strict=True)
            ]
        ).to(device)[None]
        x = self.base.model.embed_tokens(packed)
        rotary = self.base.model.rotary_emb(x, positions)
        for index in range(len(self.layers)):
            q, k, v = self._qkv(index, x, rotary)  # (1, heads, total, head_dim)
            parts = []
            for row, start, (first, end) in zip(rows, starts, spans, strict=True):
                count, own = end - first, self.own[row.slot, index]
                own[0, :, start : start + count] = k[0, :, first:end].to(own.dtype)
                own[1, :, start : start + count] = v[0, :, first:end].to(own.dtype)
                parts.append(
                    self._prefill_attention(
                        index, row, q[:, :, first:end], own, start + count, positions[0, first:end]
                    )
                )
            x = self._finish_layer(index, x, torch.cat(parts, dim=2))
        for row, ids in zip(rows, new_ids, strict=True):
            row.ids.extend(ids)
        last = torch.tensor([end - 1 for end in ends], device=device)
        return self.head(self.base.model.norm(x[0, last])).float()

    def new_store(self, tokens: int) -> Tensor:
        """Empty keys and values for `tokens` tokens, outside the slots (see `prefill`)."""
        return self._outside((len(self.layers), 2, self.kv_heads, tokens, self.head_dim))

    def _outside(self, shape: tuple[int, ...]) -> Tensor:
        """Keys and values outside the slots (a prompt's store, a leaving row's copy): on a CPU
        their own map, unmapped when they are freed, so cache after cache of growing sizes
        leaves no holes in the C heap that only a trim would give back (pages.py)."""
        return SlotMemory(shape, self.own.dtype, self.own.device).tensor

    def decode(self, rows: list[Row], tokens: list[int]) -> Tensor:
        """Feed one token to each of `rows` (slots 0..B-1, in order); (B, vocab) float logits."""
        assert [row.slot for row in rows] == list(range(len(rows))), "rows must fill slots 0..B-1"
        device = self.own.device
        lengths = torch.tensor([row.own_length for row in rows], device=device)
        positions = torch.tensor([len(row.ids) for row in rows], device=device)[:, None]
        self.reserve(int(lengths.max()) + 1)
        x = self.base.model.embed_tokens(torch.tensor(tokens, device=device)[:, None])
        rotary = self.base.model.rotary_emb(x, positions)
        slots = torch.arange(len(rows), device=device)
        step = step_index(lengths, [(row.entry, row.n_prefix) for row in rows], self.groups)
        width = int(lengths.max()) + 1
        for index in range(len(self.layers)):
            q, k, v = self._qkv(index, x, rotary)  # (B, heads or kv_heads, 1, head_dim)
            keys, values = self.own[:, index, 0], self.own[:, index, 1]
            keys[slots, :, lengths] = k[:, :, 0].to(keys.dtype)
            values[slots, :, lengths] = v[:, :, 0].to(values.dtype)
            keys = keys[: len(rows), :, :width].float()
            values = values[: len(rows), :, :width].float()
            attended = decode_attention(
                index, q, keys, values, step, scale=self.scale, fused=self.fused_attention
            )
            x = self._finish_layer(index, x, attended)
        for row, token in zip(rows, tokens, strict=True):
            row.ids.append(token)
        return self.head(self.base.model.norm(x)[:, -1]).float()

    def _prefill_chunk(self, row: Row, new_ids: list[int], store: Tensor) -> Tensor:
        """store: (layers, 2, kv_heads, capacity, head_dim), row's own KV from position 0."""
        device = self.own.device
        start, count = row.own_length, len(new_ids)
        positions = torch.arange(len(row.ids), len(row.ids) + count, device=device)[None]
        x = self.base.model.embed_tokens(torch.tensor([new_ids], device=device))
        rotary = self.base.model.rotary_emb(x, positions)
        for index in range(len(self.layers)):
            q, k, v = self._qkv(index, x, rotary)
            store[index, 0, :, start : start + count] = k[0]
            store[index, 1, :, start : start + count] = v[0]
            attended = self._prefill_attention(
                index, row, q, store[index], start + count, positions[0]
            )
            x = self._finish_layer(index, x, attended)
        row.ids.extend(new_ids)
        return self.base.model.norm(x)

    def _prefill_attention(
        self, index: int, row: Row, q: Tensor, own: Tensor, own_length: int, positions: Tensor
    ) -> Tensor:
        """Layer `index`'s attention of `row`'s new queries q (1, heads, n, head_dim) at
        `positions` (n,) over its prefix view and the first `own_length` tokens of `own`
        (2, kv_heads, capacity, head_dim), each query seeing every key up to its own position."""
        keys, values = own[0, :, :own_length], own[1, :, :own_length]
        if row.entry is not None and row.n_prefix:
            keys = torch.cat([row.entry.kv[index, 0, :, : row.n_prefix], keys], dim=1)
            values = torch.cat([row.entry.kv[index, 1, :, : row.n_prefix], values], dim=1)
        allowed = torch.arange(keys.shape[1], device=q.device)[None] <= positions[:, None]
        return torch.nn.functional.scaled_dot_product_attention(
            q, keys.float()[None], values.float()[None], attn_mask=allowed, scale=self.scale,
            enable_gqa=True,
        )  # fmt: skip

    def _qkv(self, index: int, x: Tensor, rotary: tuple[Tensor, Tensor]) -> tuple[Tensor, ...]:
        """Projections of the normed input, per head, rotary applied: (B, heads, T, head_dim)."""
        layer = self.layers[index]
        attn, h = layer.self_attn, layer.input_layernorm(x)
        batch, steps = x.shape[:2]
        if self.fused is None:
            projected = [attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)]
        else:
            projected = self.fused[index].qkv(h)
        q, k, v = (part.reshape(batch, steps, -1, self.head_dim) for part in projected)
        if hasattr(attn, "q_norm"):  # qwen3 normalises each head before the rotary embedding
            q, k = attn.q_norm(q), attn.k_norm(k)
        cos, sin = (part[:, None] for part in rotary)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        return q.float(), k.float(), v.float()  # attention in float32 (see the module docstring)

    def _finish_layer(self, index: int, x: Tensor, attended: Tensor) -> Tensor:
        """Output projection, residual, MLP, residual. attended: (B, heads, T, head_dim)."""
        layer, batch, steps = self.layers[index], *x.shape[:2]
        merged = attended.transpose(1, 2).reshape(batch, steps, self.heads * self.head_dim)
        merged = merged.to(x.dtype)
        if self.fused is None:
            x = x + layer.self_attn.o_proj(merged)
            return x + layer.mlp(layer.post_attention_layernorm(x))
        x = x + self.fused[index].o(merged)[0]
        return x + self.fused[index].mlp(layer.post_attention_layernorm(x))

    def kv_bytes(self, joining: int = 0) -> int:
        """The bytes of keys and values the rows may come to hold, with one more row of
        `joining` own tokens: on a CPU (slots paged in by need) each row's `reserved` tokens;
        elsewhere the slots as allocated, every row at the capacity (`slot_capacity`)."""
        per_token = len(self.layers) * 2 * self.kv_heads * self.head_dim * self.own.element_size()
        if self.slots.paged:
            return per_token * (sum(row.reserved for row in self.rows) + joining)
        return (
            per_token * self.max_rows * slot_capacity(joining, self.own.shape[4], self.max_tokens)
        )

    def reserve(self, length: int) -> None:
        """Grow the slots' token capacity to at least `length` (`slot_capacity`), copying each
        active row's own tokens once; a failed growth leaves the slots unchanged, or, with no
        row active, empty. With no row active the old slots are freed before the new ones are
        made, so only a growth under active rows holds both (`engine_memory`)."""
        capacity = self.own.shape[4]
        if length <= capacity:
            return
        shape = list(self.own.shape)
        shape[4] = slot_capacity(length, capacity, self.max_tokens)
        if self.slots.paged and self.max_tokens is not None:  # address space: the cap at once
            shape[4] = max(length, self.max_tokens)
        if not self.rows:  # nothing to copy: the old slots go first
            self.slots = self._slots(0)
            self.own = self.slots.tensor
        grown = SlotMemory(tuple(shape), self.own.dtype, self.own.device)
        for row in self.rows:  # only what rows hold: the rest of the slots stays unwritten
            n = row.own_length
            grown.tensor[row.slot, :, :, :, :n] = self.own[row.slot, :, :, :, :n]
        self.slots, self.own = grown, grown.tensor

    def _slots(self, capacity: int) -> SlotMemory:
        shape = (self.max_rows, len(self.layers), 2, self.kv_heads, capacity, self.head_dim)
        return SlotMemory(shape, self.kv_dtype, self.base.model.embed_tokens.weight.device)


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
