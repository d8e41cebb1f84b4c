"""Shared fixtures for the tests of `loop/`: a tiny random Llama with a tiny word-level tokenizer.

The tiny model (hidden 64, 2 layers, vocab 300) loads and runs in milliseconds on CPU. Its
initialisation is widened (`initializer_range=0.5`) so that greedy choices are not near-ties
that float noise from padding could flip. The real SmolLM2-135M-Instruct is used only by tests
marked `slow`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from loop.model.policy import Policy

TINY_VOCAB = 300
EOS_ID = 2


def tiny_tokenizer():
    """A word-level tokenizer over `<unk> <s> </s> w3 ... w299`, with no pad token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": EOS_ID}
    vocab.update({f"w{i}": i for i in range(3, TINY_VOCAB)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


# The tiny models' shape: hidden 64, 2 layers, 4 heads (2 KV heads), vocab 300.
TINY_SHAPE = {
    "vocab_size": TINY_VOCAB,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "initializer_range": 0.5,
}


def tiny_llama(*, tie_word_embeddings: bool = False, seed: int = 0):
    """A random LlamaForCausalLM of `TINY_SHAPE`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        **TINY_SHAPE,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=EOS_ID,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model + tokenizer (no pad token), as `load_policy` reads from disk."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama().save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return path


@pytest.fixture
def tiny_policy() -> Policy:
    """A fresh in-memory tiny policy (tests may change its training mode freely)."""
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    return Policy(model=tiny_llama(), tokenizer=tokenizer, device=torch.device("cpu"))


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    """SmolLM2-135M-Instruct's tokenizer (a test module may define its own)."""
    from transformers import AutoTokenizer

    from loop.model.aliases import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


@pytest.fixture(scope="module")
def suite() -> Any:
    """The built-in app world."""
    from tasks import get_suite

    return get_suite("apptown")


@pytest.fixture(scope="session")
def smollm2_policy() -> Policy:
    """The real SmolLM2-135M-Instruct in float32 on CPU (converted once; a few seconds)."""
    from loop.model.policy import load_policy

    return load_policy("smollm2-135m")


def chat_prompt_ids(tokenizer, user_text: str) -> list[int]:
    """The chat-template token ids of one user message plus the assistant header."""
    messages = [{"role": "user", "content": user_text}]
    return list(
        tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
    )


@pytest.fixture
def flipped_preferences(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every preference pair's winner and loser swapped (loop/algo/credit.py's signs negated):
    the control under which a preference method must not learn."""
    from loop.algo import credit

    original = credit.preference_signs

    def flipped(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        return out._replace(signs=-out.signs)

    monkeypatch.setattr(credit, "preference_signs", flipped)
