"""A module's forward replaced on the instance, and put back: how loop/model/lora.py and
loop/model/norms.py give transformers' and peft's layers their faster forwards."""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


def give_forwards(model: Any, function: Callable[..., Any], where: Callable[[Any], bool]) -> int:
    """Every module of `model` that `where` picks runs `function` bound to it as its forward
    (its class's stays as it was); how many there were."""
    count = 0
    for module in model.modules():
        if where(module):
            module.forward = types.MethodType(function, module)
            count += 1
    return count


def restore_forwards(model: Any, function: Callable[..., Any]) -> None:
    """Every module of `model` given `function` gets its class's forward back."""
    for module in model.modules():
        forward = module.__dict__.get("forward")
        if isinstance(forward, types.MethodType) and forward.__func__ is function:
            del module.forward
