"""Project-wide test configuration: `gpu` tests run only where a CUDA device is present.

Run everything: python -m pytest          Skip slow tests locally: python -m pytest -m "not slow"
"""

from __future__ import annotations

import importlib.util

import pytest


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `@pytest.mark.gpu` tests, saying why, when this machine has no CUDA GPU."""
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none on this machine)")
    for item in gpu_items:
        item.add_marker(skip)
