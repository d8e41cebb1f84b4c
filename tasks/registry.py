"""Task suites by name: `suite: apptown` in a config resolves here (`get_suite("apptown")`).

- `apptown`: the built-in world (`seed`, `n_people`).
- `appworld`: the real AppWorld benchmark (`root`, `venv`, `pool_size`, `timeout_s`, ...;
  see tasks/appworld/suite.py). Its data root defaults to $APPWORLD_ROOT.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tasks.core import TaskSuite


def _apptown(**kwargs: Any) -> TaskSuite:
    from tasks.apptown import AppTownSuite  # imported on demand: builds nothing until called

    return AppTownSuite(**kwargs)


def _appworld(**kwargs: Any) -> TaskSuite:
    from tasks.appworld import AppWorldSuite  # needs its own venv and data root, checked here

    return AppWorldSuite(**kwargs)


SUITES: dict[str, Callable[..., TaskSuite]] = {"apptown": _apptown, "appworld": _appworld}


def get_suite(name: str, **kwargs: Any) -> TaskSuite:
    """Build the suite registered as `name`, passing `kwargs` (e.g. `seed`) to its factory."""
    if name not in SUITES:
        raise KeyError(f"unknown task suite {name!r}; known suites: {sorted(SUITES)}")
    return SUITES[name](**kwargs)
