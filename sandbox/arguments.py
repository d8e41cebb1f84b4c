"""Checks on `apis` arguments at the bridge, before any handler sees them.

Agent code controls every argument, and a value that is valid JSON can still break a handler:
an integer past SQLite's 64-bit range, NaN or infinity, a lone surrogate that cannot be encoded
as UTF-8, a structure nested hundreds deep (recursion in whatever records or copies it) or one
with millions of members. `argument_problem` names the first such value so the bridge can
answer 422 (an error the agent reads, scored as its own) instead of letting a handler fail with
a 500 that would count against our machinery.

The walk is iterative, so a deep value cannot make the check itself recurse.
"""

from __future__ import annotations

import math
from typing import Any

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_DEPTH = 16  # nesting of lists/objects inside one argument (the arguments object is depth 0)
MAX_MEMBERS = 10_000  # list items + object entries over all arguments of one call


def argument_problem(kwargs: dict[str, Any]) -> str | None:
    """Why these decoded JSON arguments are refused, or None when every value is acceptable."""
    members = 0
    stack: list[tuple[str, Any, int]] = [(name, value, 1) for name, value in kwargs.items()]
    while stack:
        where, value, depth = stack.pop()
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                bits = value.bit_length()
                return f"argument {where!r}: a {bits}-bit integer is outside the 64-bit range"
        elif isinstance(value, float):
            if not math.isfinite(value):
                return f"argument {where!r}: number {value!r} is not finite"
        elif isinstance(value, str):
            if not _encodable(value):
                return f"argument {where!r}: string is not valid Unicode (lone surrogate)"
        elif isinstance(value, list | dict):
            if depth > MAX_DEPTH:
                return f"argument {where!r}: nested deeper than {MAX_DEPTH} levels"
            members += len(value)
            if members > MAX_MEMBERS:
                return f"arguments have more than {MAX_MEMBERS} list items and object entries"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and not _encodable(key):
                    return f"argument {where!r}: object key is not valid Unicode (lone surrogate)"
                stack.append((where, item, depth + 1))
        else:
            return f"argument {where!r}: {type(value).__name__} is not a JSON value"
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
