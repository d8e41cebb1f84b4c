"""Shared fixtures for the task-suite tests: one AppTown suite per test session."""

from __future__ import annotations

import pytest

from tasks.apptown import AppTownSuite


@pytest.fixture(scope="session")
def suite() -> AppTownSuite:
    return AppTownSuite()
