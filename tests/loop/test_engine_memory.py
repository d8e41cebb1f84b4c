"""The hf engine's memory rule (loop/generators/hf/memory.py) by hand and against the bytes the
engine allocates for its slots and prompt stores, with the GPU's allocation (plain zeros)."""

from __future__ import annotations

import asyncio
import weakref

import pytest
import torch

import loop.generators.hf.engine as engine_module
from loop.generators.base import SamplingParams
from loop.generators.hf.engine import DecoderEngine, Row, slot_capacity
from loop.generators.hf.generator import HFGenerator
from loop.generators.hf.memory import EngineMemory, engine_memory
from loop.model.policy import Policy
from loop.preflight.plan import hf_engine_memory
from loop.preflight.shapes import SHAPES
from tests.loop.conftest import TINY_SHAPE, TINY_VOCAB

LAYERS, KV_HEADS, HEADS, HEAD_DIM, INTERMEDIATE = 2, 2, 4, 16, 128
assert tuple(
    TINY_SHAPE[k]
    for k in ("num_hidden_layers", "num_key_value_heads", "hidden_size", "intermediate_size")
) == (LAYERS, KV_HEADS, HEADS * HEAD_DIM, INTERMEDIATE)
PER_TOKEN = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4  # float32 keys and values on a CPU


def test_slot_capacity_follows_reserve() -> None:
    assert slot_capacity(40) == 64 and slot_capacity(64) == 64 and slot_capacity(65) == 128
    assert slot_capacity(72, 64) == 128  # a quarter more (80), to a multiple of 64
    assert slot_capacity(72, 64, 72) == 72 and slot_capacity(90, 64, 72) == 90
    assert slot_capacity(30, 64) == 64


def test_engine_memory_by_hand() -> None:
    rule = engine_memory(
        layers=2, kv_heads=2, heads=4, head_dim=8, intermediate=32, dtype_bytes=2,
        max_rows=3, max_context_tokens=100, kv_cache_bytes=1000, prefill_chunk=16,
    )  # fmt: skip
    per_token = 2 * 2 * 2 * 8 * 2  # 128 bytes
    assert rule.slots == 3 * 100 * per_token  # capacity 128 capped at 100
    assert rule.growth == 3 * 64 * per_token  # the largest capacity below 100
    assert rule.prompt_store == 100 * per_token
    assert rule.prompt_prefill == 2 * 2 * 100 * 8 * 4 + 2 * 16 * 4 * 100 * 4
    assert rule.decode == 2 * 3 * 2 * 100 * 8 * 4 + 2 * 3 * 4 * 100 * 4
    assert rule.packed_prefill == 3 * 48 * 32 * 2 + 48 * (4 + 4) * 8 * 4
    transient = max(
        rule.growth + rule.prompt_store, rule.prompt_store + rule.prompt_prefill,
        rule.decode, rule.packed_prefill,
    )  # fmt: skip
    assert rule.peak == 38400 + 1000 + transient


def test_kv_rows_mb_and_the_packs_bound_the_rule() -> None:
    """Under a bound on the rows' keys and values the capacity is what fits it, and the packed
    prefill runs at most `packed_ids` ids at once."""
    settings = dict(
        layers=2, kv_heads=2, heads=4, head_dim=8, intermediate=32, dtype_bytes=2,
        max_rows=3, max_context_tokens=100, prefill_chunk=16,
    )  # fmt: skip
    per_token = 2 * 2 * 2 * 8 * 2
    bounded = engine_memory(**settings, kv_rows_bytes=3 * 50 * per_token, packed_ids=20)
    assert bounded.slots == 3 * 50 * per_token
    assert bounded.packed_prefill == 3 * 20 * 32 * 2 + 20 * (4 + 4) * 8 * 4


def test_preflight_counts_the_engine_rule() -> None:
    """Qwen2.5-7B in bfloat16, 32 rows of 12,288 + 16 tokens: the preflight's terms are the
    engine's."""
    shape = SHAPES["Qwen/Qwen2.5-7B-Instruct"]
    rule = hf_engine_memory(shape, 2, rows=32, max_context_tokens=12304, kv_cache_bytes=0)
    assert rule.slots == 32 * 12304 * 57344
    assert rule.growth == 32 * 12288 * 57344


class Counted:
    """The GPU's slots (plain zeros) on a CPU, counting live slot and store bytes."""

    live = 0
    peak = 0
    paged = False  # the GPU's: no pages by need

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device):
        self.tensor = torch.zeros(shape, dtype=dtype, device=device)
        count(self.tensor)

    def give_back(self, part: torch.Tensor) -> None:
        pass


def count(tensor: torch.Tensor) -> None:
    nbytes = tensor.numel() * tensor.element_size()
    Counted.live += nbytes
    Counted.peak = max(Counted.peak, Counted.live)
    weakref.finalize(tensor, _free, nbytes)


def _free(nbytes: int) -> None:
    Counted.live -= nbytes


@pytest.fixture
def counted(monkeypatch):
    """Slots, prompt stores and leaving rows' copies all come from `SlotMemory`: counted."""
    monkeypatch.setattr(engine_module, "SlotMemory", Counted)
    Counted.live = Counted.peak = 0
    return Counted


def tiny_rule(rows: int, max_context_tokens: int) -> EngineMemory:
    return engine_memory(
        layers=LAYERS, kv_heads=KV_HEADS, heads=HEADS, head_dim=HEAD_DIM,
        intermediate=INTERMEDIATE, dtype_bytes=4, max_rows=rows,
        max_context_tokens=max_context_tokens,
    )  # fmt: skip


async def test_first_prompts_joining_together_hold_one_slots_copy(tiny_policy: Policy, counted):
    """Four first-turn prompts of 64 ids with 8 new each, all at once, every key in its row's
    slot: the slots are made once at their final capacity (64 + 8 = 72, the cap), beside one
    prompt's store; not at 64 and then again at 72 while the first are held."""
    generator = HFGenerator(tiny_policy, max_batch_size=4, kv_cache_mb=0, max_context_tokens=72)
    rng = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, TINY_VOCAB, (64,), generator=rng).tolist() for _ in range(4)]
    params = SamplingParams(max_new_tokens=8, temperature=0.0, last_turn=True)  # no copy kept
    await asyncio.gather(*(generator.generate(p, params) for p in prompts))
    await generator.close()
    rule = tiny_rule(4, 72)
    assert counted.peak == 4 * 72 * PER_TOKEN + 64 * PER_TOKEN
    assert counted.peak <= rule.slots + rule.growth + rule.prompt_store


def test_a_growth_under_active_rows_stays_inside_the_rule(tiny_policy: Policy, counted):
    """A row decodes at capacity 64 when a 60-id prompt with 10 new joins: the slots grow to
    72 (the cap) while the old ones and the prompt's store are held; the rule's growth term
    (the largest capacity below 72) bounds it."""
    rng = torch.Generator().manual_seed(1)
    short, long = (torch.randint(3, TINY_VOCAB, (n,), generator=rng).tolist() for n in (10, 60))
    with torch.no_grad():
        engine = DecoderEngine(tiny_policy.model, max_rows=4, max_tokens=72)
        first = Row(ids=[])
        engine.reserve(20)
        engine.add(first, None)
        engine.prefill(first, short)
        second = Row(ids=[])
        store = engine.new_store(len(long))
        engine.prefill(second, long, store=store)
        engine.reserve(70)
        engine.add(second, store)
        del store
    rule = tiny_rule(4, 72)
    assert counted.peak == 4 * (64 + 72) * PER_TOKEN + 60 * PER_TOKEN
    assert counted.peak <= rule.slots + rule.growth + rule.prompt_store
