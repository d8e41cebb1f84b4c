"""`AppWorldSuite`: the real AppWorld benchmark behind the `TaskSuite` contract.

    suite = AppWorldSuite()                 # $APPWORLD_ROOT, $APPWORLD_VENV or .venv-appworld/
    env = suite.make_env(suite.tasks("dev")[0], sandbox=None)
    context = env.reset(); observation = env.step(code); report = env.evaluate()

Tasks and splits come from the data root (`datasets/<split>.txt`, each task's specs.json and
ground-truth metadata), checked at construction so a broken root fails loudly before a run.
`tasks("train_paper")` is the LOOP paper's training subset: the train tasks of difficulty 1
and 2 (72 tasks in 24 scenarios on the official data), chosen by the tasks' own metadata.
The engines (pool.py) start on the first `make_env`, not before: listing tasks is free.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tasks.appworld import data_root
from tasks.appworld.confine import ENGINE_LIMITS
from tasks.appworld.engine import EngineSpec
from tasks.appworld.env import AppWorldEnv
from tasks.appworld.example import example_messages
from tasks.appworld.pool import EnginePool
from tasks.appworld.venv import AppWorldSetupError, check_package, venv_python
from tasks.core import SPLITS, SandboxLike, Task

PAPER_TRAIN_SPLIT = "train_paper"
PAPER_MAX_DIFFICULTY = 2
PAPER_DEV_DENYLIST = ("3ab5b8b_3", "37a8675_1")  # the LOOP reference code's denylist (dev)


class AppWorldSuite:
    """The tasks of one AppWorld data root (`suite: appworld` in a config)."""

    name = "appworld"
    uses_sandbox = False  # the agent's code runs in the engine process, not in a REPL kernel
    marks_collateral = False  # AppWorld's tests and API records carry no such marks
    replays_exactly = False  # its engine's clock and ids are not ours to pin: not guaranteed

    def __init__(
        self,
        root: str | Path | None = None,
        *,
        venv: str | Path | None = None,
        pool_size: int = 2,
        max_tasks_per_engine: int = 100,
        timeout_s: float = 100,
        memory_mb: int = ENGINE_LIMITS.memory_mb,
        max_output_chars: int = 20_000,
        exclude_dev_denylist: bool = False,
        denylist: tuple[str, ...] = PAPER_DEV_DENYLIST,
        strict_isolation: bool = False,
    ):
        """`root`: the AppWorld root (holding data/), default $APPWORLD_ROOT. `venv`: the
        AppWorld virtualenv, default $APPWORLD_VENV or .venv-appworld/. `pool_size`: engines
        kept warm. `max_tasks_per_engine`: tasks before an engine is recycled. `timeout_s`:
        the engine's own time limit per cell (AppWorld's default is 100). `memory_mb`: address
        space per engine. `max_output_chars`: longer cell outputs are cut with a notice.
        `exclude_dev_denylist`: drop `denylist` (the paper's two broken dev tasks) from dev.
        `strict_isolation`: refuse to start engines when a sandbox layer is missing."""
        if pool_size < 0 or max_tasks_per_engine < 1:
            raise ValueError(
                f"pool_size must be >= 0 and max_tasks_per_engine >= 1: "
                f"{pool_size}, {max_tasks_per_engine}"
            )
        if timeout_s <= 0 or max_output_chars <= 0:
            raise ValueError(
                f"timeout_s and max_output_chars must be > 0: {timeout_s}, {max_output_chars}"
            )
        self.root = data_root.resolve_root(root)
        self.data = self.root / "data"
        self.python = venv_python(venv)
        check_package(self.python)
        self.timeout_s = max(1, round(timeout_s))  # the engine's timer counts whole seconds
        self.max_output_chars = max_output_chars
        ids_by_split = data_root.read_splits(self.data)
        if exclude_dev_denylist:
            ids_by_split["dev"] = [i for i in ids_by_split["dev"] if i not in denylist]
        every_id = [task_id for ids in ids_by_split.values() for task_id in ids]
        data_root.validate(self.data, every_id)
        self._check_readable()
        self._tasks: dict[str, Task] = {}
        self._specs: dict[str, dict[str, Any]] = {}
        for split, ids in ids_by_split.items():
            for task_id in ids:
                if task_id in self._tasks:
                    raise AppWorldSetupError(f"task {task_id} is listed in two dataset files")
                task, specs = data_root.read_task(self.data, task_id, split)
                self._tasks[task_id], self._specs[task_id] = task, specs
        self.engine_spec = EngineSpec(
            python=self.python,
            data=self.data,
            limits=_with_memory(memory_mb),
            warmup_task=every_id[0] if every_id else None,
            strict=strict_isolation,
        )
        self.pool_size = pool_size
        self.max_tasks_per_engine = max_tasks_per_engine
        self._pool: EnginePool | None = None
        self._pool_lock = threading.Lock()
        self._example: list[dict[str, str]] | None = None
        self.io_threads = ThreadPoolExecutor(max_workers=64, thread_name_prefix="appworld-io")

    @property
    def splits(self) -> dict[str, list[Task]]:
        return {split: self.tasks(split) for split in SPLITS}

    def tasks(self, split: str) -> list[Task]:
        """The tasks of one split in dataset-file order; `train_paper` is the paper's subset."""
        if split == PAPER_TRAIN_SPLIT:
            return [t for t in self.tasks("train") if t.difficulty <= PAPER_MAX_DIFFICULTY]
        if split not in SPLITS:
            raise KeyError(
                f"unknown split {split!r}; the splits are {[*SPLITS, PAPER_TRAIN_SPLIT]}"
            )
        return [task for task in self._tasks.values() if task.split == split]

    def task(self, task_id: str) -> Task:
        if task_id not in self._tasks:
            raise KeyError(f"no task {task_id!r} in the AppWorld root {self.root}")
        return self._tasks[task_id]

    def specs(self, task: Task) -> dict[str, Any]:
        """The task's supervisor and date, from its specs.json."""
        return self._specs[task.id]

    def make_env(self, task: Task, sandbox: SandboxLike | None = None) -> AppWorldEnv:
        """An environment for `task`. Agent code runs in an AppWorld engine process (confined
        by the sandbox's layers), not in `sandbox`, which is accepted for the contract only."""
        self.task(task.id)
        self.pool  # noqa: B018 - the first env starts the warm engines
        return AppWorldEnv(
            task, specs=self.specs(task), engines=lambda: self.pool, io_threads=self.io_threads,
            timeout_s=self.timeout_s, max_output_chars=self.max_output_chars,
        )  # fmt: skip

    @property
    def pool(self) -> EnginePool:
        """The engine pool, started on first use."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = EnginePool(
                    self.engine_spec,
                    size=self.pool_size,
                    max_tasks_per_engine=self.max_tasks_per_engine,
                )
            return self._pool

    def example_messages(self) -> list[dict[str, str]]:
        """The prompt's worked example (tasks/appworld/example.py)."""
        with self._pool_lock:
            if self._example is None:
                self._example = example_messages()
            return list(self._example)

    def close(self) -> None:
        """Stop every engine (also done at interpreter exit)."""
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def __enter__(self) -> AppWorldSuite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_readable(self) -> None:
        from sandbox import probe

        caps = probe()
        if not (caps.separate_uid and caps.bwrap):
            return  # engines run as this user
        blocked = data_root.readable_by_others(self.data) or _unreadable_venv(self.python)
        if blocked:
            raise AppWorldSetupError(
                f"engines run under an unprivileged uid and cannot read {blocked}: make the "
                f"root and the venv world-readable (chmod -R o+rX {blocked})"
            )


def _with_memory(memory_mb: int) -> Any:
    from dataclasses import replace

    return replace(ENGINE_LIMITS, memory_mb=memory_mb)


def _unreadable_venv(python: Path) -> str | None:
    venv = python.parent.parent
    for path in (venv, venv / "bin", venv / "lib"):
        if path.exists() and (path.stat().st_mode & 0o005) != 0o005:
            return str(path)
    return None
