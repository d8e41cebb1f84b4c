"""KV reuse and continuous batching in the `hf` generator (`loop/generators/{kvcache,engine}.py`).

The reference is the static path (`kv_reuse=False`: the plain transformers forward, one static
batch, no reuse): under the same seeds the engine must sample the same tokens with the same
log-probs, however requests join and leave, whatever it reuses. Stale keys must never be used
after a weight change, and the store must stay within its byte budget.

Run: python -m pytest tests/loop/test_kv_reuse.py -q
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from loop.generators.base import Generation, GeneratorError, SamplingParams
from loop.generators.hf.engine import DecoderEngine, Row, supports
from loop.generators.hf.generator import HFGenerator
from loop.generators.hf.kvcache import KVStore, common_prefix_length
from loop.model.policy import LoraSettings, Policy, load_policy
from tests.loop.conftest import TINY_SHAPE, TINY_VOCAB

SHARED = list(range(10, 50))  # a "system prompt" every request starts with


def task_prompts(count: int, seed: int = 0) -> list[list[int]]:
    """The shared prefix, then a different 'instruction' of 2, 4, 6, ... ids per prompt."""
    rng = torch.Generator().manual_seed(seed)
    return [
        SHARED + torch.randint(3, TINY_VOCAB, (2 + 2 * i,), generator=rng).tolist()
        for i in range(count)
    ]


def sampled(seed: int, max_new_tokens: int = 8) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=1.0, seed=seed)


def assert_same(got: Generation, want: Generation, tolerance: float = 1e-4) -> None:
    assert got.token_ids == want.token_ids
    assert got.finish_reason == want.finish_reason
    gap = max(abs(a - b) for a, b in zip(got.logprobs or [], want.logprobs or [], strict=True))
    assert gap < tolerance, f"log-prob gap {gap:.2e}"


async def reference(policy: Policy, prompt: list[int], params: SamplingParams) -> Generation:
    generator = HFGenerator(policy, kv_reuse=False)
    try:
        return await generator.generate(prompt, params)
    finally:
        await generator.close()


def test_the_engine_runs_llama_and_refuses_other_layouts(tiny_policy: Policy) -> None:
    assert supports(tiny_policy.model)
    from transformers import GPT2Config, GPT2LMHeadModel

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=50))
    assert not supports(gpt2)
    assert HFGenerator(Policy(gpt2, tiny_policy.tokenizer), max_batch_size=2).engine is None


async def test_continuous_batching_equals_unbatched_reference(tiny_policy: Policy) -> None:
    """7 requests through 3 row slots, ending at different lengths: rows leave and join
    mid-flight, shared prefixes are reused, and every result equals the static path alone."""
    prompts = task_prompts(7)
    params = [sampled(seed, max_new_tokens=3 + seed) for seed in range(7)]
    generator = HFGenerator(tiny_policy, max_batch_size=3)
    together = await asyncio.gather(
        *(generator.generate(p, q) for p, q in zip(prompts, params, strict=True))
    )
    for prompt, param, got in zip(prompts, params, together, strict=True):
        assert_same(got, await reference(tiny_policy, prompt, param))
    assert generator.cache.stats.prefix_hits >= 5  # later prompts viewed an earlier one's prefix
    await generator.close()


async def test_a_rollouts_next_turn_prefills_only_the_new_tokens(tiny_policy: Policy) -> None:
    generator = HFGenerator(tiny_policy)
    first = task_prompts(1)[0]
    turn1 = await generator.generate(first, sampled(1))
    second = first + turn1.token_ids + [7, 8, 9, 10]  # glue and an observation
    prefilled_before = generator.cache.stats.prefill_tokens
    turn2 = await generator.generate(second, sampled(2))
    assert generator.cache.stats.retained_hits == 1
    # the last sampled id was never fed, so it is prefilled with the 4 new ones
    assert generator.cache.stats.prefill_tokens - prefilled_before == 5
    assert_same(turn2, await reference(tiny_policy, second, sampled(2)))
    await generator.close()


async def test_the_k_rollouts_of_a_task_share_the_whole_prompt(tiny_policy: Policy) -> None:
    generator, prompt = HFGenerator(tiny_policy), task_prompts(1)[0]
    results = await asyncio.gather(*(generator.generate(prompt, sampled(s)) for s in range(4)))
    stats = generator.cache.stats
    assert stats.prefill_tokens == len(prompt) + 3  # the first whole, the others one id each
    for seed, got in enumerate(results):
        assert_same(got, await reference(tiny_policy, prompt, sampled(seed)))
    await generator.close()


async def test_tasks_sharing_most_of_their_prompt_view_one_entry(tiny_policy: Policy) -> None:
    """Prompts that an entry covers for at least SHARE_FRACTION view it (their task ids go to
    their rows), so a decode step reads one entry for all of them; a prompt that shares less
    becomes an entry of its own. Results equal the static path either way."""
    generator = HFGenerator(tiny_policy, max_batch_size=4)
    prompts = task_prompts(4)  # the 40 shared ids, then 2-8 of their own
    other = list(range(60, 64)) + SHARED[:3] + list(range(70, 110))  # shares 0 ids with them
    params = [sampled(seed) for seed in range(5)]
    results = await asyncio.gather(
        *(generator.generate(p, q) for p, q in zip([*prompts, other], params, strict=True))
    )
    assert len(generator.cache.entries) == 2
    for prompt, param, got in zip([*prompts, other], params, results, strict=True):
        assert_same(got, await reference(tiny_policy, prompt, param))
    await generator.close()


@pytest.mark.parametrize("change", ["optimizer_step", "load_adapter"])
async def test_a_weight_change_never_samples_from_stale_keys(tmp_path, tiny_model_dir, change):
    """After the weights change, a prompt whose prefix (and previous turn) is cached gives what
    the new weights give from scratch. Without the invalidation it would attend to keys of the
    old weights and its log-probs would be far off."""
    lora = LoraSettings(rank=4, alpha=8)
    policy = load_policy(str(tiny_model_dir), lora=lora)
    generator = HFGenerator(policy)
    first = task_prompts(1)[0]
    turn1 = await generator.generate(first, sampled(1))
    lora_params = [p for name, p in policy.model.named_parameters() if "lora_" in name]
    if change == "optimizer_step":
        for p in lora_params:
            p.grad = torch.ones_like(p)
        torch.optim.SGD(lora_params, lr=0.5).step()
    else:
        trained = load_policy(str(tiny_model_dir), lora=lora)
        with torch.no_grad():
            for p in trained.model.parameters():
                if p.requires_grad:
                    p.add_(0.5)
        trained.model.save_pretrained(tmp_path)
        generator.load_adapter(tmp_path)
    second = first + turn1.token_ids + [7, 8]
    turn2 = await generator.generate(second, sampled(2))
    assert generator.cache.stats.invalidations == 1
    assert_same(turn2, await reference(policy, second, sampled(2)))
    await generator.close()


async def test_weights_changed_mid_generation_recompute_the_active_rows(tiny_policy) -> None:
    """Rows still decoding when the weights change continue under the new weights."""
    model, seen = tiny_policy.model, []

    def change_weights_once(_module, args):
        if args[0].shape[1] == 1 and not seen:  # the first decode step
            seen.append(True)
            with torch.no_grad():
                model.model.layers[0].mlp.down_proj.weight.mul_(-1.0)

    handle = model.model.embed_tokens.register_forward_pre_hook(change_weights_once)
    generator = HFGenerator(tiny_policy)
    prompt = task_prompts(1)[0]
    got = await generator.generate(prompt, SamplingParams(max_new_tokens=6, temperature=0))
    handle.remove()
    # tokens 3..6 were sampled from the new weights with the whole sequence recomputed
    prefix = prompt + got.token_ids[:2]
    rest = await reference(tiny_policy, prefix, SamplingParams(max_new_tokens=4, temperature=0))
    assert got.token_ids[2:] == rest.token_ids
    assert max(abs(a - b) for a, b in zip(got.logprobs[2:], rest.logprobs, strict=True)) < 1e-4
    await generator.close()


async def test_the_store_stays_within_its_budget(tiny_policy: Policy) -> None:
    per_token = 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv_heads x head_dim x float32 bytes
    generator = HFGenerator(tiny_policy, kv_cache_mb=100 * per_token / 2**20)  # 100 tokens
    for seed in range(6):  # six different 40-50-token prompts, then their next turns
        prompt = task_prompts(1, seed=seed)[0]
        prompt[0] = 100 + seed  # nothing shared
        turn = await generator.generate(prompt, sampled(seed))
        assert generator.cache.nbytes <= generator.cache.budget_bytes
        await generator.generate(prompt + turn.token_ids + [5], sampled(seed))
        assert generator.cache.nbytes <= generator.cache.budget_bytes
    assert generator.cache.stats.evictions > 0
    assert generator.cache.stats.peak_bytes <= generator.cache.budget_bytes
    await generator.close()


def kv(tokens: int) -> torch.Tensor:
    return torch.zeros(1, 2, 1, tokens, 1)  # 8 bytes per token


def test_store_match_takes_the_longest_cover_but_never_the_whole_prompt() -> None:
    store = KVStore(budget_bytes=10_000)
    store.add_entry([1, 2, 3, 4], kv(4))
    store.add_entry([1, 2, 9], kv(3))
    match = store.match([1, 2, 3, 4])
    assert (match.n_prefix, match.own, match.from_retained) == (3, None, False)
    entry = store.entries[0]
    store.retain([1, 2, 3, 4, 5, 6], entry, 4, kv(2))
    match = store.match([1, 2, 3, 4, 5, 6, 7])
    assert match.from_retained and match.reused == 6 and match.entry is entry
    assert store.retained == []  # a rollout's cache continues in one request only
    assert store.match([7, 8]).reused == 0


def test_store_evicts_least_recently_used_and_entries_take_their_retained() -> None:
    store = KVStore(budget_bytes=8 * 10)  # room for 10 tokens
    a = store.add_entry([1, 2, 3], kv(3))
    b = store.add_entry([4, 5, 6], kv(3))
    store.retain([1, 2, 3, 7], a, 3, kv(1))
    store.match([4, 5, 6, 8])  # b used last
    store.add_entry([9, 9, 9], kv(3))  # 10 tokens held: a, its retained, b, the new one
    assert store.nbytes == 80
    store.add_entry([8, 8], kv(2))  # over budget: a (oldest) goes, with its retained cache
    assert a not in store.entries and b in store.entries and store.retained == []
    assert store.nbytes <= store.budget_bytes and store.stats.evictions == 1
    assert store.add_entry(list(range(20)), kv(20)) is None  # larger than the whole budget


def test_common_prefix_length_compares_in_blocks() -> None:
    long = list(range(1000))
    assert common_prefix_length(long, [*long[:700], -1]) == 700
    assert common_prefix_length(long, long[:300]) == 300
    assert common_prefix_length([], long) == 0


async def test_a_rollouts_last_turn_leaves_no_cache_behind(tiny_policy: Policy) -> None:
    """A turn's keys and values are kept for the rollout's next turn, unless it has none."""
    generator = HFGenerator(tiny_policy, max_batch_size=2)
    prompts = task_prompts(2)
    await generator.generate(prompts[0], sampled(0))
    assert len(generator.cache.retained) == 1
    last = SamplingParams(max_new_tokens=8, temperature=1.0, seed=1, last_turn=True)
    await generator.generate(prompts[1], last)
    assert len(generator.cache.retained) == 1  # the first rollout's, still
    await generator.close()


def test_engine_rows_fill_slots_in_order(tiny_policy: Policy) -> None:
    engine = DecoderEngine(tiny_policy.model, max_rows=3)
    rows = [Row(ids=[]) for _ in range(3)]
    with torch.no_grad():
        for i, row in enumerate(rows):
            engine.add(row, None)
            engine.prefill(row, [5 + i] * (i + 2))
        kept = engine.own_kv(rows[2]).clone()
        engine.remove(rows[0])
    assert [row.slot for row in engine.rows] == [0, 1] and rows[2].slot == 0
    assert torch.equal(engine.own_kv(rows[2]), kept)  # moved into the freed slot intact


def test_rows_prefilled_together_equal_each_prefilled_alone(tiny_policy: Policy) -> None:
    """`prefill_rows` packs the joining rows' new ids into one forward: each row's logits and
    keys equal its own `prefill`, for rows with and without a prefix view and own KV."""
    prompts = task_prompts(3)
    engines = []
    with torch.no_grad():
        for _ in range(2):
            engine, store = DecoderEngine(tiny_policy.model, max_rows=3), KVStore(2**30)
            kv = engine.new_store(len(SHARED))
            engine.prefill(Row(ids=[]), SHARED, store=kv)
            entry = store.add_entry(SHARED, kv)
            rows = [
                Row(ids=list(SHARED), entry=entry, n_prefix=len(SHARED)),  # viewing the entry
                Row(ids=[]),  # nothing cached
                Row(ids=list(SHARED), entry=entry, n_prefix=len(SHARED)),
            ]
            for row in rows:
                engine.add(row, None)
                engine.reserve(80)
            engine.prefill(rows[2], [7, 8, 9])  # own KV before the joint prefill
            engines.append((engine, rows))
        new = [prompts[0][len(SHARED) :], prompts[1], [11, 12, 13, 14, 15]]
        (alone, rows_a), (together, rows_b) = engines
        one_by_one = torch.stack(
            [alone.prefill(row, ids) for row, ids in zip(rows_a, new, strict=True)]
        )
        packed = together.prefill_rows(rows_b, new)
    torch.testing.assert_close(packed, one_by_one, atol=1e-4, rtol=0)
    assert [row.ids for row in rows_b] == [row.ids for row in rows_a]
    for a, b in zip(rows_a, rows_b, strict=True):
        torch.testing.assert_close(together.own_kv(b), alone.own_kv(a), atol=1e-4, rtol=0)


async def test_requests_joining_in_one_step_are_prefilled_together(tiny_policy: Policy) -> None:
    """Second turns of four rollouts arrive together: one packed prefill admits them all (one
    forward, not four) and each result equals the static path alone."""
    generator = HFGenerator(tiny_policy, max_batch_size=4)
    prompts = task_prompts(4)
    firsts = await asyncio.gather(
        *(generator.generate(p, sampled(s)) for s, p in enumerate(prompts))
    )
    seconds = [
        p + g.token_ids + [7, 8, 9 + i]
        for i, (p, g) in enumerate(zip(prompts, firsts, strict=True))
    ]
    before = generator.batches_run
    generator._ensure_worker()
    with generator._model_lock:  # hold the worker back until all four are queued
        calls = [generator.generate(p, sampled(10 + i)) for i, p in enumerate(seconds)]
        tasks = [asyncio.ensure_future(call) for call in calls]
        await asyncio.sleep(0.05)
    results = await asyncio.gather(*tasks)
    steps = max(len(r.token_ids) for r in results)
    assert generator.batches_run - before == 1 + steps - 1  # one prefill, then decode steps
    for i, (prompt, got) in enumerate(zip(seconds, results, strict=True)):
        assert_same(got, await reference(tiny_policy, prompt, sampled(10 + i)))
    await generator.close()


async def test_a_fault_of_the_scheduler_fails_the_rows_in_flight_and_serving_goes_on(
    tiny_policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    generator, prompt = HFGenerator(tiny_policy), task_prompts(1)[0]
    real_match = generator.cache.match

    def broken(_prompt: list[int]) -> None:
        monkeypatch.setattr(generator.cache, "match", real_match)  # fails once
        raise KeyError("boom")

    monkeypatch.setattr(generator.cache, "match", broken)
    with pytest.raises(GeneratorError, match="KeyError"):
        await generator.generate(prompt, sampled(0))
    assert generator.engine is not None and generator.engine.rows == []
    assert_same(
        await generator.generate(prompt, sampled(0)),
        await reference(tiny_policy, prompt, sampled(0)),
    )
    await generator.close()


def tiny_model(model_type: str):
    """A random 2-layer model of `model_type` (qwen2: q/k/v biases; qwen3: per-head q/k norms)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **TINY_SHAPE, head_dim=16)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", ["mistral", "qwen2", "qwen3"])
async def test_the_engine_equals_the_reference_on_each_supported_layout(tiny_policy, model_type):
    policy = Policy(tiny_model(model_type), tiny_policy.tokenizer)
    assert supports(policy.model)
    generator, prompts = HFGenerator(policy, max_batch_size=2), task_prompts(3)
    first = await asyncio.gather(
        *(generator.generate(p, sampled(i)) for i, p in enumerate(prompts))
    )
    for i, (prompt, got) in enumerate(zip(prompts, first, strict=True)):
        assert_same(got, await reference(policy, prompt, sampled(i)))
        following = prompt + got.token_ids + [7, 8]  # the next turn reuses this one's cache
        assert_same(
            await generator.generate(following, sampled(i)),
            await reference(policy, following, sampled(i)),
        )
    assert generator.cache.stats.retained_hits == 3
    await generator.close()


@pytest.mark.parametrize("kv_reuse", [True, False])
async def test_sampling_runs_with_its_own_thread_count_then_restores_it(tiny_policy, kv_reuse):
    seen: list[int] = []
    tiny_policy.model.model.embed_tokens.register_forward_hook(
        lambda *_: seen.append(torch.get_num_threads())
    )
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        generator = HFGenerator(tiny_policy, torch_threads=1, kv_reuse=kv_reuse)
        await generator.generate(task_prompts(1)[0], sampled(0))
        assert set(seen) == {1} and torch.get_num_threads() == 2
        await generator.close()
    finally:
        torch.set_num_threads(before)


async def test_a_bfloat16_engine_samples_what_the_learner_scores(tiny_policy: Policy) -> None:
    """The engine in bfloat16 (packed products where the CPU multiplies bfloat16 natively, the
    cache in float32 on a CPU): its log-probs are the bfloat16 learner's up to bfloat16 rounding
    (0.056 on this model, as transformers' own bfloat16 forward against the learner)."""
    from tests.loop.test_hf_generator import max_parity_gap

    policy = Policy(tiny_policy.model.to(torch.bfloat16), tiny_policy.tokenizer)
    generator, prompts = HFGenerator(policy, max_batch_size=3), task_prompts(3)
    got = await asyncio.gather(*(generator.generate(p, sampled(i)) for i, p in enumerate(prompts)))
    gap = max_parity_gap(policy.model, prompts, got)
    assert gap < 0.1, f"log-prob gap {gap:.2e}"
    await generator.close()
