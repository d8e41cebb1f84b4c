"""The GPU smoke test and the learner's figures on one GPU, random weights of real configs.

    python benchmarks/bench_gpu.py --out DIR [--sections env sdpa learner ...] [--tiny]

No checkpoint is downloaded: each model is built from its published shape (`SHAPES`: the
`config.json` of Qwen2.5-0.5B/7B/32B-Instruct) with random weights, in bfloat16, directly on
the GPU. Every section runs in its own subprocess under its own time limit (one that runs out
of memory or hangs costs only its own rows) and appends JSON lines to DIR/results.jsonl;
DIR/table.md is written from them at the end. `--tiny` runs every section on a 2-layer model
on the CPU, the check that the script itself works before a GPU is spent on it.

Sections, in order (the cheapest and most likely to break first):
- `env`: card, torch, CUDA, and a bf16 8192^3 matrix product (the card's reachable peak).
- `sdpa`: the attention kernel probe: causal SDPA at 8K with Qwen2.5-7B's grouped-query heads
  (28 query, 4 key/value heads of 128), bf16 and fp32, each backend (flash, memory-efficient,
  cuDNN, math) with `enable_gqa=True` and with repeated keys: which run, forward+backward
  time and peak memory.
- `learner`: the project's `Learner` (loop/learner/learner.py) on one synthetic rollout of T
  tokens (random ids, the last 90% output, as the trainer's stress test), LoRA r16 on all
  linear layers and full fine-tuning, gradient checkpointing on, logprob chunks of 1024 (the
  32B config's settings): the old-log-prob pass (forward) and one optimizer step
  (`learn`: forward, backward, clip, AdamW) at 8K, 16K and 32K tokens. tokens/s, peak memory
  (`torch.cuda.max_memory_allocated`), MFU: model FLOPs / time / the card's dense bf16 peak
  (H100 and H200 SXM: 989.4 TFLOP/s), with model FLOPs per token 2 N (weights; N without the
  embedding) + 2 V d for each output token (LM head) + 2 L d T (causal attention: QK^T and AV
  over T/2 keys on average, 2 * 2 * T/2 * d), times 3 for a full fine-tuning step and 2 for
  a LoRA step (no weight gradients of the frozen base); activation recomputation is not
  counted, as MFU conventionally does not.
- `checkpointing`: LoRA's step on Qwen2.5-7B at 8K with and without gradient checkpointing:
  step time, MFU, peak; transformers' RMSNorm against the one-kernel norm (loop/model/norms.py:
  learning from the same weights, then the step time); the checkpointed step's GPU time by
  kernel (the top 25).
- `peak`: the same step without checkpointing in a fresh process, what is live at its peak by
  kind (torch profiler's memory timeline).
- `prefix`: the learner with a step's common start run once (loop/learner/prefix.py) against
  every sequence run whole, on Qwen2.5-7B with LoRA r16 and no gradient checkpointing (the
  shared prefix needs the cache a checkpointed layer drops): 6 rollouts of PREFIX_TOKENS shared
  prompt ids and SUFFIX_TOKENS of their own (the last 90% output), the recompute of their old
  log-probs and one optimizer step over the 6, time and peak memory each way, and the largest
  gap between the two ways' old log-probs (bf16: sums in another order).
- `logprobs`: `token_logprobs` (chunked LM head) against `token_logprobs_naive` (the full
  (T, V) logits) on Qwen2.5-0.5B (vocabulary 151,936), forward+backward peak memory and time.
- `engine`: the `hf` generator (loop/generators/hf/generator.py) decoding 32 rows, each with its own
  random prompt of 8,100 tokens, on Qwen2.5-7B: wall time, peak memory, the row slots' and
  the KV store's bytes, the memory still held after the last row finished. Three runs: the
  default settings (each first-turn prompt becomes a prefix entry); `kv_cache_mb=0`, so every
  prompt's keys live in its row slot, as a later turn's retained cache does; the same with the
  process capped at an H100's 80 GB (`torch.cuda.set_per_process_memory_fraction`), to see how
  a failure spreads across rows. Then (`engine_syncs`) the host-device synchronisations of one
  decode step and of sampling at 32 rows (`torch.cuda.set_sync_debug_mode`).
- `engine_long`: the same engine, 32 rows of 8K, 12K and 24K-token prompts with every key in
  its row slot: peak memory against the preflight's engine rule, prefill tokens/s.
- `parity`: bf16 log-probs of the `hf` generator's samples against the learner's recompute
  (Qwen2.5-0.5B, LM head scaled so the next-token distribution is peaked as a trained
  model's: its mean entropy is reported).
- `fourbit`: an NF4 4-bit base (bitsandbytes, carried as a wheel) + LoRA through the project's
  own `load_policy`, the trainer's stress test at 8K and one optimizer step, peak memory.
- `learner32b`: the learner on Qwen2.5-32B with LoRA at 8K and 16K tokens (its 64 layers when
  they fit the card with room for activations, else as many as fit, said in the output).
- `server` (where vLLM is installed): the trainer's server backend on Qwen2.5-0.5B's shape
  (`--tiny`: a 2-layer model with 64-wide heads, which vLLM's CPU kernels take): one vLLM
  OpenAI server started by `ServerProcess` (scrubbed environment, the first GPU), a LoRA
  adapter with random non-zero factors published twice the trainer's way (`publish_weights`:
  atomic directory, a new name and cache salt per version), start-up and publication times,
  and the server's sampling log-probs against the learner's recompute (`token_logprobs`) of
  the same tokens through the same adapter.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loop.preflight.shapes import SHAPES as PUBLISHED  # noqa: E402  (after the path insert)

# Published shapes (config.json of each Qwen2.5-*-Instruct, kept in loop/preflight/shapes.py);
# "tiny" is for --tiny on a CPU.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-0.5b": PUBLISHED["Qwen/Qwen2.5-0.5B-Instruct"],
    "qwen2.5-7b": PUBLISHED["Qwen/Qwen2.5-7B-Instruct"],
    "qwen2.5-32b": PUBLISHED["Qwen/Qwen2.5-32B-Instruct"],
    "tiny": PUBLISHED["tiny"],
}
BF16_PEAK = {"H100": 989.4e12, "H200": 989.4e12}  # dense bf16, SXM (NVIDIA data sheets)
SECTIONS = (
    "env", "sdpa", "learner", "lora", "checkpointing", "peak", "prefix", "logprobs", "engine",
    "engine_long", "parity", "learner32b", "fourbit", "server", "skipped",
)  # fmt: skip
TIME_LIMITS = {  # seconds per section on the GPU (the whole run must fit one device call)
    "env": 60, "sdpa": 60, "learner": 150, "lora": 150, "checkpointing": 150, "peak": 150,
    "prefix": 120, "logprobs": 60, "engine": 180, "engine_long": 240, "parity": 60,
    "learner32b": 150, "fourbit": 120, "server": 300, "skipped": 30,
}  # fmt: skip
REPEATS = 5  # timed repeats of a decode step, of its sampling and of rows joining
JOIN_TOKENS = 40  # new ids of a row joining for its next turn (glue and an observation)
H100_BYTES = 80e9  # an H100 SXM's memory, for the capped engine run
PARITY_SCALES = (4.0, 8.0)  # LM-head scales: next-token entropies of 9 and 1.3 nats on 0.5B
ENGINE_RUNS = {  # the engine section's runs: (kv_cache_mb, memory cap in bytes)
    "default": (1024, None), "slots": (0, None), "slots-h100": (0, H100_BYTES),
    "auto": (None, None),  # kv_cache_mb unset: the budget from the GPU's free memory
}  # fmt: skip


# -- plumbing -------------------------------------------------------------------------------
class Out:
    """Appends result rows to DIR/results.jsonl as they come (nothing lost to a later crash)."""

    def __init__(
        self, directory: Path, section: str, tiny: bool, engine_runs: Any = (), long: Any = ()
    ):
        self.path, self.section, self.tiny = directory / "results.jsonl", section, tiny
        self.engine_runs = list(engine_runs) or list(ENGINE_RUNS)
        self.engine_long = tuple(long) or ENGINE_LONG

    def row(self, **fields: Any) -> None:
        fields = {"section": self.section, **fields}
        print(json.dumps(fields), flush=True)
        with self.path.open("a") as f:
            f.write(json.dumps(fields) + "\n")


def device(tiny: bool) -> Any:
    import torch

    return torch.device("cpu" if tiny else "cuda")


def reset_peak(tiny: bool) -> None:
    import torch

    if not tiny:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(tiny: bool) -> float | None:
    import torch

    return None if tiny else round(torch.cuda.max_memory_allocated() / 2**30, 2)


def allocated_gib(tiny: bool) -> float | None:
    import torch

    return None if tiny else round(torch.cuda.memory_allocated() / 2**30, 2)


def sync(tiny: bool) -> None:
    import torch

    if not tiny:
        torch.cuda.synchronize()


def card_peak() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    return next((peak for key, peak in BF16_PEAK.items() if key in name), None)


def build_model(shape: str, tiny: bool, *, layers: int | None = None, dtype: str = "bfloat16"):
    """A Qwen2 causal LM of `shape` with random weights, built on the device in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    dims = dict(SHAPES["tiny" if tiny else shape])
    if layers is not None:
        dims["num_hidden_layers"] = layers
    config = Qwen2Config(
        **dims, max_position_embeddings=40960, rope_theta=1e6, rms_norm_eps=1e-6,
        use_sliding_window=False, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device(tiny)):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model


def tokenizer(vocab: int) -> Any:
    """A word-level fast tokenizer (pad 0, eos 1, " the" 2): enough for the learner's needs."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1, "the": 2, "<unk>": 3}
    words.update({f"w{i}": i for i in range(4, vocab)})
    core = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def body_params(model: Any) -> int:
    """Parameters of the decoder layers and the final norm (no embedding, no LM head)."""
    from loop.model.aliases import causal_lm

    inner = causal_lm(model).model
    return sum(p.numel() for p in inner.layers.parameters()) + sum(
        p.numel() for p in inner.norm.parameters()
    )


def forward_flops(model: Any, tokens: int, outputs: int) -> float:
    """Model FLOPs of one forward pass (see the module docstring)."""
    from loop.model.aliases import causal_lm

    config = causal_lm(model).config
    d_attn = config.num_attention_heads * (config.hidden_size // config.num_attention_heads)
    return (
        2 * body_params(model) * tokens
        + 2 * config.vocab_size * config.hidden_size * outputs
        + 2 * config.num_hidden_layers * d_attn * tokens * tokens
    )


def synthetic_sample(tokens: int, vocab: int, seed: int) -> Any:
    """One rollout of random ids, its last 90% output (the trainer's stress-test layout)."""
    import torch

    from loop.learner.batch import Sample

    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, vocab, (tokens,), generator=generator)
    is_output = torch.zeros(tokens, dtype=torch.bool)
    is_output[tokens // 10 :] = True
    return Sample(
        ids, is_output, torch.full((tokens,), math.nan), torch.where(is_output, 0, -1),
        torch.where(is_output, 1.0, 0.0),
    )  # fmt: skip


def one_rollout_steps() -> Any:
    """The learner's settings of these sections: one rollout a step, log-prob chunks of 1,024
    (the 32B config's), the gradient clipped at 1."""
    from loop.learner.settings import LearnerSettings

    return LearnerSettings(
        lr=1e-6, weight_decay=0.0, epochs=1, minibatch_size=1, micro_batch_size=1,
        logprob_chunk_size=1024, max_grad_norm=1.0,
    )  # fmt: skip


# -- sections -------------------------------------------------------------------------------
def section_env(out: Out) -> None:
    import torch

    row: dict[str, Any] = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if out.tiny:
        out.row(**row, device="cpu")
        return
    import transformers

    props = torch.cuda.get_device_properties(0)
    row.update(
        device=torch.cuda.get_device_name(), memory_gib=round(props.total_memory / 2**30, 1),
        sms=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
        transformers=transformers.__version__, spec_bf16_tflops=(card_peak() or 0) / 1e12,
    )  # fmt: skip
    try:
        import peft

        row["peft"] = peft.__version__
    except ImportError:
        row["peft"] = None
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    row["matmul_bf16_tflops"] = round(10 * 2 * 8192**3 / (time.perf_counter() - start) / 1e12, 1)
    out.row(**row)


def section_sdpa(out: Out) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    heads, kv_heads, dim = (4, 2, 16) if out.tiny else (28, 4, 128)
    length = 256 if out.tiny else 8192
    backends = {"math": SDPBackend.MATH}
    if not out.tiny:
        backends.update(flash=SDPBackend.FLASH_ATTENTION, efficient=SDPBackend.EFFICIENT_ATTENTION,
                        cudnn=SDPBackend.CUDNN_ATTENTION)  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        for name, backend in backends.items():
            for gqa in ("enable_gqa", "repeat_kv"):
                shape = (1, heads, length, dim)
                q = torch.randn(shape, device=device(out.tiny), dtype=dtype, requires_grad=True)
                kv_shape = (1, kv_heads, length, dim)
                k = torch.randn(kv_shape, device=device(out.tiny), dtype=dtype, requires_grad=True)
                v = torch.randn(kv_shape, device=device(out.tiny), dtype=dtype, requires_grad=True)
                row: dict[str, Any] = dict(
                    dtype=str(dtype).removeprefix("torch."), backend=name, gqa=gqa, tokens=length
                )
                try:
                    reset_peak(out.tiny)
                    start = time.perf_counter()
                    with sdpa_kernel(backend):
                        for _ in range(2):
                            if gqa == "enable_gqa":
                                o = scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                 enable_gqa=True)  # fmt: skip
                            else:
                                groups = heads // kv_heads
                                o = scaled_dot_product_attention(
                                    q, k.repeat_interleave(groups, 1),
                                    v.repeat_interleave(groups, 1), is_causal=True,
                                )  # fmt: skip
                            o.sum().backward()
                    sync(out.tiny)
                    row.update(ok=True, ms=round((time.perf_counter() - start) / 2 * 1e3, 2),
                               peak_gib=peak_gib(out.tiny))  # fmt: skip
                except Exception as exc:  # a backend that refuses the shape: recorded, not fatal
                    row.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:160]}")
                out.row(**row)


def run_learner(out: Out, shape: str, mode: str, lengths: list[int], layers: int | None) -> None:
    """The project's Learner on one synthetic rollout per length (see the module docstring)."""
    import torch

    from loop.learner.learner import Learner
    from loop.model.policy import LoraSettings, policy_from_model

    model = build_model(shape, out.tiny, layers=layers)
    vocab = model.config.vocab_size
    lora = LoraSettings(rank=16, alpha=32) if mode == "lora" else None
    policy = policy_from_model(
        model, tokenizer(64), device(out.tiny), lora=lora, gradient_checkpointing=True
    )
    settings = one_rollout_steps()
    learner = Learner(policy, settings)
    weights = allocated_gib(out.tiny)
    peak = card_peak()
    learner.recompute_old_logprobs([synthetic_sample(512, vocab, 0)])  # warm-up: kernels chosen
    learner.learn([learner_sample(512, vocab)], seed=0)
    for tokens in lengths:
        row: dict[str, Any] = dict(model=shape, mode=mode, tokens=tokens, layers=layers or
                                   model.config.num_hidden_layers, weights_gib=weights)  # fmt: skip
        try:
            sample = synthetic_sample(tokens, vocab, tokens)
            reset_peak(out.tiny)
            start = time.perf_counter()
            learner.recompute_old_logprobs([sample])
            sync(out.tiny)
            forward_s = time.perf_counter() - start
            forward_peak = peak_gib(out.tiny)
            step_times = []
            reset_peak(out.tiny)
            for _ in range(1 if out.tiny else 2):
                start = time.perf_counter()
                learner.learn([sample], seed=0)
                sync(out.tiny)
                step_times.append(time.perf_counter() - start)
            step_s = min(step_times)
            flops = forward_flops(policy.model, tokens, int(sample.is_output.sum()))
            factor = 2 if mode == "lora" else 3
            row.update(
                forward_s=round(forward_s, 3), forward_tok_s=round(tokens / forward_s),
                forward_peak_gib=forward_peak, step_s=round(step_s, 3),
                step_tok_s=round(tokens / step_s), step_peak_gib=peak_gib(out.tiny),
                forward_mfu=round(flops / forward_s / peak, 3) if peak else None,
                step_mfu=round(factor * flops / step_s / peak, 3) if peak else None,
            )  # fmt: skip
        except torch.OutOfMemoryError as exc:
            row.update(error=f"OutOfMemoryError: {str(exc)[:120]}")
            learner.optimizer.zero_grad(set_to_none=True)
        out.row(**row)
        if "error" in row:
            break  # a longer sequence will not fit either
    del learner, policy, model
    torch.cuda.empty_cache() if torch.cuda.is_available() else None


def learner_sample(tokens: int, vocab: int) -> Any:
    """A synthetic sample with old log-probs set (ready for `learn`)."""
    import torch

    sample = synthetic_sample(tokens, vocab, 1)
    sample.old_logprobs = torch.zeros(tokens)
    return sample


def section_learner(out: Out) -> None:
    lengths = [256, 512] if out.tiny else [8192, 16384, 32768]
    for shape in ("qwen2.5-0.5b", "qwen2.5-7b"):
        for mode in ("lora", "full"):
            run_learner(out, shape, mode, lengths, None)


PREFIX_TOKENS, SUFFIX_TOKENS = 2048, 1024  # a long agent prompt shared, then a rollout's own


def section_prefix(out: Out) -> None:
    import copy

    import torch

    from loop.learner.batch import Sample
    from loop.learner.learner import Learner
    from loop.learner.settings import LearnerSettings
    from loop.model.policy import LoraSettings, policy_from_model

    shape, rows = ("tiny", 3) if out.tiny else ("qwen2.5-7b", 6)
    prefix_tokens, suffix_tokens = (64, 32) if out.tiny else (PREFIX_TOKENS, SUFFIX_TOKENS)
    model = build_model(shape, out.tiny)
    vocab = model.config.vocab_size
    policy = policy_from_model(model, tokenizer(64), device(out.tiny), lora=LoraSettings(16, 32))
    rng = torch.Generator().manual_seed(0)
    start_ids = torch.randint(4, vocab, (prefix_tokens,), generator=rng)
    samples = []
    for i in range(rows):
        own = synthetic_sample(suffix_tokens, vocab, 10 + i)
        no = torch.zeros(prefix_tokens, dtype=torch.bool)
        samples.append(Sample(
            torch.cat([start_ids, own.tokens]), torch.cat([no, own.is_output]),
            torch.cat([torch.full((prefix_tokens,), math.nan), own.sampler_logprobs]),
            torch.cat([torch.full((prefix_tokens,), -1), own.turn_ids]),
            torch.cat([torch.zeros(prefix_tokens), own.advantages]),
        ))  # fmt: skip
    start = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    olds = {}
    for way in ("whole", "shared", "whole", "shared"):  # the first pair warms the kernels up
        with torch.no_grad():  # every way starts from the same weights
            for name, parameter in policy.model.named_parameters():
                if name in start:
                    parameter.copy_(start[name])
        settings = LearnerSettings(
            lr=1e-6, weight_decay=0.0, epochs=1, minibatch_size=rows, micro_batch_size=1,
            logprob_chunk_size=1024, max_grad_norm=1.0,
            shared_prefix_min=0 if way == "whole" else prefix_tokens // 2,
        )  # fmt: skip
        learner = Learner(policy, settings)
        batch = copy.deepcopy(samples)
        row: dict[str, Any] = dict(model=shape, way=way, rollouts=rows, shared=prefix_tokens,
                                   own=suffix_tokens)  # fmt: skip
        try:
            reset_peak(out.tiny)
            begin = time.perf_counter()
            learner.recompute_old_logprobs(batch)
            sync(out.tiny)
            row.update(recompute_s=round(time.perf_counter() - begin, 3),
                       recompute_peak_gib=peak_gib(out.tiny))  # fmt: skip
            olds[way] = torch.cat([s.old_logprobs[s.is_output] for s in batch])
            reset_peak(out.tiny)
            begin = time.perf_counter()
            learner.learn(batch, seed=0)
            sync(out.tiny)
            row.update(step_s=round(time.perf_counter() - begin, 3),
                       step_peak_gib=peak_gib(out.tiny))  # fmt: skip
        except torch.OutOfMemoryError as exc:
            row.update(error=f"OutOfMemoryError: {str(exc)[:120]}")
        if way == "shared" and {"whole", "shared"} <= set(olds):
            row["logprob_gap_max"] = round((olds["whole"] - olds["shared"]).abs().max().item(), 4)
        out.row(**row)
        del learner


LEARNER32B_TOKENS = [32768]  # 8K and 16K: 2026-11-26 (benchmarks/README.md)


def section_learner32b(out: Out) -> None:
    import torch

    layers = None
    if not out.tiny:
        dims = SHAPES["qwen2.5-32b"]
        h, i, kvh = dims["hidden_size"], dims["intermediate_size"], dims["num_key_value_heads"]
        per_layer = 2 * (2 * h * h + 2 * h * kvh * 128 + 3 * h * i)  # bf16 q, o, k, v, MLP
        fixed = 2 * 2 * dims["vocab_size"] * h
        free = torch.cuda.mem_get_info()[0]
        room = free - fixed - 45e9  # activations and the LoRA optimizer at 32K tokens
        fit = int(room // per_layer)
        layers = None if fit >= dims["num_hidden_layers"] else max(fit, 1)
    run_learner(out, "qwen2.5-32b", "lora", [256] if out.tiny else LEARNER32B_TOKENS, layers)


LORA_WAYS = ("peft", "one product")  # peft's own forward; loop/model/lora.py's


def section_lora(out: Out) -> None:
    """LoRA's step on Qwen2.5-7B, peft's forward against one product per layer: the step time
    (the better of two, the ways alternating), MFU and peak at 8K and 16K tokens; from the
    same weights, each way's old log-probs, loss and gradient norm (learning unchanged: bf16
    noise apart); and where one step's GPU time goes each way (torch.profiler, by kernel)."""
    import torch

    from loop.learner.learner import Learner
    from loop.model.lora import fuse_lora_products, unfuse_lora_products
    from loop.model.policy import LoraSettings, policy_from_model

    model = build_model("qwen2.5-7b", out.tiny)
    vocab = model.config.vocab_size
    policy = policy_from_model(
        model, tokenizer(64), device(out.tiny), lora=LoraSettings(rank=16, alpha=32),
        gradient_checkpointing=True,
    )  # fmt: skip
    settings = one_rollout_steps()
    start = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    with torch.no_grad():  # B non-zero (peft starts it at 0), as after some training
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 1e-3)
                start[name] = parameter.detach().clone()

    def way(name: str) -> None:
        (unfuse_lora_products if name == "peft" else fuse_lora_products)(policy.model)

    def restart() -> Learner:
        with torch.no_grad():
            for name, parameter in policy.model.named_parameters():
                if name in start:
                    parameter.copy_(start[name])
        return Learner(policy, settings)

    lengths = [256, 512] if out.tiny else [8192, 16384]
    flops_of = {t: forward_flops(policy.model, t, t - t // 10) for t in lengths}
    peak = card_peak()
    # 1. learning unchanged: from the same weights, the same sample, each way
    sample = synthetic_sample(lengths[0], vocab, 7)
    olds = {}
    for name in LORA_WAYS:
        way(name)
        learner = restart()
        learner.recompute_old_logprobs([sample])
        olds[name] = sample.old_logprobs.clone()
        stats = learner.learn([sample], seed=0)
        out.row(kind="learning", way=name, tokens=lengths[0], loss=stats.losses[0],
                grad_norm=stats.grad_norms[0])  # fmt: skip
    gap = (olds["peft"] - olds["one product"])[sample.is_output].abs()
    out.row(kind="learning", old_logprob_gap_max=round(gap.max().item(), 4),
            old_logprob_gap_mean=round(gap.mean().item(), 5))  # fmt: skip
    # 2. speed and memory, the ways alternating
    learner = restart()
    for name in LORA_WAYS:  # warm-up: kernels chosen for both
        way(name)
        learner.learn([learner_sample(512, vocab)], seed=0)
    for tokens in lengths:
        sample = learner_sample(tokens, vocab)
        times: dict[str, list[float]] = {name: [] for name in LORA_WAYS}
        peaks: dict[str, float | None] = {}
        for name in LORA_WAYS * 2:
            way(name)
            reset_peak(out.tiny)
            begin = time.perf_counter()
            learner.learn([sample], seed=0)
            sync(out.tiny)
            times[name].append(time.perf_counter() - begin)
            peaks[name] = peak_gib(out.tiny)
        for name in LORA_WAYS:
            step = min(times[name])
            mfu = round(2 * flops_of[tokens] / step / peak, 3) if peak else None
            out.row(
                kind="step", way=name, tokens=tokens, step_s=round(step, 3),
                step_tok_s=round(tokens / step), step_peak_gib=peaks[name], step_mfu=mfu,
            )  # fmt: skip
    # 3. one step's GPU time by kernel, each way
    if out.tiny:
        return
    sample = learner_sample(lengths[0], vocab)
    for name in LORA_WAYS:
        way(name)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            learner.learn([sample], seed=0)
            sync(out.tiny)
        events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
        total = sum(e.self_device_time_total for e in events)
        groups: dict[str, float] = {}
        for event in events:
            groups[kernel_kind(event.key)] = (
                groups.get(kernel_kind(event.key), 0.0) + event.self_device_time_total
            )
        out.row(kind="profile", way=name, tokens=lengths[0], gpu_ms=round(total / 1e3, 1),
                **{f"{k}_ms": round(v / 1e3, 1) for k, v in sorted(groups.items())})  # fmt: skip
        for event in sorted(events, key=lambda e: -e.self_device_time_total)[:12]:
            out.row(kind="kernel", way=name, kernel=event.key[:90], calls=event.count,
                    ms=round(event.self_device_time_total / 1e3, 1))  # fmt: skip


def section_checkpointing(out: Out) -> None:
    """LoRA's step on Qwen2.5-7B at 8K tokens (one product per layer) with and without
    gradient checkpointing (`model.gradient_checkpointing`): step time, MFU and the peak each
    way (the preflight's traces of both run on a CPU: benchmarks/bench_preflight.py), and what
    the way before left allocated (its peak counts it; the `peak` section measures the way
    without checkpointing in a fresh process); then where the checkpointed step's GPU time
    goes, kernel by kernel."""
    import torch

    from loop.learner.learner import Learner
    from loop.model.policy import LoraSettings, policy_from_model

    tokens = 256 if out.tiny else 8192
    peak = card_peak()
    settings = one_rollout_steps()
    for checkpointing in (True, False):
        held = allocated_gib(out.tiny)  # what the way before left: its peak would count it
        model = build_model("qwen2.5-7b", out.tiny)
        policy = policy_from_model(
            model, tokenizer(64), device(out.tiny), lora=LoraSettings(rank=16, alpha=32),
            gradient_checkpointing=checkpointing,
        )  # fmt: skip
        learner = Learner(policy, settings)
        vocab = model.config.vocab_size
        learner.learn([learner_sample(512, vocab)], seed=0)  # warm-up: kernels, AdamW's states
        sample = learner_sample(tokens, vocab)
        times = []
        reset_peak(out.tiny)
        for _ in range(2):
            begin = time.perf_counter()
            learner.learn([sample], seed=0)
            sync(out.tiny)
            times.append(time.perf_counter() - begin)
        step = min(times)
        flops = forward_flops(policy.model, tokens, tokens - tokens // 10)
        out.row(
            kind="step", gradient_checkpointing=checkpointing, tokens=tokens,
            step_s=round(step, 3), step_tok_s=round(tokens / step),
            step_mfu=round(2 * flops / step / peak, 3) if peak else None,
            step_peak_gib=peak_gib(out.tiny), held_before_gib=held,
        )  # fmt: skip
        if checkpointing:
            norm_ways(out, learner, tokens, flops, peak)
        if checkpointing and not out.tiny:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                learner.learn([sample], seed=0)
                sync(out.tiny)
            events = [e for e in prof.key_averages() if e.self_device_time_total > 0]
            total = sum(e.self_device_time_total for e in events)
            out.row(kind="profile", tokens=tokens, gpu_ms=round(total / 1e3, 1))
            for event in sorted(events, key=lambda e: -e.self_device_time_total)[:25]:
                ms = round(event.self_device_time_total / 1e3, 1)
                out.row(kind="kernel", group=kernel_kind(event.key), kernel=event.key[:110],
                        calls=event.count, ms=ms)  # fmt: skip
        del learner, policy, model
        gc.collect()  # the peft model and the learner hold each other: `del` alone frees neither
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def norm_ways(out: Out, learner: Any, tokens: int, flops: float, peak: float | None) -> None:
    """The checkpointed step with transformers' RMSNorm and with the one-kernel norm the GPU
    policy takes (loop/model/norms.py): from the same weights and sample each way's old
    log-probs, loss and gradient norm (learning unchanged), then the step time, the ways
    alternating, the better of two each."""
    import torch

    from loop.learner.learner import Learner
    from loop.model.norms import fuse_rms_norms, unfuse_rms_norms

    model, vocab = learner.model, learner.model.config.vocab_size
    ways = {"transformers": unfuse_rms_norms, "one kernel": fuse_rms_norms}
    start = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    sample, olds = synthetic_sample(tokens, vocab, 7), {}
    for name, way in ways.items():
        way(model)
        with torch.no_grad():
            for key, parameter in model.named_parameters():
                if key in start:
                    parameter.copy_(start[key])
        fresh = Learner(learner.policy, learner.settings)
        fresh.recompute_old_logprobs([sample])
        olds[name] = sample.old_logprobs.clone()
        stats = fresh.learn([sample], seed=0)
        out.row(kind="learning", norms=name, tokens=tokens, loss=stats.losses[0],
                grad_norm=stats.grad_norms[0])  # fmt: skip
        del fresh
    gap = (olds["transformers"] - olds["one kernel"])[sample.is_output].abs()
    out.row(kind="learning", old_logprob_gap_max=round(gap.max().item(), 4),
            old_logprob_gap_mean=round(gap.mean().item(), 5))  # fmt: skip
    timed = learner_sample(tokens, vocab)
    times: dict[str, list[float]] = {name: [] for name in ways}
    for name in list(ways) * 2:
        ways[name](model)
        begin = time.perf_counter()
        learner.learn([timed], seed=0)
        sync(out.tiny)
        times[name].append(time.perf_counter() - begin)
    for name, spent in times.items():
        step = min(spent)
        mfu = round(2 * flops / step / peak, 3) if peak else None
        out.row(kind="step", gradient_checkpointing=True, norms=name, tokens=tokens,
                step_s=round(step, 3), step_mfu=mfu)  # fmt: skip
    fuse_rms_norms(model)


def section_peak(out: Out) -> None:
    """What is live at the peak of LoRA's step on Qwen2.5-7B at 8K without gradient
    checkpointing, in a fresh process: torch profiler's memory timeline of one step, its bytes
    by kind (weights, activations, temporaries, autograd's own) at the peak, beside
    `max_memory_allocated` (the preflight's trace: 62.2 GiB with transformers' RMSNorm)."""
    import torch
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline

    from loop.learner.learner import Learner
    from loop.model.policy import LoraSettings, policy_from_model

    if out.tiny:
        out.row(skipped="the profiler's CUDA memory timeline needs a GPU")
        return
    model = build_model("qwen2.5-7b", out.tiny)
    policy = policy_from_model(
        model, tokenizer(64), device(out.tiny), lora=LoraSettings(rank=16, alpha=32),
        gradient_checkpointing=False,
    )  # fmt: skip
    settings = one_rollout_steps()
    learner = Learner(policy, settings)
    vocab = model.config.vocab_size
    learner.learn([learner_sample(512, vocab)], seed=0)
    sample = learner_sample(8192, vocab)
    torch.cuda.synchronize()
    resident = torch.cuda.memory_allocated()
    reset_peak(out.tiny)
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA],
        profile_memory=True, record_shapes=True, with_stack=True,
    ) as prof:  # fmt: skip
        learner.learn([sample], seed=0)
        torch.cuda.synchronize()
    timeline = MemoryProfileTimeline(prof._memory_profile())
    _, sizes = timeline._coalesce_timeline(torch.device("cuda", 0))
    names = ["none"] + [c.name if c else "unknown" for c in _CATEGORY_TO_INDEX]  # its order
    totals = [sum(row) for row in sizes]
    top = max(range(len(totals)), key=totals.__getitem__)
    out.row(kind="peak", resident_gib=round(resident / 2**30, 2), measured_peak_gib=peak_gib(False),
            profiled_peak_gib=round(totals[top] / 2**30, 2),
            **{f"{name.lower()}_gib": round(size / 2**30, 2)
               for name, size in zip(names, sizes[top], strict=False) if size})  # fmt: skip


def kernel_kind(name: str) -> str:
    """A CUDA kernel's kind, from its name: matrix products, attention, the rest."""
    low = name.lower()
    if any(k in low for k in ("gemm", "nvjet", "cutlass", "sm90_xmma", "matmul", "cublas")):
        return "gemm"
    if any(k in low for k in ("flash", "fmha", "attention", "sdpa")):
        return "attention"
    if any(k in low for k in ("copy", "cast", "convert")):
        return "copy"
    return "other"


def section_logprobs(out: Out) -> None:
    import torch

    from loop.learner.logprobs import token_logprobs, token_logprobs_naive

    model = build_model("qwen2.5-0.5b", out.tiny)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    vocab = model.config.vocab_size
    for tokens in [256, 512] if out.tiny else [8192, 16384, 32768]:
        ids = torch.randint(4, vocab, (1, tokens), device=device(out.tiny))
        for method in ("chunked", "naive"):
            row: dict[str, Any] = dict(method=method, tokens=tokens, vocab=vocab)
            try:
                model.zero_grad(set_to_none=True)
                reset_peak(out.tiny)
                before = allocated_gib(out.tiny)
                start = time.perf_counter()
                if method == "chunked":
                    logprobs = token_logprobs(model, ids, chunk_size=1024)
                else:
                    logprobs = token_logprobs_naive(model, ids)
                logprobs.sum().backward()
                sync(out.tiny)
                peak = peak_gib(out.tiny)
                extra = None if peak is None or before is None else round(peak - before, 2)
                row.update(seconds=round(time.perf_counter() - start, 3), extra_peak_gib=extra)
                del logprobs
            except torch.OutOfMemoryError as exc:
                row.update(error=f"OutOfMemoryError: {str(exc)[:120]}")
            out.row(**row)


def serve_all(generator: Any, prompts: list[list[int]], params: Any) -> list[Any]:
    """Every prompt through `generator` at once, then closed: a Generation or the exception
    of each, in order."""
    import asyncio

    async def run() -> list[Any]:
        calls = [generator.generate(prompt, params) for prompt in prompts]
        results = await asyncio.gather(*calls, return_exceptions=True)
        await generator.close()
        return results

    return asyncio.run(run())


def section_engine(out: Out) -> None:

    import torch

    from loop.generators.base import Generation, SamplingParams
    from loop.generators.hf.generator import HFGenerator
    from loop.generators.hf.memory import kv_cache_budget_mb
    from loop.model.policy import LoraSettings, policy_from_model

    rows, prompt_len, new = (4, 300, 16) if out.tiny else (32, 8100, 32)
    model = build_model("qwen2.5-7b", out.tiny)
    model.eval()
    # LoRA on a frozen base, as in training: the engine's fused projections run
    lora = LoraSettings(rank=16, alpha=32)
    policy = policy_from_model(model, tokenizer(64), device(out.tiny), lora=lora)
    vocab = model.config.vocab_size
    weights = allocated_gib(out.tiny)
    for store_mb, cap in (ENGINE_RUNS[name] for name in out.engine_runs):
        if cap is not None:
            if out.tiny:
                continue
            total = torch.cuda.get_device_properties(0).total_memory
            torch.cuda.set_per_process_memory_fraction(min(cap / total, 1.0))
        if store_mb is None:  # what an unset kv_cache_mb comes to here
            store_mb = round(kv_cache_budget_mb(policy.device))
        generator = HFGenerator(policy, max_batch_size=rows, kv_cache_mb=store_mb)
        prompts = [
            torch.randint(4, vocab, (prompt_len,), generator=torch.Generator().manual_seed(i))
            for i in range(rows)
        ]
        params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
        reset_peak(out.tiny)
        start = time.perf_counter()
        results = serve_all(generator, [p.tolist() for p in prompts], params)
        sync(out.tiny)
        seconds = time.perf_counter() - start
        done = [r for r in results if isinstance(r, Generation)]
        errors = sorted({f"{type(r).__name__}: {str(r)[:160]}" for r in results if r not in done})
        engine = generator.engine
        out.row(
            rows=rows, prompt_tokens=prompt_len, max_new_tokens=new, kv_cache_mb=store_mb,
            memory_cap_gb=None if cap is None else cap / 1e9, weights_gib=weights,
            seconds=round(seconds, 1), rows_ok=len(done), rows_failed=len(results) - len(done),
            errors=errors, tokens_generated=sum(len(r.token_ids) for r in done),
            peak_gib=peak_gib(out.tiny),
            slots_gib=None if engine is None else round(engine.nbytes / 2**30, 2),
            kv_store_gib=round(generator.cache.nbytes / 2**30, 2),
            held_after_gib=None if weights is None else round(allocated_gib(out.tiny) - weights, 2),
        )  # fmt: skip
        del generator, engine, results, done
        if cap is not None:
            torch.cuda.set_per_process_memory_fraction(1.0)
    decode_syncs(Out(out.path.parent, "engine_syncs", out.tiny), policy, vocab, rows)


ENGINE_LONG = (8192, 12288, 24576)  # prompt tokens per row, 32 rows (the paper's context is 32K)


def section_engine_long(out: Out) -> None:
    """The hf engine on Qwen2.5-7B with LoRA: 32 rows, each its own prompt of 8K, 12K or 24K
    tokens, every key in its row slot (`kv_cache_mb=0`), 16 new tokens: the peak against the
    preflight's rule for the engine (loop/preflight/plan.py `hf_engine_memory`: the slots at
    the capacity the rows reach, the KV store, the largest transient; beside the weights, no
    margin), and the prefill's tokens per second."""

    import torch

    from loop.generators.base import Generation, SamplingParams
    from loop.generators.hf.generator import HFGenerator
    from loop.model.policy import LoraSettings, policy_from_model
    from loop.preflight.plan import hf_engine_memory

    rows, lengths, new = (4, (200, 400), 8) if out.tiny else (32, out.engine_long, 16)
    shape = "tiny" if out.tiny else "qwen2.5-7b"
    model = build_model("qwen2.5-7b", out.tiny)
    model.eval()
    policy = policy_from_model(model, tokenizer(64), device(out.tiny), lora=LoraSettings(16, 32))
    vocab = model.config.vocab_size
    weights = allocated_gib(out.tiny)
    for length in lengths:
        generator = HFGenerator(policy, max_batch_size=rows, kv_cache_mb=0)
        prompts = [
            torch.randint(4, vocab, (length,), generator=torch.Generator().manual_seed(i)).tolist()
            for i in range(rows)
        ]
        params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=0)
        reset_peak(out.tiny)
        start = time.perf_counter()
        results = serve_all(generator, prompts, params)
        sync(out.tiny)
        seconds = time.perf_counter() - start
        done = [r for r in results if isinstance(r, Generation)]
        rule = hf_engine_memory(
            SHAPES[shape], 2, rows=rows, max_context_tokens=length + new, kv_cache_bytes=0
        )
        peak = peak_gib(out.tiny)
        plan = None if weights is None else round(weights + rule.peak / 2**30, 2)
        out.row(
            rows=rows, prompt_tokens=length, seconds=round(seconds, 1),
            prefill_tok_s=round(rows * length / seconds), rows_ok=len(done),
            errors=sorted({f"{type(r).__name__}: {str(r)[:160]}" for r in results
                           if r not in done}),
            weights_gib=weights, rule_slots_gib=round(rule.slots / 2**30, 2),
            rule_transient_gib=round(rule.transient / 2**30, 2), preflight_gib=plan,
            peak_gib=peak, ratio=None if plan is None or peak is None else round(plan / peak, 2),
        )  # fmt: skip
        del generator, results, done


def decode_syncs(out: Out, policy: Any, vocab: int, rows: int) -> None:
    """Host-device synchronisations and time (median of REPEATS) of one decode step at 32
    short rows, and of its sampling at temperature 1: `pick_tokens` (one inverse-transform
    draw for all rows) against the per-row `torch.multinomial` it replaced, and whether its
    tokens equal those drawn from the same logits on the CPU (the rows' generators are CPU
    ones)."""
    import warnings

    import torch

    from loop.generators.base import SamplingParams
    from loop.generators.hf.engine import DecoderEngine, Row
    from loop.generators.hf.sampling import pick_tokens, seeded_rng

    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    engine = DecoderEngine(policy.model, max_rows=rows)
    params = [SamplingParams(max_new_tokens=8, temperature=1.0, seed=i) for i in range(rows)]

    def sample(logits: Any) -> list[list[int]]:
        sampled: list[list[int]] = [[] for _ in range(rows)]
        rngs = [seeded_rng(p.seed) for p in params]
        pick_tokens(logits, params, rngs, sampled, [[] for _ in range(rows)], [None] * rows)
        return sampled

    def multinomial(logits: Any) -> None:  # the draw before: per row, on the device
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        draws = [torch.multinomial(row.exp(), 1) for row in logprobs]
        chosen = [row.gather(0, draw) for row, draw in zip(logprobs, draws, strict=True)]
        torch.cat([torch.cat(draws).double(), torch.cat(chosen).double()]).tolist()

    with torch.no_grad():
        active = []
        for _ in range(rows):
            row = Row(ids=[])
            engine.add(row, None)
            engine.prefill(row, torch.randint(4, vocab, (256,)).tolist())
            active.append(row)
        tokens = [5] * rows
        logits = engine.decode(active, tokens)  # warm-up
        sample(logits)
        multinomial(logits)
        sync(out.tiny)
        counts = {}
        for part in ("decode", "sample", "multinomial"):
            if not out.tiny:
                torch.cuda.set_sync_debug_mode("warn")
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                times = []
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    if part == "decode":
                        logits = engine.decode(active, tokens)
                    elif part == "sample":
                        sample(logits)
                    else:
                        multinomial(logits)
                    sync(out.tiny)
                    times.append((time.perf_counter() - start) * 1e3)
            if not out.tiny:
                torch.cuda.set_sync_debug_mode("default")
            waits = sum("synchroniz" in str(w.message) for w in caught) // REPEATS
            counts[part] = (waits, round(statistics.median(times), 1))
        same_as_cpu = sample(logits) == sample(logits.cpu())
        join = joining(engine, active, vocab, out.tiny)
    out.row(rows=rows, context=256, decode_syncs=counts["decode"][0],
            decode_ms=counts["decode"][1], sample_syncs=counts["sample"][0],
            sample_ms=counts["sample"][1], multinomial_syncs=counts["multinomial"][0],
            multinomial_ms=counts["multinomial"][1], tokens_same_as_cpu=same_as_cpu,
            **join)  # fmt: skip


def joining(engine: Any, rows: list[Any], vocab: int, tiny: bool) -> dict[str, float]:
    """The rows coming back for a next turn with JOIN_TOKENS new ids each: prefilled one row at
    a time and in one packed forward (medians of REPEATS), and the largest logit gap between
    the two (the rows are cut back to their ids after each)."""
    import torch

    lengths = [len(row.ids) for row in rows]
    engine.reserve(max(row.own_length for row in rows) + JOIN_TOKENS)
    new = [torch.randint(4, vocab, (JOIN_TOKENS,)).tolist() for _ in rows]
    times: dict[str, list[float]] = {"alone": [], "packed": []}
    logits = {}
    for repeat in range(REPEATS + 1):  # the first of each is a warm-up
        for how in ("alone", "packed"):
            for row, length in zip(rows, lengths, strict=True):
                del row.ids[length:]
            sync(tiny)
            start = time.perf_counter()
            if how == "alone":
                found = torch.stack([engine.prefill(r, i) for r, i in zip(rows, new, strict=True)])
            else:
                found = engine.prefill_rows(rows, new)
            sync(tiny)
            logits[how] = found
            if repeat:
                times[how].append((time.perf_counter() - start) * 1e3)
    for row, length in zip(rows, lengths, strict=True):
        del row.ids[length:]
    gap = float((logits["alone"] - logits["packed"]).abs().max())
    alone, packed = (round(statistics.median(times[how]), 1) for how in ("alone", "packed"))
    return {"join_tokens": JOIN_TOKENS, "join_alone_ms": alone, "join_packed_ms": packed,
            "join_logit_gap": gap}  # fmt: skip


def section_parity(out: Out) -> None:
    import asyncio

    import torch

    from loop.generators.base import SamplingParams
    from loop.generators.hf.generator import HFGenerator
    from loop.learner.logprobs import token_logprobs
    from loop.model.policy import LoraSettings, policy_from_model

    model = build_model("qwen2.5-0.5b", out.tiny)
    model.eval()
    lora = LoraSettings(rank=16, alpha=32)  # the frozen base + LoRA of training (fused sampling)
    policy = policy_from_model(model, tokenizer(64), device(out.tiny), lora=lora)
    vocab, rows, new = model.config.vocab_size, 8, 128
    prompts = [torch.randint(4, vocab, (512,)).tolist() for _ in range(rows)]
    head = model.get_output_embeddings().weight
    original = head.detach().clone()
    for scale in PARITY_SCALES:
        with torch.no_grad():  # a peaked next-token distribution, as a trained model's
            head.copy_(original * scale)
        generator = HFGenerator(policy, max_batch_size=rows)

        async def run(gen: HFGenerator = generator) -> list[Any]:
            params = SamplingParams(max_new_tokens=new, temperature=1.0, seed=1)
            results = await asyncio.gather(*(gen.generate(p, params) for p in prompts))
            await gen.close()
            return list(results)

        generations = asyncio.run(run())
        diffs, entropies = [], []
        with torch.no_grad():
            for prompt, gen in zip(prompts, generations, strict=True):
                ids = torch.tensor([prompt + gen.token_ids], device=device(out.tiny))
                learner = token_logprobs(model, ids)[0, len(prompt) :].float().cpu()
                diffs.append((learner - torch.tensor(gen.logprobs)).abs())
                logits = model(ids).logits[0, len(prompt) - 1 : -1].float().log_softmax(-1)
                entropies.append(-(logits.exp() * logits).sum(-1).cpu())
        diff = torch.cat(diffs)
        sampled = torch.cat([torch.tensor(g.logprobs) for g in generations])
        out.row(dtype="bfloat16", head_scale=scale, rows=rows, tokens=int(diff.numel()),
                entropy_nats=round(float(torch.cat(entropies).mean()), 2),
                sampled_logprob_mean=round(float(sampled.mean()), 3),
                abs_logprob_diff_mean=float(diff.mean()), abs_logprob_diff_max=float(diff.max()),
                ratio_minus_1_max=float((diff.exp() - 1).max()))  # fmt: skip


def section_fourbit(out: Out) -> None:
    import tempfile

    import torch

    from loop.learner.learner import Learner
    from loop.learner.settings import LearnerSettings
    from loop.model.policy import LoraSettings, load_policy

    if out.tiny:
        out.row(skipped="4-bit needs a CUDA GPU and bitsandbytes")
        return
    with tempfile.TemporaryDirectory() as folder:
        model = build_model("qwen2.5-7b", out.tiny)
        model.save_pretrained(folder)
        tokenizer(64).save_pretrained(folder)
        vocab = model.config.vocab_size
        del model
        torch.cuda.empty_cache()
        reset_peak(out.tiny)
        policy = load_policy(folder, dtype="bfloat16", device="cuda", attn_implementation="sdpa",
                             lora=LoraSettings(rank=16, alpha=32), load_in_4bit=True,
                             gradient_checkpointing=True)  # fmt: skip
    weights = allocated_gib(out.tiny)
    settings = LearnerSettings(lr=1e-6, weight_decay=0.0, epochs=1, minibatch_size=1)
    learner = Learner(policy, settings)
    for tokens in (8192, 16384):
        reset_peak(out.tiny)
        start = time.perf_counter()
        loss = learner.stress_test(tokens)
        sync(out.tiny)
        stress_s = time.perf_counter() - start
        stress_peak = peak_gib(out.tiny)
        sample = learner_sample(tokens, vocab)
        reset_peak(out.tiny)
        start = time.perf_counter()
        learner.learn([sample], seed=0)
        sync(out.tiny)
        out.row(model="qwen2.5-7b", base="nf4", tokens=tokens, weights_gib=weights,
                stress_loss_finite=math.isfinite(loss), stress_s=round(stress_s, 2),
                stress_peak_gib=stress_peak, step_s=round(time.perf_counter() - start, 2),
                step_peak_gib=peak_gib(out.tiny))  # fmt: skip


SERVER_TINY = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, vocab_size=1000,
                   tie_word_embeddings=False)  # fmt: skip


def section_server(out: Out) -> None:
    import asyncio
    import importlib.util
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from loop.generators.base import SamplingParams
    from loop.generators.sync import publish_weights
    from loop.generators.vllm.process import ServerProcess
    from loop.generators.vllm.server import VLLMServerGenerator
    from loop.learner.logprobs import token_logprobs
    from loop.model.policy import LoraSettings, policy_from_model

    if importlib.util.find_spec("vllm") is None:
        out.row(skipped="vLLM is not installed here")
        return
    dtype = "float32" if out.tiny else "bfloat16"
    dims = SERVER_TINY if out.tiny else SHAPES["qwen2.5-0.5b"]
    config = Qwen2Config(
        **dims, max_position_embeddings=4096, rope_theta=1e6, rms_norm_eps=1e-6,
        use_sliding_window=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    lora = LoraSettings(rank=16, alpha=32)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model.save_pretrained(root / "model")
        tokenizer(config.vocab_size).save_pretrained(root / "model")
        policy = policy_from_model(model.to(device(out.tiny)), tokenizer(config.vocab_size),
                                   device(out.tiny), lora=lora)  # fmt: skip
        args = [
            "--model", str(root / "model"), "--served-model-name", "base", "--dtype", dtype,
            "--max-model-len", "2048", "--seed", "0", "--enable-prefix-caching",
            "--gpu-memory-utilization", "0.1" if out.tiny else "0.3",
            "--logprobs-mode", "processed_logprobs", "--max-logprobs", "1",
            "--generation-config", "vllm", "--enable-lora", "--max-lora-rank", "16",
            "--max-loras", "2", *(["--enforce-eager"] if out.tiny else []),
        ]  # fmt: skip
        process = ServerProcess(args, log_path=root / "server.log", devices=[] if out.tiny
                                else [0], on_gpu=not out.tiny)  # fmt: skip
        started = time.perf_counter()
        generator = VLLMServerGenerator(base_model="base", adapter_prefix="smoke",
                                        processes=[process], start_timeout_s=240)  # fmt: skip
        start_s = time.perf_counter() - started

        async def publish_and_sample() -> None:  # one event loop: the client binds to it
            for version in (1, 2):
                with torch.no_grad():  # non-zero factors, new ones per version
                    for name, param in policy.model.named_parameters():
                        if "lora_" in name:
                            param.copy_(0.05 * torch.randn_like(param))
                started = time.perf_counter()
                publish_weights(policy, generator, root / "adapters" / f"v{version}", keep=2)
                publish_s = time.perf_counter() - started
                prompts = [torch.randint(4, config.vocab_size, (256,)).tolist() for _ in range(4)]
                params = SamplingParams(max_new_tokens=64, temperature=1.0, seed=1)
                generations = await asyncio.gather(*(generator.generate(p, params)
                                                     for p in prompts))  # fmt: skip
                diffs = []
                with torch.no_grad():
                    for prompt, gen in zip(prompts, generations, strict=True):
                        ids = torch.tensor([prompt + gen.token_ids], device=device(out.tiny))
                        mine = token_logprobs(policy.model, ids)[0, len(prompt) :].float().cpu()
                        diffs.append((mine - torch.tensor(gen.logprobs)).abs())
                diff = torch.cat(diffs)
                out.row(dtype=dtype, version=generations[0].adapter_version,
                        start_s=round(start_s, 1), publish_s=round(publish_s, 2),
                        tokens=int(diff.numel()), abs_logprob_diff_mean=float(diff.mean()),
                        abs_logprob_diff_max=float(diff.max()))  # fmt: skip

        async def run() -> None:
            try:
                await publish_and_sample()
            finally:
                await generator.close()

        asyncio.run(run())


def section_skipped(out: Out) -> None:
    """What this script does not cover on this machine, said plainly."""
    import importlib.util

    import torch

    gpus = torch.cuda.device_count()
    step = "the trainer under torchrun over nccl (FSDP2, killed and resumed)"
    if gpus < 2:
        out.row(step=step, why=f"needs 2+ GPUs, this machine has {gpus}")
    else:  # the CPU run of it is tests/test_rehearsal.py (gloo)
        out.row(step=step, why="not part of this script: run `torchrun --nproc-per-node 2 "
                "train.py --config configs/quickstart-servers.yaml model.device=cuda "
                "generator.devices=[2]` by hand (3 GPUs: 2 learners, the server on the "
                "third)")  # fmt: skip
    if importlib.util.find_spec("vllm") is None:
        out.row(step="a vLLM server: adapter publication and learner-vs-server parity",
                why="vLLM is not installed here")  # fmt: skip
        out.row(step="the trainer collecting ahead (train.overlap.max_staleness 1)",
                why="collecting ahead needs a backend that keeps adapter versions "
                "(vllm_server), and vLLM is not installed here; tests/test_rehearsal.py runs "
                "it on CPUs")  # fmt: skip
    if out.tiny:
        out.row(step="everything at real sizes", why="--tiny: a 2-layer model on the CPU")


# -- driver ---------------------------------------------------------------------------------
def run_section(name: str, directory: Path, tiny: bool, engine_runs: list[str], long: Any) -> None:
    out = Out(directory, name, tiny, engine_runs, long)
    start = time.perf_counter()
    try:
        globals()[f"section_{name}"](out)
    except Exception as exc:
        out.row(error=f"{type(exc).__name__}: {str(exc)[:300]}")
        raise
    finally:
        print(f"[{name}] {time.perf_counter() - start:.1f} s", flush=True)


def table(directory: Path) -> str:
    """The results as markdown, one table per section."""
    rows = [json.loads(line) for line in (directory / "results.jsonl").read_text().splitlines()]
    lines = []
    for section in dict.fromkeys(r["section"] for r in rows):
        group = [
            {k: v for k, v in r.items() if k != "section"} for r in rows if r["section"] == section
        ]
        keys = list(dict.fromkeys(k for r in group for k in r))
        lines += [f"### {section}", "", "| " + " | ".join(keys) + " |",
                  "|" + "---|" * len(keys)]  # fmt: skip
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in group]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, required=True, help="folder for results.jsonl, table.md"
    )
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds for all sections (none started "
        "with under 30 s left; each gets at most what is left)",
    )
    parser.add_argument("--engine-runs", nargs="+", choices=ENGINE_RUNS, default=list(ENGINE_RUNS))
    parser.add_argument(
        "--engine-long-tokens", nargs="+", type=int, default=list(ENGINE_LONG),
        help="engine_long's prompt tokens per row",
    )  # fmt: skip
    parser.add_argument("--section", choices=SECTIONS, help=argparse.SUPPRESS)  # a child's
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.section:
        run_section(args.section, args.out, args.tiny, args.engine_runs, args.engine_long_tokens)
        return
    deadline = time.monotonic() + (args.budget or math.inf)
    for name in args.sections:
        command = [sys.executable, __file__, "--out", str(args.out), "--section", name]
        command += ["--engine-runs", *args.engine_runs]
        command += ["--engine-long-tokens", *map(str, args.engine_long_tokens)]
        left = deadline - time.monotonic()
        if left < 30:
            Out(args.out, name, args.tiny).row(error="not run: the budget was spent")
            continue
        limit = int(min(TIME_LIMITS[name] * (3 if args.tiny else 1), left))
        try:
            done = subprocess.run(command + (["--tiny"] if args.tiny else []), timeout=limit)
            if done.returncode:
                print(f"[{name}] exited {done.returncode}", flush=True)
        except subprocess.TimeoutExpired:
            Out(args.out, name, args.tiny).row(error=f"timed out after {limit} s")
    (args.out / "table.md").write_text(table(args.out))
    print(table(args.out))


if __name__ == "__main__":
    main()
