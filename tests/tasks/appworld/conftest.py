"""Fixtures for the AppWorld suite's tests: the real engine, a small data root built at test time.

The AppWorld venv comes from `bash scripts/setup_appworld.sh` (CI's setup runs it). Without it
these tests skip locally, saying so, and fail under CI (where $CI is set), so a broken setup
cannot pass unnoticed. The data root is built once per session in a temporary directory by
the installed package's own models (tasks/appworld/engine_side/small_root.py): it is derived
from AppWorld's licensed code and is never written into the repository.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tasks.appworld import AppWorldSetupError, AppWorldSuite, build_small_root
from tasks.appworld.venv import check_package, venv_python


def _engine_python() -> Path:
    try:
        python = venv_python()
        check_package(python)
    except AppWorldSetupError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must have the AppWorld venv: {exc}")
        pytest.skip(f"no AppWorld venv here: {exc}")
    return python


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The AppWorld venv's interpreter (skips locally / fails in CI when it is missing)."""
    return _engine_python()


@pytest.fixture(scope="session")
def small_root(engine_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small self-made AppWorld data root: 8 tasks in 5 scenarios (see small_root.py)."""
    return build_small_root(tmp_path_factory.mktemp("appworld-root"), engine_python)


@pytest.fixture(scope="session")
def solutions(small_root: Path) -> dict[str, Any]:
    """Per task: gold and wrong solution cells, and the expected answer."""
    return json.loads((small_root / "small_root.json").read_text())


@pytest.fixture(scope="session")
def aw_suite(small_root: Path) -> Iterator[AppWorldSuite]:
    """One suite with warm engines, shared by the engine and rollout tests."""
    with AppWorldSuite(small_root, pool_size=3, timeout_s=5) as suite:
        yield suite
