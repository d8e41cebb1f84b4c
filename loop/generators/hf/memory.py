"""The `hf` engine's GPU memory, by the engine's own rules: what the preflight plans with.

On a GPU the row slots are one `torch.zeros` of (max_rows, layers, 2, kv_heads, capacity,
head_dim) in the model's dtype (`loop/generators/hf/pages.py`), whatever the number of active
rows, with the capacity `reserve` gives the longest row (`slot_capacity`), at most
`max_context_tokens`. Beside them the KV store holds at most its budget, and for a moment one
of these (never two at once: they run in different phases of a step):

- **growth**: `reserve` under active rows makes the new slots while the old are alive (the
  rows' tokens are copied across), so the old capacity is held too, at worst the largest
  capacity below the final one; the prompt store being admitted is alive then as well. With no
  row active the old slots are freed first (the first growth of a burst holds one copy).
- **prompt prefill**: a first-turn prompt is prefilled into a store of its own (up to
  `max_context_tokens`), its chunk of `prefill_chunk` queries attending over all of it in
  float32 (keys and values in float32, the scores and their softmax).
- **decode**: a step casts one layer's keys and values of every row to float32 (when they are
  stored narrower) and holds the scores and their exponentials, one per row, head and token.
- **packed prefill**: rows joining together run up to `max_rows` x `prefill_chunk` new ids in
  forwards of at most `PACKED_PREFILL_IDS` (loop/generators/hf/generator.py): the MLP's gate,
  up and product (`intermediate_size` each, in the model's dtype) and the queries, keys and
  values in float32.

Under `generator.kv_rows_mb` no request joins past it by the engine's own rule
(`DecoderEngine.kv_bytes`: on a GPU `max_rows` x the capacity), so the capacity is at most what
fits it.

Entries a row still views after the store evicted them stay alive beyond its budget (a row
holds its entry); they are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

from loop.generators.hf.engine import CAPACITY_STEP, slot_capacity
from loop.generators.hf.generator import PACKED_PREFILL_IDS

FLOAT32 = 4


@dataclass(frozen=True)
class EngineMemory:
    """Bytes of each term (see the module docstring); `peak` is their rule."""

    slots: int  # max_rows x capacity x KV bytes per token
    store: int  # the KV store's budget
    growth: int  # the old slots held during a growth under active rows
    prompt_store: int  # one first-turn prompt's store (alive during its prefill and its growth)
    prompt_prefill: int  # that prompt's chunk attention over it, in float32
    decode: int  # one decode step's float32 copies and scores for one layer
    packed_prefill: int  # the packed prefill's MLP and projections

    @property
    def transient(self) -> int:
        """The largest of the moments that do not overlap."""
        return max(
            self.growth + self.prompt_store,
            self.prompt_store + self.prompt_prefill,
            self.decode,
            self.packed_prefill,
        )

    @property
    def peak(self) -> int:
        return self.slots + self.store + self.transient


def engine_memory(
    *,
    layers: int,
    kv_heads: int,
    heads: int,
    head_dim: int,
    intermediate: int,
    dtype_bytes: int,
    max_rows: int,
    max_context_tokens: int,
    kv_cache_bytes: int = 0,
    kv_rows_bytes: int | None = None,
    prefill_chunk: int = 512,
    packed_ids: int = PACKED_PREFILL_IDS,
) -> EngineMemory:
    """The engine's memory beside the model for `max_rows` rows of up to `max_context_tokens`
    (prompt and output), keys and values stored in `dtype_bytes` (the model's dtype on a GPU);
    `kv_rows_bytes`: `generator.kv_rows_mb` in bytes (None: no bound)."""
    per_token = 2 * layers * kv_heads * head_dim * dtype_bytes
    capacity = slot_capacity(max_context_tokens, 0, max_context_tokens)
    if kv_rows_bytes is not None:  # no row joins past it (DecoderEngine.kv_bytes)
        capacity = min(capacity, kv_rows_bytes // (max_rows * per_token))
    before = (capacity - 1) // CAPACITY_STEP * CAPACITY_STEP  # the largest capacity below
    chunk = min(prefill_chunk, max_context_tokens)
    widen = FLOAT32 if dtype_bytes < FLOAT32 else 0  # a float32 cache is read as it is
    packed = min(max_rows * prefill_chunk, packed_ids)
    return EngineMemory(
        slots=max_rows * capacity * per_token,
        store=kv_cache_bytes,
        growth=max_rows * before * per_token,
        prompt_store=max_context_tokens * per_token,
        prompt_prefill=(
            2 * kv_heads * max_context_tokens * head_dim * FLOAT32
            + 2 * chunk * heads * max_context_tokens * FLOAT32
        ),
        decode=(
            2 * max_rows * kv_heads * capacity * head_dim * widen
            + 2 * max_rows * heads * capacity * FLOAT32
        ),
        packed_prefill=(
            3 * packed * intermediate * dtype_bytes
            + packed * (heads + 2 * kv_heads) * head_dim * FLOAT32
        ),
    )
