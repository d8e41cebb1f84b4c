"""`loop.generators.vllm.server.VLLMServerGenerator` with a real vLLM CPU server (SmolLM2-135M).

One server, started once for the module (about a minute here), with LoRA slots: real
multi-turn app-world rollouts through it are token exact (tests/loop/test_token_exactness.py's
checks, base weights), versions published under their own names sample differently, the
server's log-probs of a rollout equal peft's after publication, a version's prefix-cache
blocks are never reused by another, a second client attaches by URL, and close() leaves no
process. Routing between servers is worked by hand in test_routing.py; a server killed
mid-request on stub servers in test_server_failures.py; the whole trainer under torchrun with
this backend, its real server killed while requests run on it and restarted, in
tests/test_rehearsal.py.

Run: python -m pytest tests/loop/test_vllm_server.py -q -s     (`slow`)
"""

from __future__ import annotations

import copy
import importlib.util
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import torch

from loop.generators.base import Generation, GeneratorError, SamplingParams
from loop.generators.vllm.process import ServerProcess
from loop.model.aliases import resolve_model
from tests.loop.conftest import chat_prompt_ids
from tests.loop.test_server_process import running

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed"),
]
ARGS = [
    "--served-model-name", "base", "--dtype", "float32", "--max-model-len", "2048",
    "--gpu-memory-utilization", "0.1",  # on CPU: the KV cache's share of host memory
    "--enable-prefix-caching", "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1",
    "--generation-config", "vllm", "--enforce-eager", "--seed", "0",
    "--enable-lora", "--max-lora-rank", "8", "--max-loras", "2", "--enable-prompt-tokens-details",
]  # fmt: skip
IM_END = 2  # SmolLM2's <|im_end|>: the end of an assistant turn
QUESTIONS = ["Say hi.", "What is 2 + 3?", "Name a colour.", "Write a haiku about tea."]


def greedy(max_new_tokens: int = 24) -> SamplingParams:
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, stop_token_ids=(IM_END,))


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Torch in this process gets one thread: the server's engine spins on a core of its own,
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


def recomputed_logprobs(model, prompt: list[int], generation: Generation, temperature: float):
    """log_softmax(logits / T) of the full vocabulary at each output position, gathered."""
    ids = torch.tensor([prompt + generation.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logprobs = torch.log_softmax(logits / (temperature or 1.0), dim=-1)  # greedy: T=1
    return logprobs.gather(-1, torch.tensor(generation.token_ids)[:, None])[:, 0]


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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def generator(model_dir: str, tmp_path_factory) -> AsyncIterator:
    from loop.generators.vllm.server import VLLMServerGenerator

    logs = tmp_path_factory.mktemp("servers")
    process = ServerProcess(["--model", model_dir, *ARGS], log_path=logs / "server-0.log")
    started = time.perf_counter()
    served = VLLMServerGenerator(base_model="base", adapter_prefix="test", processes=[process])
    print(f"\nvLLM server start-up: {time.perf_counter() - started:.1f} s")
    yield served
    pids = {process.pid}
    await served.close()
    assert process.pid is None and not any(running(pid) for pid in pids if pid)


def served_models(generator) -> set[str]:
    body = httpx.get(generator.servers[0].url + "/models", timeout=30).json()
    return {entry["id"] for entry in body["data"]}


async def test_rollouts_are_token_exact(generator, tokenizer, hf_model) -> None:
    """tests/loop/test_token_exactness.py's checks through the server (base weights: runs
    before any adapter is published): real multi-turn app-world rollouts, token in, token out."""
    from tests.loop.test_token_exactness import assert_token_exact, roll_out

    results = await roll_out(generator, tokenizer, n_tasks=2)
    assert all(turn.adapter_version == "base" for traj, _ in results for turn in traj.turns)
    assert_token_exact("vllm_server", results, tokenizer, hf_model)


async def test_versions_sample_under_their_own_names_and_match_peft(
    generator,
    tokenizer,
    hf_model,
    tmp_path: Path,
) -> None:
    prompt = chat_prompt_ids(tokenizer, QUESTIONS[2])
    base = await generator.generate(prompt, greedy())
    assert base.adapter_version == "base" and base.finish_reason == "stop"
    save_random_lora(hf_model, tmp_path / "iter-1", seed=0)
    generator.load_adapter(tmp_path / "iter-1")
    first = await generator.generate(prompt, greedy())
    lora_model = save_random_lora(hf_model, tmp_path / "iter-2", seed=1)
    generator.load_adapter(tmp_path / "iter-2")
    second = await generator.generate(prompt, greedy())
    assert first.adapter_version == "test-v1"
    assert second.adapter_version == "test-v2"
    assert len({tuple(base.token_ids), tuple(first.token_ids), tuple(second.token_ids)}) == 3
    assert served_models(generator) == {"base", "test-v2"}  # v1 unloaded: no request used it
    # the server samples from the published weights: its log-probs are peft's
    sampled = [
        await generator.generate(prompt, SamplingParams(32, temperature=1.0, seed=seed))
        for seed in (1, 2)
    ]
    gaps = [
        (torch.tensor(s.logprobs) - recomputed_logprobs(lora_model, prompt, s, 1.0)).abs().max()
        for s in sampled
    ]
    print(f"\nserver+LoRA vs peft log-probs after publication: max |diff| = {max(gaps):.2e}")
    assert max(gaps) < 1e-3, gaps


async def test_a_bad_adapter_is_refused_in_one_line_and_the_servers_keep_serving(
    generator,
    tokenizer,
    tmp_path: Path,
) -> None:
    current = generator.current
    with pytest.raises(GeneratorError, match="no vLLM server loaded") as caught:
        generator.load_adapter(tmp_path / "missing")
    assert "\n" not in str(caught.value) and "visible on the server" in str(caught.value)
    assert generator.current == current and generator.restarts == 0
    again = await generator.generate(chat_prompt_ids(tokenizer, QUESTIONS[0]), greedy(4))
    assert again.adapter_version == current


async def test_a_version_never_reuses_another_versions_cached_prefix(
    generator,
    tokenizer,
) -> None:
    """The same prompt under the same version hits the prefix cache; under a new version of
    the same files (a new name and cache salt) nothing is reused, though the tokens match."""
    prompt = chat_prompt_ids(tokenizer, QUESTIONS[3] * 60)  # several cache blocks long
    await generator.generate(prompt, greedy(2))
    warm = await generator.generate(prompt, greedy(2))
    generator.load_adapter(generator.adapter_path)  # the same files: a new version and salt
    fresh = await generator.generate(prompt, greedy(2))
    assert fresh.adapter_version != warm.adapter_version
    assert warm.cached_tokens >= len(prompt) // 2, warm
    assert fresh.cached_tokens == 0, fresh


async def test_a_client_attaches_by_url_and_leaves_the_server_running(
    generator,
    tokenizer,
) -> None:
    from loop.generators.vllm.server import VLLMServerGenerator

    attached = VLLMServerGenerator(
        base_model="base", adapter_prefix="other", urls=[generator.servers[0].url]
    )
    result = await attached.generate(chat_prompt_ids(tokenizer, QUESTIONS[1]), greedy(8))
    assert result.token_ids and result.server == 0
    await attached.close()
    assert generator.servers[0].process.alive()
    with pytest.raises(GeneratorError, match=r"no vLLM server answers at http://127\.0\.0\.1:9/v1"):
        VLLMServerGenerator(base_model="base", adapter_prefix="x", urls=["http://127.0.0.1:9/v1"])
