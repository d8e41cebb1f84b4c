"""Typed run configuration: YAML file + `key=value` overrides -> `RunConfig`, or a one-line error.

Every field has a type and a one-line doc (loop/config_types.py, printed by `python train.py
--help-config`: `describe`); a wrong key, a wrong type or a bad value is a `ConfigError` naming
the dotted key (`agent.max_turns: expected int, got 'ten'`), never a traceback deep in a run. A
field whose type is a dataclass is a section, in YAML (`kl:` under `train:`) and in overrides
(`train.kl.coef=0.01`) alike; a key that moved into a section names its new place (`MOVED`),
a removed choice its replacement (`REMOVED`).
Values are checked once, here (loop/checks.py `check_values`); what a training run needs on
top is `check_run`. Defaults follow the paper where it has a number (loop_spec.md);
`configs/quickstart.yaml` scales them down for a CPU.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from loop.checks import check_values
from loop.config_types import (
    AgentConfig,
    ConfigError,
    CriticConfig,
    EvalConfig,
    GeneratorConfig,
    ModelConfig,
    OpenEnvConfig,
    RunConfig,
    SandboxConfig,
    TrainConfig,
    WarmStartConfig,
    one_line,
)

__all__ = [
    "AgentConfig", "ConfigError", "CriticConfig", "EvalConfig", "GeneratorConfig",
    "ModelConfig", "OpenEnvConfig", "RunConfig", "SandboxConfig", "TrainConfig",
    "WarmStartConfig", "describe",
    "load_config",
]  # fmt: skip

# Keys that moved into a named section: {section: {old key: new key}}. An old config or override
# fails with one line naming the new key, "<section>.<old> is now <section>.<new>".
MOVED: dict[str, dict[str, str]] = {
    "train": {
        "old_logprobs": "off_policy.old_logprobs",
        "logprob_diff_threshold": "off_policy.logprob_diff_threshold",
        "is_correction": "off_policy.correction",
        "is_cap": "off_policy.cap",
        "is_band": "off_policy.band",
        "split_mismatch": "off_policy.split_mismatch",
        "kl_coef": "kl.coef",
        "kl_in": "kl.into",
        "kl_reference": "kl.reference",
        "demo_coef": "replay.coef",
        "demos_per_step": "replay.demos_per_step",
        "max_staleness": "overlap.max_staleness",
        "horizon_start": "horizon.start",
        "horizon_step": "horizon.step",
        "horizon_every": "horizon.every",
    },
    "model": {"recompute_mlp": "recompute (none | mlp | layers)"},
}

# Choices that were removed: {dotted key: {old value: the one-line error naming the replacement}}.
REMOVED: dict[str, dict[str, str]] = {
    "generator.backend": {
        "vllm": "generator.backend vllm (the in-process engine) was removed: use vllm_server (a "
        "server on the same GPU) or hf",
    },
}


def load_config(path: Path | str | None, overrides: list[str] = ()) -> RunConfig:  # type: ignore[assignment]
    """Read a YAML file (or start from defaults), apply `a.b=value` overrides, validate.

    A file may start from another: `base: other.yaml` (relative to the file) loads that one first
    and then applies this file's keys on top, section by section.
    """
    data = _read_yaml(Path(path), ()) if path is not None else {}
    for override in overrides:
        _apply_override(data, override)
    config = _build(RunConfig, data, prefix="")
    check_values(config)
    return config


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """One config file as a mapping, with its `base` chain merged underneath."""
    if not path.is_file():
        where = f" (base of {chain[-1]})" if chain else ""
        raise ConfigError(f"config file not found: {path}{where}")
    if path.resolve() in chain:
        raise ConfigError(f"{path}: base configs form a cycle")
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({one_line(exc)})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a file name, got {base!r}")
    return _merge(_read_yaml(path.parent / base, (*chain, path.resolve())), loaded)


def _merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `under`; mappings merge key by key, anything else replaces."""
    merged = dict(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {override!r} is not key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    node[leaf] = value


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    moved = MOVED.get(prefix.rstrip("."), {})
    for name in unknown:
        if name in moved:
            raise ConfigError(f"{prefix}{name} is now {prefix}{moved[name]}")
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(fields)})")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(typing.cast(type, hint), value, prefix=f"{prefix}{name}.")
        else:
            values[name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(item, args[0], f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is Literal:
        if value not in args:
            if isinstance(value, str) and (removed := REMOVED.get(key, {}).get(value)):
                raise ConfigError(removed)
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (
        isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key}: expected {hint.__name__}, got {value!r}")
    return value


def describe(cls: type = RunConfig, prefix: str = "") -> str:
    """Every field of `cls` and its sections: `key (type, default: value)` and its doc."""
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            lines.append(f"\n{prefix}{f.name}: {f.metadata['doc']}")
            lines.append(describe(typing.cast(type, hint), f"{prefix}{f.name}."))
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        lines.append(
            f"  {prefix}{f.name} ({kind}, default: {default!r})\n      {f.metadata['doc']}"
        )
    return "\n".join(lines)
