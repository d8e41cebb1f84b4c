"""What `loop.build` sets up and refuses around the parts: the open-file limit, the peft that
FSDP2 + LoRA resumes need, and no sandbox pool for a suite that runs the agent's code itself.

python -m pytest tests/loop/test_build.py -q        (a few seconds)
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("build", ["build_evaluation", "build_training"])
def test_build_raises_the_soft_open_file_limit_to_the_hard_one(build: str) -> None:
    """A soft `ulimit -n` below the hard one (a node's usual 1,024) would fail sandbox starts
    with EMFILE in a large run; both builds raise it before anything starts."""
    script = textwrap.dedent(f"""
        import contextlib, resource
        import loop.build as build
        from loop.config import RunConfig

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        low = min(256, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

        class Stop(Exception):
            pass

        def stop(config):  # the suite is built next: nothing more is needed
            raise Stop

        build.build_suite = stop
        with contextlib.suppress(Stop):
            parts = build.{build}(RunConfig())
            if hasattr(parts, "__enter__"):
                parts.__enter__()
        print(low, *resource.getrlimit(resource.RLIMIT_NOFILE))
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    low, soft, hard = map(int, out.stdout.split())
    if low == hard:
        pytest.skip(f"this machine's hard open-file limit is {hard}: nothing to raise")
    assert soft == hard, f"soft open-file limit {soft} left below the hard {hard}"


def test_the_peft_floor_loads_lora_into_fsdp2_shards() -> None:
    """pyproject's peft floor is the version whose `set_peft_model_state_dict` reshards an
    adapter into DTensor parameters (a LoRA run under FSDP2 resumes through it)."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.version import Version

    from loop.model.checkpoint import PEFT_DTENSOR, check_sharded_lora_loads

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (peft,) = [Requirement(d) for d in deps if Requirement(d).name == "peft"]
    floors = [Version(s.version) for s in peft.specifier if s.operator == ">="]
    assert floors and min(floors) >= Version(PEFT_DTENSOR), f"{peft}: below {PEFT_DTENSOR}"
    check_sharded_lora_loads()  # the installed versions have it


def test_sharded_lora_with_an_old_peft_is_refused_at_the_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import peft

    import loop.build as build
    from loop.config import ConfigError, load_config
    from loop.model import distributed

    config = load_config(None, ["model.lora_rank=8"])
    monkeypatch.setattr(build, "build_suite", lambda config: None)
    monkeypatch.setattr(build, "check_splits", lambda *args, **kwargs: None)
    monkeypatch.setattr(distributed, "init_from_env", lambda **kwargs: True)
    monkeypatch.setattr(distributed, "is_distributed", lambda: True)  # two learners, FSDP2
    monkeypatch.setattr(peft, "__version__", "0.20.0")
    old_peft = r"resumes only with peft >= 0\.21\.1 .*found peft 0\.20"
    with pytest.raises(ConfigError, match=old_peft), build.build_training(config):
        pass


@pytest.fixture
def own_engine_suite(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """A suite that runs the agent's code itself (AppWorld's way); the pools built, recorded."""
    from types import SimpleNamespace

    import loop.build as build

    pools: list[object] = []
    monkeypatch.setattr(build, "KernelPool", lambda **kwargs: pools.append(kwargs))
    monkeypatch.setattr(build, "build_suite", lambda config: SimpleNamespace(uses_sandbox=False))
    monkeypatch.setattr(build, "check_splits", lambda *args, **kwargs: None)
    return pools


def test_a_suite_without_sandboxes_gets_no_pool_to_evaluate(
    own_engine_suite: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    import asyncio

    import loop.build as build
    from loop.config import RunConfig

    monkeypatch.setattr(build, "build_generator", lambda config, checkpoint=None: (None, None))
    parts = build.build_evaluation(RunConfig())
    assert own_engine_suite == []
    with parts.pool as pool, pytest.raises(RuntimeError, match="runs the agent's code itself"):
        asyncio.run(pool.acquire_async())


def test_a_suite_without_sandboxes_gets_no_pool_to_train(
    own_engine_suite: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    from types import SimpleNamespace

    import loop.build as build
    from loop.config import RunConfig
    from loop.model import policy

    monkeypatch.setattr(policy, "load_policy", lambda *a, **k: SimpleNamespace(tokenizer=None))
    monkeypatch.setattr(build, "_training_generator", lambda *args: SimpleNamespace())
    monkeypatch.setattr(build, "_close", lambda generator: None)
    with build.build_training(RunConfig()) as parts:
        assert own_engine_suite == []
        assert parts.suite.uses_sandbox is False
