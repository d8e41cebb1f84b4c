"""`HFGenerator` (loop/generators/hf/generator.py): stop tokens, batching that does not change
results, exact
sampler log-probs (a learner recomputation with `token_logprobs` agrees), per-request errors,
LoRA, adapter loading, training-mode restore and shutdown.

Run: python -m pytest tests/loop/test_hf_generator.py -q -s   (-s prints the parity numbers;
the SmolLM2 tests are `slow`)
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

import loop.generators.hf.generator as generator_module
from loop.generators.base import Generation, Generator, GeneratorError, SamplingParams
from loop.generators.hf.engine import Row
from loop.generators.hf.fused import can_pack
from loop.generators.hf.generator import HFGenerator, pack_prefills
from loop.learner.logprobs import token_logprobs
from loop.model.policy import LoraSettings, Policy, load_policy, policy_from_model
from tests.loop.conftest import TINY_VOCAB, chat_prompt_ids, tiny_llama, tiny_tokenizer

GREEDY = SamplingParams(max_new_tokens=10, temperature=0.0)


def prompts(count: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of different lengths (3, 5, 7, ...) over the tiny vocabulary."""
    rng = torch.Generator().manual_seed(seed)
    return [
        torch.randint(3, TINY_VOCAB, (3 + 2 * i,), generator=rng).tolist() for i in range(count)
    ]


def learner_logprobs(model, prompt: list[int], generation: Generation) -> torch.Tensor:
    """The learner's log-probs (temperature 1) of the sampled ids given prompt + prefix."""
    input_ids = torch.tensor([prompt + generation.token_ids])
    with torch.no_grad():
        return token_logprobs(model, input_ids, chunk_size=64)[0, len(prompt) :]


def max_parity_gap(model, prompt_list, generations) -> float:
    gaps = [
        (learner_logprobs(model, prompt, g) - torch.tensor(g.logprobs)).abs().max().item()
        for prompt, g in zip(prompt_list, generations, strict=True)
    ]
    return max(gaps)


async def test_honours_the_generator_protocol(tiny_policy: Policy) -> None:
    generator = HFGenerator(tiny_policy)
    assert isinstance(generator, Generator) and generator.name == "hf"
    assert generator.policy.model is tiny_policy.model  # one copy of the weights
    await generator.close()


async def test_output_ends_at_the_first_sampled_stop_token(tiny_policy: Policy) -> None:
    generator, prompt = HFGenerator(tiny_policy), prompts(1)[0]
    free = await generator.generate(prompt, SamplingParams(max_new_tokens=12, temperature=0))
    assert free.finish_reason == "length" and len(free.token_ids) == 12
    cut = next(i for i, t in enumerate(free.token_ids) if i >= 2 and t not in free.token_ids[:i])
    stop_id = free.token_ids[cut]
    params = SamplingParams(max_new_tokens=12, temperature=0, stop_token_ids=(stop_id, 0))
    stopped = await generator.generate(prompt, params)
    assert stopped.token_ids == free.token_ids[: cut + 1]  # stop id kept, nothing after it
    assert stopped.finish_reason == "stop" and len(stopped.logprobs) == cut + 1
    await generator.close()


async def test_concurrent_requests_are_batched_without_changing_results(tiny_policy) -> None:
    generator, prompt_list = HFGenerator(tiny_policy, max_batch_size=8), prompts(6)
    alone = [await generator.generate(prompt, GREEDY) for prompt in prompt_list]
    batches_before = generator.batches_run
    together = await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompt_list))
    # decode steps shared by all rows (alone: one step per token each), after the prefills:
    # one packed forward for the requests that joined together, at most one each
    prefills = generator.batches_run - batches_before - (GREEDY.max_new_tokens - 1)
    assert 1 <= prefills <= len(prompt_list)
    for single, batched in zip(alone, together, strict=True):
        assert batched.token_ids == single.token_ids
        assert (
            max(abs(a - b) for a, b in zip(batched.logprobs, single.logprobs, strict=True)) < 1e-4
        )
    await generator.close()


async def test_rows_of_one_batch_keep_their_own_params(tiny_policy: Policy) -> None:
    generator, (short, long, seeded) = HFGenerator(tiny_policy), prompts(3)
    sampling = SamplingParams(max_new_tokens=9, temperature=1.0, seed=7)
    seeded_alone = await generator.generate(seeded, sampling)
    results = await asyncio.gather(
        generator.generate(short, SamplingParams(max_new_tokens=2, temperature=0)),
        generator.generate(long, SamplingParams(max_new_tokens=7, temperature=0.5)),
        generator.generate(seeded, sampling),
    )
    assert [len(r.token_ids) for r in results] == [2, 7, 9]
    assert results[2].token_ids == seeded_alone.token_ids  # a seed gives the same sample batched
    await generator.close()


async def test_sampler_logprobs_agree_with_learner_recomputation(tiny_policy: Policy) -> None:
    generator, prompt_list = HFGenerator(tiny_policy), prompts(5)
    params = SamplingParams(max_new_tokens=16, temperature=1.0, seed=1)
    generations = await asyncio.gather(*(generator.generate(p, params) for p in prompt_list))
    gap = max_parity_gap(tiny_policy.model, prompt_list, generations)
    print(f"\ntiny model, hf sampler vs learner: max |dlogp| = {gap:.2e}")
    assert gap < 1e-4
    await generator.close()


async def test_top_p_logprobs_are_renormalised_over_the_nucleus(tiny_policy: Policy) -> None:
    generator, prompt = HFGenerator(tiny_policy), prompts(1)[0]
    generation = await generator.generate(
        prompt, SamplingParams(max_new_tokens=12, temperature=1.0, top_p=0.6, seed=3)
    )
    full = learner_logprobs(tiny_policy.model, prompt, generation)
    # q(x) = p(x) / Z with Z <= 1 the nucleus mass, so log q >= log p, equal when Z = 1
    assert all(q >= p - 1e-5 for q, p in zip(generation.logprobs, full.tolist(), strict=True))
    await generator.close()


async def test_training_mode_restored_and_kv_cache_used_with_checkpointing(
    tiny_model_dir: Path,
) -> None:
    policy = load_policy(str(tiny_model_dir), gradient_checkpointing=True)
    policy.model.train()
    step_widths: list[int] = []
    policy.model.model.embed_tokens.register_forward_hook(
        lambda _m, args, _out: step_widths.append(args[0].shape[1])
    )
    generator = HFGenerator(policy)
    await generator.generate([5, 6, 7, 8], SamplingParams(max_new_tokens=5, temperature=0))
    assert step_widths == [4, 1, 1, 1, 1]  # one prefill, then one token per step (cached)
    assert all(module.training for module in policy.model.modules())
    await generator.close()


async def test_modules_sample_in_eval_mode_and_train_again_after(tiny_model_dir: Path) -> None:
    # the flags are set from a listing made once per burst, not by `model.eval()`: every
    # module the engine calls must still see eval mode, and every flag come back
    policy = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8))
    policy.model.train()
    seen: list[bool] = []
    for layer in policy.model.base_model.model.model.layers:
        layer.input_layernorm.register_forward_hook(lambda m, _a, _o: seen.append(m.training))
    generator = HFGenerator(policy)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, seed=3)
    await asyncio.gather(*(generator.generate(p, params) for p in prompts(3)))
    assert seen and not any(seen)
    assert all(module.training for module in policy.model.modules())
    policy.model.eval()  # a flag off before sampling stays off after it
    await generator.generate(prompts(1)[0], params)
    assert not any(module.training for module in policy.model.modules())
    await generator.close()


async def test_bad_prompts_are_one_line_generator_errors(tiny_policy: Policy) -> None:
    generator = HFGenerator(tiny_policy)
    for bad, message in [([], "empty prompt"), ([5, TINY_VOCAB], "outside")]:
        with pytest.raises(GeneratorError, match=message) as excinfo:
            await generator.generate(bad, GREEDY)
        assert "\n" not in str(excinfo.value)
    await generator.close()


async def test_a_failing_request_fails_alone_and_the_batcher_survives(tiny_policy) -> None:
    poison = 1  # in a prompt (never in `prompts()`), it makes the prefill raise

    def explode(_module, args):
        if args[0].shape[1] > 1 and (args[0] == poison).any():
            raise RuntimeError("boom\nsecond line")

    tiny_policy.model.model.embed_tokens.register_forward_pre_hook(explode)
    generator, (good, other) = HFGenerator(tiny_policy), prompts(2)
    results = await asyncio.gather(
        generator.generate(good, GREEDY),
        generator.generate([4, poison, 5], GREEDY),
        generator.generate(other, GREEDY),
        return_exceptions=True,
    )
    assert isinstance(results[0], Generation) and isinstance(results[2], Generation)
    assert isinstance(results[1], GeneratorError) and str(results[1]).endswith("RuntimeError: boom")
    assert len((await generator.generate(good, GREEDY)).token_ids) == GREEDY.max_new_tokens
    await generator.close()


async def test_slots_too_small_fail_the_joining_request_alone(tiny_policy, monkeypatch) -> None:
    """Room for a request's prompt and `max_new_tokens` is reserved when it joins: a growth the
    device cannot hold fails that request before it decodes, never a step shared by every row
    (on a GPU one row's growth of all rows' slots ran out of memory and failed all 32 rows)."""
    # kv_cache_mb=0: each prompt's keys stay in its row's slot (as a later turn's do)
    generator = HFGenerator(tiny_policy, max_batch_size=4, kv_cache_mb=0)
    good, other = prompts(2)
    assert generator.engine is not None
    grow = generator.engine.reserve
    limit = 45  # tokens of capacity this "device" can hold: the long row passes it 6 steps in

    def reserve(length: int) -> None:
        if length > limit:
            raise torch.OutOfMemoryError(f"cannot grow the slots to {length} tokens")
        grow(length)

    monkeypatch.setattr(generator.engine, "reserve", reserve)
    long = SamplingParams(max_new_tokens=200, temperature=0.0)
    results = await asyncio.gather(
        generator.generate(good, GREEDY),
        generator.generate(prompts(20)[19][:40], long),
        generator.generate(other, GREEDY),
        return_exceptions=True,
    )
    assert isinstance(results[0], Generation) and isinstance(results[2], Generation)
    assert isinstance(results[1], GeneratorError) and "OutOfMemoryError" in str(results[1])
    assert [len(r.token_ids) for r in (results[0], results[2])] == [10, 10]
    await generator.close()


async def test_a_row_that_needs_room_waits_and_then_finishes(tiny_policy: Policy) -> None:
    """Under `kv_rows_mb`, a request whose row would take the rows' keys and values past it
    waits for rows to leave (never fails for room), then finishes as it would have unbounded;
    the room of a row that ends comes back, and one that could not fit alone is refused in
    one line while the others are served."""
    prompt_list = prompts(6)
    free = HFGenerator(tiny_policy, max_batch_size=8, kv_cache_mb=0)
    unbounded = await asyncio.gather(*(free.generate(p, GREEDY) for p in prompt_list))
    await free.close()
    generator = HFGenerator(tiny_policy, max_batch_size=8, kv_cache_mb=0)
    engine = generator.engine
    assert engine is not None
    longest = len(prompt_list[-1]) + GREEDY.max_new_tokens
    per_token = engine.kv_bytes(1)  # no rows yet: one token's keys and values
    generator.admission.kv_rows_bytes = 2 * longest * per_token  # room for two rows at most
    rows_decoded: list[int] = []
    decode = engine.decode

    def counting(rows, tokens):
        rows_decoded.append(len(rows))
        assert engine.kv_bytes() <= 2 * longest * per_token
        return decode(rows, tokens)

    engine.decode = counting  # type: ignore[method-assign]
    bounded = await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompt_list))
    assert [g.token_ids for g in bounded] == [g.token_ids for g in unbounded]
    assert max(rows_decoded) < len(prompt_list) and generator.admission.waits >= 2
    assert engine.kv_bytes() == 0 and not engine.rows  # every row's room came back
    too_long = SamplingParams(max_new_tokens=3 * longest, temperature=0.0)
    results = await asyncio.gather(
        generator.generate(prompt_list[0], too_long),
        generator.generate(prompt_list[1], GREEDY),
        return_exceptions=True,
    )
    assert isinstance(results[0], GeneratorError)
    assert "over generator.kv_rows_mb" in str(results[0]) and "\n" not in str(results[0])
    assert isinstance(results[1], Generation)
    assert results[1].token_ids == unbounded[1].token_ids
    await generator.close()


def test_the_rows_room_is_what_the_slots_hold(tiny_policy: Policy) -> None:
    """`kv_bytes`: on a CPU (paged slots) the rows' reserved tokens; elsewhere the slots as
    allocated, every row at the longest row's capacity."""
    generator = HFGenerator(tiny_policy, max_batch_size=4)
    engine = generator.engine
    assert engine is not None
    per_token = engine.kv_bytes(1)
    config = tiny_policy.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    assert per_token == config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * 4
    engine.rows.extend([Row(ids=[], reserved=30), Row(ids=[], reserved=100)])
    assert engine.kv_bytes(10) == 140 * per_token
    engine.slots.paged = False  # as on a GPU: max_rows x the capacity reserve() would grow to
    assert engine.kv_bytes(100) == 4 * 128 * per_token  # 100 tokens: a multiple of 64
    engine.rows.clear()


async def test_rows_joining_together_are_prefilled_in_bounded_packs(
    tiny_policy: Policy, monkeypatch
) -> None:
    """Rows that join in one step share packed prefills of at most PACKED_PREFILL_IDS ids
    (their activations bounded), and sample what one pack of all of them samples."""
    shared = prompts(1, seed=5)[0] * 8  # 24 ids every prompt starts with: a prefix entry
    prompt_list = [shared + tail[:4] for tail in prompts(7)[1:]]  # then 4 ids of their own

    async def sample(generator: HFGenerator) -> list[Generation]:
        await generator.generate(shared, GREEDY)  # the entry the others extend
        return await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompt_list))

    whole = HFGenerator(tiny_policy, max_batch_size=8)
    one_pack = await sample(whole)
    await whole.close()
    monkeypatch.setattr(generator_module, "PACKED_PREFILL_IDS", 10)
    generator = HFGenerator(tiny_policy, max_batch_size=8)
    assert generator.engine is not None
    packs: list[int] = []
    prefill_rows = generator.engine.prefill_rows

    def counting(rows, new_ids):
        packs.append(sum(len(ids) for ids in new_ids))
        return prefill_rows(rows, new_ids)

    generator.engine.prefill_rows = counting  # type: ignore[method-assign]
    bounded = await sample(generator)
    assert packs and max(packs) <= 10  # how many join in one step is the worker's timing
    assert [g.token_ids for g in bounded] == [g.token_ids for g in one_pack]
    await generator.close()


def test_packs_of_prefills_by_hand() -> None:
    assert pack_prefills([4, 4, 4, 4, 4, 4], chunk=512, most=10) == [[0, 1], [2, 3], [4, 5]]
    assert pack_prefills([3, 600, 9, 2, 10], chunk=512, most=12) == [[0, 2], [3, 4], [1]]
    assert pack_prefills([20], chunk=512, most=10) == [[0]]  # one row past `most`: alone
    assert pack_prefills([], chunk=512, most=10) == []


async def test_slots_are_freed_when_no_row_is_active(tiny_policy: Policy) -> None:
    generator = HFGenerator(tiny_policy, max_batch_size=4)
    assert generator.engine is not None
    await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompts(3)))
    assert generator.engine.nbytes == 0 and not generator.engine.rows
    await generator.close()


async def test_stored_keys_and_values_lose_nothing_in_the_model_dtype(tiny_model_dir) -> None:
    """On a GPU the slots hold keys and values in the model's dtype (half of float32's memory
    in bf16): they leave the projections and the rotary embedding in that dtype, so nothing is
    rounded; a bfloat16 cache serves every path (prefix entries, own slots, later turns). On a
    CPU the default is float32 (the attention's type: no conversion every step)."""
    from loop.generators.hf.engine import DecoderEngine

    policy = load_policy(str(tiny_model_dir), dtype="bfloat16")
    assert DecoderEngine(policy.model, max_rows=2).own.dtype == torch.float32  # on a CPU
    engine = DecoderEngine(policy.model, max_rows=2, kv_dtype=torch.bfloat16)  # as on a GPU
    assert engine.own.dtype == torch.bfloat16
    base = policy.model.model
    x = base.embed_tokens(torch.tensor([prompts(1)[0]]))
    rotary = base.rotary_emb(x, torch.arange(x.shape[1])[None])
    _, k, v = engine._qkv(0, x, rotary)
    assert torch.equal(k.to(torch.bfloat16).float(), k)
    assert torch.equal(v.to(torch.bfloat16).float(), v)
    outputs = {}
    for kv_dtype in (torch.bfloat16, torch.float32):
        for store_mb in (1024, 0):  # prompts as prefix entries, and in the rows' own slots
            generator = HFGenerator(policy, max_batch_size=4, kv_cache_mb=store_mb)
            generator.engine = DecoderEngine(policy.model, max_rows=4, kv_dtype=kv_dtype)
            first = await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompts(3)))
            again = await generator.generate(prompts(3)[2] + first[2].token_ids + [5, 6], GREEDY)
            assert [len(g.token_ids) for g in (*first, again)] == [10] * 4
            assert generator.engine.own.dtype == kv_dtype
            outputs[kv_dtype, store_mb] = [g.token_ids for g in (*first, again)]
            await generator.close()
    assert len({str(tokens) for tokens in outputs.values()}) == 1  # the same keys either way


async def test_close_fails_new_requests(tiny_policy: Policy) -> None:
    generator = HFGenerator(tiny_policy)
    await generator.generate([3, 4], GREEDY)
    await generator.close()
    with pytest.raises(GeneratorError, match="closed"):
        await generator.generate([3, 4], GREEDY)


async def test_lora_policy_generates_through_peft(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8))
    generator, prompt_list = HFGenerator(policy), prompts(3)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, seed=5)
    generations = await asyncio.gather(*(generator.generate(p, params) for p in prompt_list))
    assert all(len(g.token_ids) == 8 for g in generations)
    assert max_parity_gap(policy.model, prompt_list, generations) < 1e-4
    await generator.close()


async def test_load_adapter_copies_trained_lora_weights(tiny_model_dir: Path, tmp_path) -> None:
    lora, prompt = LoraSettings(rank=4, alpha=8), prompts(1)[0]
    trained = load_policy(str(tiny_model_dir), lora=lora)
    with torch.no_grad():  # stand-in for training: make the adapter change the outputs
        for name, param in trained.model.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    trained.model.save_pretrained(tmp_path / "adapter")
    expected = await HFGenerator(trained).generate(prompt, GREEDY)

    fresh = load_policy(str(tiny_model_dir), lora=lora)
    generator = HFGenerator(fresh)
    before = await generator.generate(prompt, GREEDY)
    generator.load_adapter(None)  # no-op: the learner's weights are the model's
    generator.load_adapter(tmp_path / "adapter")
    after = await generator.generate(prompt, GREEDY)
    assert after.token_ids == expected.token_ids != before.token_ids
    await generator.close()


async def test_load_adapter_bad_inputs_are_one_line_errors(tiny_policy, tmp_path) -> None:
    generator = HFGenerator(tiny_policy)
    with pytest.raises(ValueError, match="needs a LoRA policy"):
        generator.load_adapter(tmp_path)
    generator.load_adapter(None)
    await generator.close()


@pytest.mark.slow
async def test_smollm2_stop_token_and_learner_parity(smollm2_policy: Policy) -> None:
    tokenizer, generator = smollm2_policy.tokenizer, HFGenerator(smollm2_policy)
    questions = ["What is 2 + 3? Answer with one number.", "Name a colour.", "Say hello."]
    prompt_list = [chat_prompt_ids(tokenizer, q) for q in questions]
    params = SamplingParams(max_new_tokens=40, temperature=1.0, stop_token_ids=(2,), seed=0)
    generations = await asyncio.gather(*(generator.generate(p, params) for p in prompt_list))
    for g in generations:
        assert (g.finish_reason == "stop") == (g.token_ids[-1] == 2)
        assert 2 not in g.token_ids[:-1]
    gap = max_parity_gap(smollm2_policy.model, prompt_list, generations)
    print(f"\nSmolLM2-135M, hf sampler vs learner: max |dlogp| = {gap:.2e}")
    assert gap < 1e-3
    await generator.close()


@pytest.mark.slow
async def test_smollm2_batched_greedy_equals_alone(smollm2_policy: Policy) -> None:
    generator = HFGenerator(smollm2_policy)
    questions = ["List three fruits.", "What is the capital of France?", "Count to five."]
    prompt_list = [chat_prompt_ids(smollm2_policy.tokenizer, q) for q in questions]
    params = SamplingParams(max_new_tokens=16, temperature=0, stop_token_ids=(2,))
    alone = [await generator.generate(p, params) for p in prompt_list]
    together = await asyncio.gather(*(generator.generate(p, params) for p in prompt_list))
    assert [g.token_ids for g in together] == [g.token_ids for g in alone]
    await generator.close()


async def test_rows_never_grow_past_max_context_tokens(tiny_policy, monkeypatch) -> None:
    """A request's output is cut to the room its prompt leaves under `max_context_tokens`, so
    its slot never holds more; a prompt that leaves no room is a one-line error of its own."""
    generator = HFGenerator(tiny_policy, max_batch_size=2, kv_cache_mb=0, max_context_tokens=12)
    assert generator.engine is not None
    seen: list[int] = []
    grow = generator.engine.reserve

    def reserve(length: int) -> None:
        grow(length)
        seen.append(generator.engine.own.shape[4])  # the slots' capacity after any growth

    monkeypatch.setattr(generator.engine, "reserve", reserve)
    long = SamplingParams(max_new_tokens=50, temperature=0.0)
    short, full = prompts(4)[3], list(range(3, 15))  # 9 and 12 ids
    got = await generator.generate(short, long)
    assert len(got.token_ids) == 12 - len(short) and got.finish_reason == "length"
    assert seen and max(seen) <= 12
    with pytest.raises(GeneratorError, match="leaves no room under max_context_tokens=12"):
        await generator.generate(full, long)
    assert len((await generator.generate(short, GREEDY)).token_ids) == 3
    await generator.close()


def test_kv_cache_budget_is_a_share_of_free_gpu_memory_when_unset(tiny_policy, monkeypatch):
    import loop.generators.hf.memory as hf

    assert HFGenerator(tiny_policy).cache.budget_bytes == hf.CPU_KV_CACHE_MB * 2**20
    assert HFGenerator(tiny_policy, kv_cache_mb=3).cache.budget_bytes == 3 * 2**20
    free = 40 * 2**30
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    on_gpu = Policy(tiny_policy.model, tiny_policy.tokenizer, torch.device("cuda"))
    assert HFGenerator(on_gpu).cache.budget_bytes == int(hf.KV_FREE_SHARE * free)


async def test_release_memory_frees_the_store_and_the_slots_and_sampling_goes_on(tiny_policy):
    """The trainer calls it before the learner's step: the store and the slots hold nothing
    after, and the next request samples what it would have from a fresh generator."""
    generator = HFGenerator(tiny_policy, max_batch_size=4)
    first = await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompts(3)))
    assert generator.cache.nbytes > 0
    generator.release_memory()
    assert generator.cache.nbytes == 0 and generator.engine is not None
    assert generator.engine.nbytes == 0
    again = await generator.generate(prompts(3)[1], GREEDY)
    assert again.token_ids == first[1].token_ids
    await generator.close()


async def test_while_sampling_the_frozen_weights_are_held_once() -> None:
    """On a CPU with packed products the plain fused weights are dropped while sampling (their
    pages back, the packed copies serve): the weights' fingerprint stays what it was, so the
    burst refreshes once, not every step; `release_memory` brings them back for the
    learner, whose forward then computes what it did before sampling."""
    policy = policy_from_model(
        tiny_llama(), tiny_tokenizer(), torch.device("cpu"), lora=LoraSettings(rank=4, alpha=8)
    )
    generator = HFGenerator(policy, max_batch_size=4)
    engine = generator.engine
    assert engine is not None and engine.fused is not None
    group = engine.fused[0].gate_up
    assert group.memory is not None and group.weight is not None
    if not (group.memory.paged and can_pack(group.weight)):
        pytest.skip("no oneDNN packed products on this machine: nothing is dropped")
    ids = torch.tensor([prompts(1)[0]])
    with torch.no_grad():
        before = policy.model(ids).logits
    refreshes = []
    refresh = engine.refresh
    engine.refresh = lambda: (refreshes.append(1), refresh())[1]  # type: ignore[method-assign]
    await asyncio.gather(*(generator.generate(p, GREEDY) for p in prompts(3)))
    assert len(refreshes) == 1 and group.dropped
    generator.release_memory()
    assert not group.dropped
    with torch.no_grad():
        assert torch.equal(policy.model(ids).logits, before)
    await generator.close()


async def test_engine_work_counts_the_decode_steps_and_the_prefilled_ids(tiny_policy) -> None:
    generator, batch = HFGenerator(tiny_policy, max_batch_size=4), prompts(4, seed=5)
    before = generator.stats()  # a copy: the worker counts on
    params = SamplingParams(max_new_tokens=6, temperature=0.0)
    outs = await asyncio.gather(*(generator.generate(p, params) for p in batch))
    work = generator.stats().work_since(before, "gen/")
    # every sampled id after a row's first came from a decode step (the first from its prefill)
    decoded = sum(len(out.token_ids) - 1 for out in outs)
    assert work["gen/decode_rows_mean"] * generator.work.decode_steps == decoded
    assert work["gen/prefill_tokens"] + generator.cache.stats.reused_tokens == sum(map(len, batch))
    assert work["gen/decode_s"] > 0 and work["gen/prefill_s"] > 0
    await generator.close()
