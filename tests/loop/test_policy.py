"""`loop.model.policy.load_policy`: local paths and aliases, dtype/device, pad token, LoRA, gradient
checkpointing, and one-line errors for bad inputs.

Run: python -m pytest tests/loop/test_policy.py -q        (the SmolLM2 test is `slow`)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from loop.learner.logprobs import token_logprobs
from loop.model.policy import LoraSettings, Policy, freeze_base, load_policy, policy_from_model


def test_loads_local_model_and_gives_tokenizer_a_pad_token(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir))
    assert isinstance(policy, Policy) and not policy.is_lora
    assert policy.device == torch.device("cpu")
    assert next(policy.model.parameters()).dtype == torch.float32
    assert policy.tokenizer.pad_token == policy.tokenizer.eos_token == "</s>"
    batch = policy.tokenizer(["w3 w4 w5", "w6"], padding=True, return_tensors="pt")
    assert batch["input_ids"].shape == (2, 3)


def test_dtype_auto_device_and_attention_implementation(tiny_model_dir: Path) -> None:
    policy = load_policy(
        str(tiny_model_dir), dtype="bfloat16", device="auto", attn_implementation="eager"
    )
    assert next(policy.model.parameters()).dtype == torch.bfloat16
    assert policy.model.config._attn_implementation == "eager"
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert policy.device.type == expected == next(policy.model.parameters()).device.type


def test_lora_trains_only_the_adapter(tiny_model_dir: Path) -> None:
    policy = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8))
    assert policy.is_lora
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    targeted = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable}
    assert targeted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_lora_target_modules_are_configurable(tiny_model_dir: Path) -> None:
    lora = LoraSettings(rank=2, alpha=4, target_modules=("q_proj", "v_proj"))
    policy = load_policy(str(tiny_model_dir), lora=lora)
    trainable = {n for n, p in policy.model.named_parameters() if p.requires_grad}
    assert {name.split(".lora_")[0].rsplit(".", 1)[-1] for name in trainable} == {
        "q_proj",
        "v_proj",
    }


def test_gradient_checkpointing_with_lora_backpropagates(tiny_model_dir: Path) -> None:
    policy = load_policy(
        str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), gradient_checkpointing=True
    )
    model = policy.model
    assert model.get_base_model().is_gradient_checkpointing
    model.train()
    input_ids = torch.randint(3, 300, (2, 16))
    token_logprobs(model, input_ids, chunk_size=5).sum().backward()
    # B starts at zero, so the gradient reaches B first (A's gradient is B^T ... = 0).
    lora_b_grads = [p.grad for n, p in model.named_parameters() if "lora_B" in n]
    assert lora_b_grads and all(g is not None for g in lora_b_grads)
    assert any(g.abs().sum() > 0 for g in lora_b_grads)


def test_a_frozen_base_keeps_its_dtype_and_lora_still_learns(tiny_model_dir: Path) -> None:
    """The 4-bit path's preparation (`freeze_base`) freezes the base in bfloat16: nothing is
    upcast to float32 (peft's `prepare_model_for_kbit_training` upcasts the embeddings, norms
    and LM head, which ran Qwen2.5-7B's attention on the quadratic math kernel on a GPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.bfloat16)
    freeze_base(base)
    assert all(not p.requires_grad and p.dtype == torch.bfloat16 for p in base.parameters())
    policy = policy_from_model(
        base, AutoTokenizer.from_pretrained(str(tiny_model_dir)), torch.device("cpu"),
        lora=LoraSettings(rank=4, alpha=8), gradient_checkpointing=True,
    )  # fmt: skip
    named = dict(policy.model.named_parameters())
    assert {n for n, p in named.items() if p.requires_grad} == {n for n in named if "lora_" in n}
    assert all(p.dtype == torch.bfloat16 for n, p in named.items() if "lora_" not in n)
    policy.model.train()
    input_ids = torch.randint(3, 300, (2, 16))
    token_logprobs(policy.model, input_ids, chunk_size=5).sum().backward()
    assert any(
        p.grad is not None and p.grad.abs().sum() > 0 for n, p in named.items() if "lora_B" in n
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"dtype": "float64"}, "unknown dtype 'float64'"),
        ({"device": "tpu"}, "unknown device 'tpu'"),
        ({"load_in_4bit": True, "device": "cpu"}, "load_in_4bit needs a CUDA GPU"),
    ],
)
def test_bad_settings_are_one_line_errors(tiny_model_dir: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as excinfo:
        load_policy(str(tiny_model_dir), **kwargs)
    assert "\n" not in str(excinfo.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_gpu_is_one_line_error(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="no CUDA GPU: use device='cpu'"):
        load_policy(str(tiny_model_dir), device="cuda")


def test_missing_or_non_model_path_is_one_line_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist") as excinfo:
        load_policy(str(tmp_path / "nowhere"))
    assert "\n" not in str(excinfo.value)
    with pytest.raises(ValueError, match=r"no config\.json"):
        load_policy(str(tmp_path))


def test_bad_lora_settings_are_one_line_errors(tiny_model_dir: Path) -> None:
    with pytest.raises(ValueError, match="bad LoRA settings"):
        LoraSettings(rank=0)
    with pytest.raises(ValueError, match="cannot apply LoRA") as excinfo:
        load_policy(str(tiny_model_dir), lora=LoraSettings(target_modules=("no_such_proj",)))
    assert "\n" not in str(excinfo.value)


@pytest.mark.slow
def test_smollm2_alias_loads() -> None:
    policy = load_policy("smollm2-135m", lora=LoraSettings(rank=8, alpha=16))
    base = policy.model.get_base_model()
    assert base.config.model_type == "llama" and base.config.tie_word_embeddings
    assert policy.tokenizer.pad_token_id is not None
    assert policy.tokenizer.convert_ids_to_tokens(2) == "<|im_end|>"
