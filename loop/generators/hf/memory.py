"""The `hf` engine's memory: its sizes and bounds (the slots' capacity, the KV store's default
budget, the packs of joining rows) and, from them, the rule the preflight plans a GPU with.

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
  forwards of at most `PACKED_PREFILL_IDS` (below): the MLP's gate, up and product
  (`intermediate_size` each, in the model's dtype) and the queries, keys and values in float32.

Under `generator.kv_rows_mb` no request joins past it by the engine's own rule
(`DecoderEngine.kv_bytes`: on a GPU `max_rows` x the capacity), so the capacity is at most what
fits it.

Entries a row still views after the store evicted them stay alive beyond its budget (a row
holds its entry); they are not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLOAT32 = 4
CAPACITY_STEP = 64  # the slots' token capacity is a multiple of this

# kv_cache_mb unset: on a GPU this share of the memory free when the generator is built (the
# learner's step needs the rest); on a CPU, CPU_KV_CACHE_MB (the quickstart's store peaked at
# 415 MiB at 8 rollouts and 852 at 32, benchmarks/README.md).
KV_FREE_SHARE = 0.25
CPU_KV_CACHE_MB = 1024.0
# One packed prefill's ids at most: on a CPU 40 ids of a row already keep the cores busy, and on
# an H100 32 rows x 40 ids ran 3.7x faster packed than one by one (benchmarks/README.md, "Rollouts
# coming back together"), while its activations grow with the count: SmolLM2-135M's 36 rows
# coming back with 300 ids each raised the RSS by 687 MiB packed whole, by 154 MiB in packs of
# 2,048 ids (float32, 2 threads).
PACKED_PREFILL_IDS = 2048


def slot_capacity(length: int, capacity: int = 0, max_tokens: int | None = None) -> int:
    """The slots' token capacity once `reserve(length)` ran on slots of `capacity`: unchanged
    if `length` fits, else grown by at least a quarter to a multiple of `CAPACITY_STEP`, at
    most `max_tokens` unless `length` asks more."""
    if length <= capacity:
        return capacity
    wanted = max(length, capacity + capacity // 4)
    grown = -(-wanted // CAPACITY_STEP) * CAPACITY_STEP
    if max_tokens is not None:  # room past the cap would never be used
        grown = max(length, min(grown, max_tokens))
    return grown


def pack_prefills(sizes: list[int], chunk: int, most: int) -> list[list[int]]:
    """The joining rows' prefills (each of `sizes[i]` new ids), as lists of row indices: rows
    of at most `chunk` ids packed in order while a pack holds at most `most` ids, then each
    longer row alone (prefilled in chunks)."""
    packs: list[list[int]] = []
    held = 0
    for i, size in enumerate(sizes):
        if size > chunk:
            continue
        if not packs or held + size > most:
            packs.append([])
            held = 0
        packs[-1].append(i)
        held += size
    return packs + [[i] for i, size in enumerate(sizes) if size > chunk]


def kv_cache_budget_mb(device: torch.device) -> float:
    """The KV store's budget when `kv_cache_mb` is unset (see KV_FREE_SHARE)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return KV_FREE_SHARE * free / 2**20
    return CPU_KV_CACHE_MB


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
