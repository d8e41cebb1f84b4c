"""Published model shapes and GPU memory sizes: what the preflight plans with, no download.

`SHAPES` holds the `config.json` fields of Qwen2.5-0.5B/7B/32B-Instruct that set memory (the
Hugging Face hub's model cards, Qwen/Qwen2.5-*-Instruct/config.json), keyed by the hub ids the
configs use, and SmolLM2-135M-Instruct's under its alias `smollm2-135m` (the embedded default;
a Llama, traced as a Qwen2 of its shape: only the attention's biases differ, 0.01% of its
parameters); `tiny` is a two-layer shape for tests and `--tiny` runs. A local model directory
is read from its own config.json. benchmarks/bench_gpu.py builds its models from the same table.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GIB = 2**30

SHAPES: dict[str, dict[str, Any]] = {
    "Qwen/Qwen2.5-0.5B-Instruct": dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        vocab_size=151936,
        tie_word_embeddings=True,
    ),
    "Qwen/Qwen2.5-7B-Instruct": dict(
        hidden_size=3584,
        intermediate_size=18944,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "Qwen/Qwen2.5-32B-Instruct": dict(
        hidden_size=5120,
        intermediate_size=27648,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        vocab_size=152064,
        tie_word_embeddings=False,
    ),
    "smollm2-135m": dict(
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "tiny": dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=False,
    ),
}

# GPU memory as torch reports it (`torch.cuda.get_device_properties(0).total_memory`):
# H100 80GB HBM3 79.2 GiB and H200 139.8 GiB measured (benchmarks/README.md, "On a GPU");
# the A100s from NVIDIA's data sheets (80 GB and 40 GB of HBM2e, less the same ~1% reserve).
GPU_GIB: dict[str, float] = {"h100": 79.2, "h200": 139.8, "a100-80g": 79.2, "a100-40g": 39.4}


def shape_of(model: str) -> dict[str, Any]:
    """The shape of `model`: a hub id or alias of `SHAPES`, a local copy of one (its last path
    part), or a local model directory (the fields of `SHAPES` read from its config.json)."""
    for name, shape in SHAPES.items():
        if model == name or model.rstrip("/").split("/")[-1] == name.split("/")[-1]:
            return shape
    config = Path(model).expanduser() / "config.json"
    if config.is_file():
        fields = json.loads(config.read_text())
        try:
            return {key: fields[key] for key in SHAPES["tiny"]}
        except KeyError as missing:
            raise ValueError(f"{config}: no {missing} field, which the preflight needs") from None
    known = ", ".join(n for n in SHAPES if n != "tiny")
    raise ValueError(f"model.name {model!r}: no published shape known to the preflight ({known})")


def head_dim(shape: dict[str, Any]) -> int:
    """Per-head width: hidden_size / num_attention_heads (Qwen2.5 sets no head_dim of its own)."""
    return int(shape.get("head_dim") or shape["hidden_size"] // shape["num_attention_heads"])


def kv_bytes_per_token(shape: dict[str, Any], dtype_bytes: int = 2) -> int:
    """KV-cache bytes of one token: 2 (K and V) x layers x kv_heads x head_dim x dtype bytes."""
    layers, kv_heads = shape["num_hidden_layers"], shape["num_key_value_heads"]
    return 2 * layers * kv_heads * head_dim(shape) * dtype_bytes


def parameter_count(shape: dict[str, Any]) -> int:
    """Weights of a Qwen2 decoder (q/k/v biases included), embeddings once when tied."""
    h, i, v = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    kv = shape["num_key_value_heads"] * head_dim(shape)
    attention = h * h + h + 2 * (h * kv + kv) + h * h
    layer = attention + 3 * h * i + 2 * h  # MLP and the two RMSNorms
    embeddings = v * h * (1 if shape["tie_word_embeddings"] else 2)
    return shape["num_hidden_layers"] * layer + embeddings + h


def lora_parameter_count(shape: dict[str, Any], rank: int) -> int:
    """LoRA's A and B on every linear layer of the decoder (peft's all-linear: not lm_head)."""
    h, i = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * head_dim(shape)
    pairs = [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)]  # q k v o gate up down
    return shape["num_hidden_layers"] * rank * sum(a + b for a, b in pairs)
