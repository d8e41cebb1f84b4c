"""An AppWorld data root on disk: find it, check it is complete, read its tasks and splits.

A root is the directory `appworld download data --root DIR` fills; the engine reads
`DIR/data/`: `base_dbs/<app>.db`, `api_docs/standard/<app>.json`, `datasets/<split>.txt` and
`tasks/<id>/` (`specs.json`, `dbs/<app>.jsonl` change logs over the base databases,
`ground_truth/`). The check matters: for a task missing an app's change log the engine silently
creates an empty database and every API of that app fails with "no such table", so a broken root
would look like a weak model. Everything here is plain file reading; no appworld import.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tasks.appworld.venv import AppWorldSetupError
from tasks.core import SPLITS, Task

APPS = (
    "admin",
    "api_docs",
    "supervisor",
    "amazon",
    "phone",
    "file_system",
    "spotify",
    "venmo",
    "gmail",
    "splitwise",
    "simple_note",
    "todoist",
)
HELPER_APPS = ("admin", "api_docs", "supervisor")  # not listed in Task.apps
TASK_ID = re.compile(r"^[0-9a-zA-Z]+_[0-9]+$")  # the engine requires exactly one "_"
FETCH_HINT = "get the official data with `.venv-appworld/bin/appworld download data --root DIR`"
MAX_PROBLEMS_SHOWN = 3


def resolve_root(root: str | Path | None = None) -> Path:
    """The root directory (the one holding data/): `root`, else $APPWORLD_ROOT."""
    raw = root if root is not None else os.environ.get("APPWORLD_ROOT")
    if not raw:
        raise AppWorldSetupError(
            "no AppWorld data root: set APPWORLD_ROOT to the directory that holds data/ "
            f"({FETCH_HINT})"
        )
    path = Path(raw).expanduser().absolute()
    if (path / "data").is_dir():
        return path
    if path.name == "data" and (path / "tasks").is_dir():
        return path.parent  # pointed at data/ itself
    if not path.exists():
        raise AppWorldSetupError(f"AppWorld data root {path} does not exist ({FETCH_HINT})")
    raise AppWorldSetupError(f"AppWorld data root {path} has no data/ directory ({FETCH_HINT})")


def read_splits(data: Path) -> dict[str, list[str]]:
    """Task ids per split, from data/datasets/<split>.txt (one id per line, in file order)."""
    splits: dict[str, list[str]] = {}
    for split in SPLITS:
        path = data / "datasets" / f"{split}.txt"
        if not path.is_file():
            raise AppWorldSetupError(f"AppWorld data root is incomplete: {path} is missing")
        ids = [line.split(":")[0].strip() for line in path.read_text().splitlines()]
        splits[split] = [task_id for task_id in ids if task_id]
    return splits


def validate(data: Path, task_ids: list[str]) -> None:
    """Raise AppWorldSetupError naming the first problems if the root cannot run `task_ids`."""
    problems: list[str] = []
    for app in APPS:
        db = data / "base_dbs" / f"{app}.db"
        if not db.is_file() or db.stat().st_size == 0:
            problems.append(f"{db} is missing or empty")
        if app != "admin" and not (data / "api_docs" / "standard" / f"{app}.json").is_file():
            problems.append(f"api_docs/standard/{app}.json is missing")
    for task_id in task_ids:
        problems += _task_problems(data, task_id)
        if len(problems) > 20:
            break
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = (
            f" (and {len(problems) - MAX_PROBLEMS_SHOWN} more)"
            if len(problems) > MAX_PROBLEMS_SHOWN
            else ""
        )
        raise AppWorldSetupError(
            f"AppWorld data root {data} is incomplete: {shown}{more}. The engine would quietly "
            f"create empty databases instead; fix the root ({FETCH_HINT})"
        )


def _task_problems(data: Path, task_id: str) -> list[str]:
    if not TASK_ID.match(task_id):
        return [f"task id {task_id!r} is not <scenario>_<number>"]
    folder = data / "tasks" / task_id
    if not (folder / "specs.json").is_file():
        return [f"tasks/{task_id}/specs.json is missing"]
    problems = [
        f"tasks/{task_id}/dbs/{app}.jsonl is missing"
        for app in APPS
        if not (folder / "dbs" / f"{app}.jsonl").is_file()
        and not (folder / "dbs" / f"{app}.db").is_file()
    ]
    if not (folder / "ground_truth" / "metadata.json").is_file():
        problems.append(f"tasks/{task_id}/ground_truth/metadata.json is missing")
    return problems


def read_task(data: Path, task_id: str, split: str) -> tuple[Task, dict[str, Any]]:
    """The Task (instruction, difficulty from the task's own metadata, required apps) and its
    specs.json (supervisor and date, for the prompt)."""
    folder = data / "tasks" / task_id
    specs = _read_json(folder / "specs.json")
    metadata = _read_json(folder / "ground_truth" / "metadata.json")
    if "difficulty" not in metadata:
        raise AppWorldSetupError(f"{folder}/ground_truth/metadata.json has no difficulty")
    required = folder / "ground_truth" / "required_apps.json"
    apps = _read_json(required) if required.is_file() else []
    scenario, variant = task_id.split("_")
    task = Task(
        id=task_id,
        scenario_id=scenario,
        variant=int(variant),
        difficulty=int(metadata["difficulty"]),
        instruction=specs["instruction"],
        apps=tuple(a for a in apps if a not in HELPER_APPS),
        split=split,
    )
    supervisor = specs.get("supervisor") or specs.get("main_user")  # older roots
    if not isinstance(supervisor, dict):
        raise AppWorldSetupError(f"{folder}/specs.json has no supervisor")
    return task, {"supervisor": supervisor, "datetime": specs["datetime"]}


def readable_by_others(data: Path) -> str | None:
    """The first path an engine under another uid could not read (None when all is fine).

    Checks the data directory, its top folders and one task's files: the usual way a root
    goes wrong is a private parent made by mkdtemp, or a umask of 077."""
    candidates = [data, *(data / name for name in ("base_dbs", "tasks", "datasets", "api_docs"))]
    candidates += sorted((data / "base_dbs").glob("*.db"))[:1]
    first_task = next(iter(sorted((data / "tasks").iterdir())), None)
    if first_task is not None:
        candidates += [first_task, first_task / "specs.json"]
    for path in candidates:
        needed = 0o005 if path.is_dir() else 0o004
        if path.exists() and (path.stat().st_mode & needed) != needed:
            return str(path)
    return None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AppWorldSetupError(f"cannot read {path}: {exc}") from None
