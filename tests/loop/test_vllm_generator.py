"""`VLLMGenerator` (loop/generators/vllm/inprocess.py) with the real vLLM CPU engine
and SmolLM2-135M.

One engine (LoRA enabled, float32) serves the whole module, token exactness on real
multi-turn rollouts included (tests/loop/test_token_exactness.py's checks): start-up takes
about half a minute here. The tests share one event loop for the same reason (the engine's
output handler lives on the loop of its first request), and the last test closes the engine
and checks that no vLLM process or thread is left.

Run: python -m pytest tests/loop/test_vllm_generator.py -q -s   (-s prints the timings and
the vLLM-vs-transformers log-prob differences; every test here is `slow`)
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
import torch

from loop.generators.base import Generation, Generator, GeneratorError, SamplingParams
from loop.model.aliases import resolve_model
from tests.loop.conftest import chat_prompt_ids

pytestmark = [
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]

IM_END = 2  # SmolLM2's <|im_end|>: the end of an assistant turn
QUESTIONS = ["Say hi.", "What is 2 + 3?", "Name a colour.", "Write a haiku about tea."]


def greedy(max_new_tokens: int = 24) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(IM_END,))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Torch in this process gets one thread: the engine's worker spins on a core of its own,
    and two torch threads contending with it make a SmolLM2 forward pass ~10x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_model("smollm2-135m")


@pytest.fixture(scope="module")
def hf_model(model_dir: str):
    """The same weights in plain transformers, float32, for recomputing log-probs."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def tokenizer(model_dir: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def before_engine() -> tuple[set[int | None], set[int]]:
    """The threads and child processes that exist before the engine starts."""
    import psutil

    threads = {thread.ident for thread in threading.enumerate()}
    return threads, {child.pid for child in psutil.Process().children(recursive=True)}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def generator(model_dir: str, before_engine) -> AsyncIterator[Generator]:
    from loop.generators.vllm.inprocess import VLLMGenerator

    started = time.perf_counter()
    engine = VLLMGenerator(model_dir, max_model_len=2048, enable_lora=True, max_lora_rank=8)
    print(f"\nvLLM engine start-up: {time.perf_counter() - started:.1f} s")
    yield engine
    await engine.close()


def recomputed_logprobs(model, prompt: list[int], generation: Generation, temperature: float):
    """log_softmax(logits / T) of the full vocabulary at each output position, gathered."""
    ids = torch.tensor([prompt + generation.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)  # greedy: T=1
    return logprobs.gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]


async def test_output_ends_at_the_stop_token_or_the_length_limit(generator, tokenizer) -> None:
    assert isinstance(generator, Generator)
    prompt = chat_prompt_ids(tokenizer, QUESTIONS[0])
    stopped = await generator.generate(prompt, greedy(64))
    assert stopped.finish_reason == "stop", stopped
    assert stopped.token_ids[-1] == IM_END and IM_END not in stopped.token_ids[:-1]
    assert stopped.logprobs is not None and len(stopped.logprobs) == len(stopped.token_ids)
    assert tokenizer.decode(stopped.token_ids).endswith("<|im_end|>")
    cut = await generator.generate(prompt, SamplingParams(max_new_tokens=3, temperature=0.0))
    assert cut.finish_reason == "length" and cut.token_ids == stopped.token_ids[:3]


async def test_concurrent_requests_complete_and_greedy_is_batch_invariant(
    generator, tokenizer
) -> None:
    prompt = chat_prompt_ids(tokenizer, QUESTIONS[3])
    alone = await generator.generate(prompt, greedy())
    others = [chat_prompt_ids(tokenizer, q) for q in QUESTIONS for _ in range(2)]
    sampled = SamplingParams(max_new_tokens=24, temperature=1.0, stop_token_ids=(IM_END,))
    started = time.perf_counter()
    results = await asyncio.gather(
        generator.generate(prompt, greedy()), *(generator.generate(p, sampled) for p in others)
    )
    elapsed = time.perf_counter() - started
    tokens = sum(len(result.token_ids) for result in results)
    print(f"\n{len(results)} concurrent requests: {tokens} tokens, {tokens / elapsed:.0f} tokens/s")
    assert results[0].token_ids == alone.token_ids
    assert all(
        result.token_ids and result.finish_reason in ("stop", "length") for result in results
    )


async def test_sampled_logprobs_agree_with_transformers(generator, tokenizer, hf_model) -> None:
    prompts = [chat_prompt_ids(tokenizer, q) for q in QUESTIONS]
    settings = [(temperature, seed) for temperature in (1.0, 0.7, 0.0) for seed in (1, 2)]
    requests = [
        (prompt, SamplingParams(32, temperature=t, stop_token_ids=(IM_END,), seed=seed))
        for prompt in prompts[:2]
        for t, seed in settings
    ]
    results = await asyncio.gather(*(generator.generate(p, params) for p, params in requests))
    worst = 0.0
    for (prompt, params), result in zip(requests, results, strict=True):
        expected = recomputed_logprobs(hf_model, prompt, result, params.temperature)
        gap = (torch.tensor(result.logprobs) - expected).abs().max().item()
        worst = max(worst, gap)
    print(f"\nvLLM vs transformers sampled-token log-probs: max |diff| = {worst:.2e}")
    assert worst < 1e-3, worst


async def test_rollouts_are_token_exact(generator, tokenizer, hf_model, before_engine) -> None:
    """tests/loop/test_token_exactness.py's checks on this engine (base weights): real
    multi-turn app-world rollouts, token in, token out."""
    from tests.loop.test_token_exactness import assert_token_exact, roll_out

    threads = {thread.ident for thread in threading.enumerate()}
    results = await roll_out(generator, tokenizer, n_tasks=2)
    # the sandbox side's threads (its process-wide pools, this loop's executor) are not the
    # engine's: the last test's check of what close() leaves behind passes over them
    before_engine[0].update({t.ident for t in threading.enumerate()} - threads)
    assert_token_exact("vllm", results, tokenizer, hf_model)


def save_random_lora(base_model, path: Path, seed: int):
    """A rank-8 LoRA on q/v with random (non-zero) A and B on a copy of `base_model`, saved
    with peft; returns the peft model."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False
    )
    lora_model = get_peft_model(copy.deepcopy(base_model), config).eval()
    lora_model.save_pretrained(path)
    return lora_model


async def test_lora_adapter_changes_output_and_none_restores_base(
    generator, tokenizer, hf_model, tmp_path: Path
) -> None:
    prompt = chat_prompt_ids(tokenizer, QUESTIONS[2])
    base = await generator.generate(prompt, greedy())
    save_random_lora(hf_model, tmp_path / "adapter", seed=0)
    generator.load_adapter(tmp_path / "adapter")
    first = await generator.generate(prompt, greedy())
    lora_model = save_random_lora(hf_model, tmp_path / "adapter", seed=1)  # overwritten in place
    generator.load_adapter(tmp_path / "adapter")
    second = await generator.generate(prompt, greedy())
    generator.load_adapter(None)
    restored = await generator.generate(prompt, greedy())
    assert first.token_ids != base.token_ids
    assert second.token_ids != first.token_ids  # a new adapter id, so vLLM reloaded the files
    assert restored.token_ids == base.token_ids
    expected = recomputed_logprobs(lora_model, prompt, second, temperature=0.0)
    gap = (torch.tensor(second.logprobs) - expected).abs().max().item()
    print(f"\nvLLM+LoRA vs peft log-probs: max |diff| = {gap:.2e}")
    assert gap < 1e-3, gap


async def test_load_adapter_bad_inputs_are_one_line_errors(generator, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"adapter_config\.json missing"):
        generator.load_adapter(tmp_path)
    monkeypatch.setattr(generator, "enable_lora", False)
    with pytest.raises(ValueError, match="enable_lora=True"):
        generator.load_adapter(tmp_path)


async def test_bad_requests_are_one_line_generator_errors(generator) -> None:
    bad = [([], "empty prompt"), ([10**8], "out of vocabulary"), ([1] * 3000, "maximum model")]
    for prompt, reason in bad:
        with pytest.raises(GeneratorError, match=reason) as caught:
            await generator.generate(prompt, greedy())
        assert "\n" not in str(caught.value)
    assert (await generator.generate([1, 2, 3], greedy(2))).token_ids  # the engine survived


async def test_engine_start_failure_is_a_one_line_generator_error(tmp_path: Path) -> None:
    from loop.generators.vllm.inprocess import VLLMGenerator

    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(GeneratorError, match="failed to start") as caught:
        VLLMGenerator(str(tmp_path))
    assert "\n" not in str(caught.value)


async def test_close_leaves_no_process_or_thread(generator, before_engine) -> None:
    """Runs last in this module: it closes the shared engine."""
    import psutil

    threads_before, children_before = before_engine
    await generator.close()
    children = [
        " ".join(child.cmdline())
        for child in psutil.Process().children(recursive=True)
        if child.pid not in children_before
    ]
    # multiprocessing's resource tracker is Python's own, one per process and reused.
    assert [cmd for cmd in children if "resource_tracker" not in cmd] == []
    new_threads = [t.name for t in threading.enumerate() if t.ident not in threads_before]
    assert [name for name in new_threads if name != "tqdm_monitor"] == []  # tqdm's, shared
    with pytest.raises(GeneratorError, match="closed"):
        await generator.generate([1, 2, 3], greedy())
