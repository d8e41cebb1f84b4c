"""`OpenEnvSuite`: an OpenEnv environment server as a task suite (`suite: openenv`).

    suite = OpenEnvSuite("http://127.0.0.1:8000")            # tasks from the server's task list
    suite = OpenEnvSuite(url, train_seeds=range(64), eval_seeds=range(64, 80))  # or from seeds

Tasks: with seeds, split `train` is `train_seeds` and `dev` is `eval_seeds` (a task `seed-<n>`
resets with `seed=n`); without, every split the server's task API lists (`GET /{name}/splits`,
`POST /{name}/tasks`), each task reset by its `id`. The action's code field, whether the server
takes `submit`, and the cell length it takes are read from its `/schema` when the suite is
built, so a server that cannot take cells fails then, in one line, not mid-run. The worked
example comes from our own servers (`GET /loop/example`); another server has none.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import httpx

from tasks.core import SuiteSetupError, Task
from tasks.openenv.env import OpenEnvEnv, WireSpec

TRAIN_SPLIT, EVAL_SPLIT = "train", "dev"  # the splits of a suite of seeds


class OpenEnvSuite:
    """The tasks of one OpenEnv server (see the module docstring)."""

    name = "openenv"
    uses_sandbox = False  # the server runs the agent's code (ours: in its own sandboxes)
    marks_collateral = False  # an external reward carries no collateral test
    replays_exactly = False  # a server of its own: nothing says its world is deterministic

    def __init__(
        self,
        url: str,
        *,
        env_name: str | None = None,
        train_seeds: Iterable[int] = (),
        eval_seeds: Iterable[int] = (),
        spec: WireSpec | None = None,
    ):
        """`url`: the server (http:// or ws://). `env_name`: its environment (the only one it
        lists by default). `train_seeds`, `eval_seeds`: tasks from seeds instead of its task
        list. `spec`: the action and observation fields, timeouts (tasks/openenv/env.py)."""
        if importlib.util.find_spec("openenv") is None:
            raise SuiteSetupError(
                "suite openenv needs the openenv extra: pip install -e .[openenv]"
            )
        self.url = url.rstrip("/").replace("ws://", "http://", 1).replace("wss://", "https://", 1)
        self.spec = replace(spec or WireSpec(url), url=self.url)
        self.spec = self._read_schema(self.spec)
        self.env_name = env_name or self._only_environment()
        self._reset_args: dict[str, dict[str, Any]] = {}
        self._splits: dict[str, list[Task]] = {}
        seeds = {TRAIN_SPLIT: list(train_seeds), EVAL_SPLIT: list(eval_seeds)}
        if any(seeds.values()):
            for split, numbers in seeds.items():
                self._splits[split] = [
                    self._add(_seed_task(n, split), {"seed": n}) for n in numbers
                ]
        else:
            for split in self._server_splits():
                specs = self._get("POST", f"/{self.env_name}/tasks", {"split": split})["tasks"]
                self._splits[split] = [
                    self._add(_listed_task(spec, split), {"task_id": spec["id"]}) for spec in specs
                ]
        self._example: list[dict[str, str]] | None = None

    @property
    def splits(self) -> dict[str, list[Task]]:
        return {split: list(tasks) for split, tasks in self._splits.items()}

    def tasks(self, split: str) -> list[Task]:
        if split not in self._splits:
            raise KeyError(f"unknown split {split!r}; the server's are {sorted(self._splits)}")
        return list(self._splits[split])

    def task(self, task_id: str) -> Task:
        for tasks in self._splits.values():
            for task in tasks:
                if task.id == task_id:
                    return task
        raise KeyError(f"no task {task_id!r} on the OpenEnv server {self.url}")

    def make_env(self, task: Task, sandbox: Any = None) -> OpenEnvEnv:
        """An episode of `task` in a session of its own (opened by `areset`)."""
        return OpenEnvEnv(task, self.spec, dict(self._reset_args[task.id]))

    def example_messages(self) -> list[dict[str, str]]:
        """The server's worked example (ours serve the suite's), or none."""
        if self._example is None:
            url, wait = f"{self.url}/loop/example", self.spec.connect_timeout_s
            reply = httpx.get(url, headers=self.spec.headers, timeout=wait)
            self._example = reply.json() if reply.status_code == 200 else []
        return list(self._example)

    # -- internals ----------------------------------------------------------------------------

    def _add(self, task: Task, reset_args: dict[str, Any]) -> Task:
        if task.id in self._reset_args:
            raise SuiteSetupError(f"the OpenEnv server {self.url} lists task {task.id} twice")
        self._reset_args[task.id] = reset_args
        return task

    def _get(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A JSON request to the server; an unreachable or refusing one is SuiteSetupError."""
        try:
            url, wait = f"{self.url}{path}", self.spec.connect_timeout_s
            reply = httpx.request(method, url, json=body, headers=self.spec.headers, timeout=wait)
            reply.raise_for_status()
            return reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SuiteSetupError(f"OpenEnv server {self.url}{path}: {exc}") from None

    def _read_schema(self, spec: WireSpec) -> WireSpec:
        """The action's fields from `/schema`: the code field must be there."""
        fields = self._get("GET", "/schema")["action"].get("properties", {})
        if spec.code_field not in fields:
            raise SuiteSetupError(
                f"the OpenEnv server {self.url} takes no action field {spec.code_field!r} "
                f"(its fields: {sorted(fields)}); set openenv.code_field"
            )
        submit = spec.submit_field if spec.submit_field in fields else None
        limit = fields[spec.code_field].get("maxLength")
        return replace(spec, submit_field=submit, max_code_chars=limit)

    def _only_environment(self) -> str:
        names = self._get("GET", "/list_environments")
        if not isinstance(names, list) or len(names) != 1:
            raise SuiteSetupError(
                f"the OpenEnv server {self.url} lists environments {names}: set openenv.env_name"
            )
        return str(names[0])

    def _server_splits(self) -> list[str]:
        splits = [s["name"] for s in self._get("GET", f"/{self.env_name}/splits")]
        if not splits:
            raise SuiteSetupError(
                f"the OpenEnv server {self.url} lists no tasks: set openenv.train_seeds"
            )
        return splits


def _seed_task(seed: int, split: str) -> Task:
    return Task(f"seed-{seed}", f"seed-{seed}", 1, 0, f"the task of seed {seed}", (), split)


def _listed_task(spec: dict[str, Any], split: str) -> Task:
    """A task the server lists: ours list whole `Task`s, others at least an `id`."""
    task_id = str(spec["id"])
    return Task(
        task_id, str(spec.get("scenario_id", task_id)), int(spec.get("variant", 1)),
        int(spec.get("difficulty", 0)), str(spec.get("instruction", "")),
        tuple(spec.get("apps", ())), split,
    )  # fmt: skip
