"""What loop/ uses of a tokenizer: a small Protocol a Hugging Face tokenizer meets.

Token in, token out: prompts are made with the chat template and kept as ids; sampled ids are
decoded only to read the agent's text, never re-encoded (except by the `openai` backend, which
gets text back and says so in `Trajectory.token_exact`).
"""

from __future__ import annotations

import re
from typing import Any, Protocol


class Tokenizer(Protocol):
    """The members of a `transformers` tokenizer that loop/ calls."""

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def pad_token_id(self) -> int | None: ...

    @property
    def all_special_ids(self) -> list[int]: ...

    def __len__(self) -> int:
        """The vocabulary's size, added tokens included (every valid id is below it)."""
        ...

    def __call__(self, text: Any, **kwargs: Any) -> Any:
        """Encodings of `text` (`["input_ids"]` holds the ids)."""
        ...

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        """The chat template applied to role/content messages (ids, or text with
        `tokenize=False`)."""
        ...

    def decode(self, token_ids: list[int], **kwargs: Any) -> Any:
        """Text of `token_ids`, a str (`skip_special_tokens=True` drops the template's tokens;
        transformers types it `str | list[str]`, the list for a batch)."""
        ...

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        """Ids of `text` (`add_special_tokens=False`: no template tokens added)."""
        ...


def special_texts(tokenizer: Tokenizer | None) -> list[str]:
    """The tokenizer's special-token texts, longest first ([]: no tokenizer)."""
    if tokenizer is None:
        return []
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    texts |= {token.content for token in decoder.values() if getattr(token, "special", False)}
    return sorted((text for text in texts if text), key=len, reverse=True)


def special_token_pattern(tokenizer: Tokenizer | None) -> re.Pattern[str] | None:
    """A pattern of the tokenizer's special-token texts, longest first (None: no tokenizer,
    or none): what text must not carry into a prompt as live template tokens."""
    texts = special_texts(tokenizer)
    return re.compile("|".join(map(re.escape, texts))) if texts else None
