"""The one parser of an agent message's ```python blocks, for the agent loop and the inspector.

A block opens with ```python or ```py at the end of a line and closes at the next ```; a final
block left unterminated (the turn hit its token limit) runs to the end of the message.
`segments` cuts a message into prose and code, in order; `code_blocks` keeps the non-blank code;
`extract_code` joins it into the one cell the agent's turn runs (loop/rollout/agent.py).
"""

from __future__ import annotations

import re
from typing import Literal

CODE_OPEN = re.compile(r"```(?:python|py)[ \t]*\n")
CODE_CLOSE = "```"

Kind = Literal["t", "c"]  # prose ("text") or code


def segments(text: str) -> list[tuple[Kind, str]]:
    """`text` as ("t", prose) and ("c", code) pieces in order: prose that is not blank, with
    its outer newlines stripped; every block's code as written (blank blocks included)."""
    pieces: list[tuple[Kind, str]] = []
    pos = 0
    while (opening := CODE_OPEN.search(text, pos)) is not None:
        if text[pos : opening.start()].strip():
            pieces.append(("t", text[pos : opening.start()].strip("\n")))
        end = text.find(CODE_CLOSE, opening.end())
        pieces.append(("c", text[opening.end() :] if end < 0 else text[opening.end() : end]))
        pos = len(text) if end < 0 else end + len(CODE_CLOSE)
    if text[pos:].strip():
        pieces.append(("t", text[pos:].strip("\n")))
    return pieces


def code_blocks(text: str) -> list[str]:
    """The non-blank code blocks of `text`, outer newlines stripped."""
    return [body.strip("\n") for kind, body in segments(text) if kind == "c" and body.strip()]


def extract_code(text: str) -> str | None:
    """All ```python / ```py blocks joined into one cell (a final unterminated one included);
    None when there is no code."""
    return "\n\n".join(code_blocks(text)) or None
