"""Task suites by name: `suite: apptown` in a config resolves here (`get_suite("apptown")`).

- `apptown`: the built-in world (`seed`, `n_people`).
- `appworld`: the real AppWorld benchmark (`root`, `venv`, `pool_size`, `timeout_s`, ...;
  see tasks/appworld/suite.py). Its data root defaults to $APPWORLD_ROOT.
- `openenv`: an OpenEnv environment server (`url`, seeds or its task list; see
  tasks/openenv/suite.py), from the run's `openenv` section.

A training or evaluation run builds its suite with `suite_for_run(name, RunSettings(...))`: each
suite's entry takes from the run's plain values what it uses (AppWorld's engine processes play
the sandbox's part, so they take the sandbox's pool size, cell time limit and output cap).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tasks.core import SuiteSetupError, TaskSuite


@dataclass(frozen=True)
class RunSettings:
    """What a run tells its suite, as plain values (from the config's seed and sandbox)."""

    seed: int
    pool_size: int
    timeout_s: float
    max_output_chars: int
    # The suite's own section of the config as plain values (`openenv`: url, seeds, fields)
    options: dict[str, Any] = field(default_factory=dict)


def _apptown(**kwargs: Any) -> TaskSuite:
    return suite_class("apptown")(**kwargs)


def _appworld(**kwargs: Any) -> TaskSuite:
    return suite_class("appworld")(**kwargs)  # needs its own venv and data root, checked there


def _apptown_for_run(run: RunSettings) -> TaskSuite:
    return _apptown(seed=run.seed)


def _appworld_for_run(run: RunSettings) -> TaskSuite:
    """The data root from $APPWORLD_ROOT (the venv from $APPWORLD_VENV or .venv-appworld/);
    a missing one raises SuiteSetupError naming the fix."""
    return _appworld(
        root=os.environ.get("APPWORLD_ROOT"),
        pool_size=run.pool_size,
        timeout_s=run.timeout_s,
        max_output_chars=run.max_output_chars,
    )


def _openenv(**kwargs: Any) -> TaskSuite:
    return suite_class("openenv")(**kwargs)  # needs the openenv extra, checked there


def _openenv_for_run(run: RunSettings) -> TaskSuite:
    """The server at `openenv.url`, spoken to as the section says (tasks/openenv/env.py)."""
    from tasks.openenv.env import WireSpec

    options = dict(run.options)
    url = options.pop("url", None)
    if not url:
        raise SuiteSetupError("suite openenv needs openenv.url (the server, e.g. http://host:8000)")
    env_name = options.pop("env_name", None)
    train_seeds, eval_seeds = options.pop("train_seeds", ()), options.pop("eval_seeds", ())
    token_env = options.pop("token_env", None)
    token = os.environ.get(token_env) if token_env else None  # never in the config itself
    spec = WireSpec(url=url, token=token or None, **options)
    return _openenv(
        url=url, env_name=env_name, train_seeds=train_seeds, eval_seeds=eval_seeds, spec=spec
    )


SUITES: dict[str, Callable[..., TaskSuite]] = {
    "apptown": _apptown,
    "appworld": _appworld,
    "openenv": _openenv,
}
FOR_RUN: dict[str, Callable[[RunSettings], TaskSuite]] = {
    "apptown": _apptown_for_run,
    "appworld": _appworld_for_run,
    "openenv": _openenv_for_run,
}


def suite_class(name: str) -> type[TaskSuite]:
    """The class of the suite registered as `name`, without building it: what a config check
    reads of a suite's declared capabilities (`marks_collateral`). Imported on demand."""
    if name == "apptown":
        from tasks.apptown import AppTownSuite

        return AppTownSuite
    if name == "appworld":
        from tasks.appworld import AppWorldSuite

        return AppWorldSuite
    if name == "openenv":
        from tasks.openenv.suite import OpenEnvSuite

        return OpenEnvSuite
    raise KeyError(f"unknown task suite {name!r}; known suites: {sorted(SUITES)}")


def get_suite(name: str, **kwargs: Any) -> TaskSuite:
    """Build the suite registered as `name`, passing `kwargs` (e.g. `seed`) to its factory."""
    if name not in SUITES:
        raise KeyError(f"unknown task suite {name!r}; known suites: {sorted(SUITES)}")
    return SUITES[name](**kwargs)


def suite_for_run(name: str, run: RunSettings) -> TaskSuite:
    """The suite registered as `name`, configured from a run's settings."""
    if name not in FOR_RUN:
        raise KeyError(f"unknown task suite {name!r}; known suites: {sorted(FOR_RUN)}")
    return FOR_RUN[name](run)
