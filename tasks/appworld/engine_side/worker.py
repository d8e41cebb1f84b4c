"""One AppWorld engine process: JSON lines in on stdin, JSON lines out (runs in the AppWorld venv).

    <venv>/bin/python -I worker.py [--warmup TASK_ID]      (started by tasks/appworld/engine.py)

Requests, one JSON object per line; every reply is one line `{"ok": true, ...}` or
`{"ok": false, "error": "..."}`:

    {"op": "initialize", "task_id": "...", "timeout_s": 30, "max_output_chars": 20000}
        -> {"context": {"instruction", "datetime", "supervisor": {...}}}
    {"op": "execute", "code": "..."}  -> {"output", "api_calls": [...], "completed": bool}
    {"op": "evaluate"}                -> {"passes", "failures", "test_data", "num_tests"}
    {"op": "close"}                   -> {"rss_kb"}         (the world is closed, the process stays)

Why a process of its own: AppWorld freezes this process's clock while a world is open, allows
one open world per process and times cells out with SIGALRM (main thread only). The protocol
therefore never reads the clock except through CLOCK_MONOTONIC (freezegun does not patch it).
Stray prints of the package go to stderr: the protocol owns the real stdout.

API calls are recorded at AppWorld's `Requester._request`, the layer that also writes the
engine's own `api_calls.jsonl` log; untracked calls (the engine's own `task_completed` probe)
and the private admin app are left out, as AppWorld's log leaves them out.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

PROTOCOL = os.fdopen(os.dup(1), "w", buffering=1)  # the host reads replies from here
os.dup2(2, 1)  # anything else printed to fd 1 lands in the engine log
sys.stdout = os.fdopen(1, "w", buffering=1)

from appworld import AppWorld  # noqa: E402 - after the stdout swap, so import noise is logged
from appworld.requester import Requester  # noqa: E402

calls: list[dict[str, Any]] = []
_original_request = Requester._request


def clock() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _recorded_request(self: Any, _app_name: str, _api_name: str, *args: Any, **kwargs: Any) -> Any:
    if not kwargs.get("track", True) or _app_name == "admin":
        return _original_request(self, _app_name, _api_name, *args, **kwargs)
    arguments = {
        k: v for k, v in kwargs.items() if k not in ("client", "raise_on_failure", "track")
    }
    start = clock()
    try:
        response = _original_request(self, _app_name, _api_name, *args, **kwargs)
    except Exception as exc:
        calls.append(_call(_app_name, _api_name, arguments, start, " ".join(str(exc).split())))
        raise
    error = None
    if response.status_code != 200:
        error = f"{response.status_code}: {' '.join(response.text.split())}"
    calls.append(_call(_app_name, _api_name, arguments, start, error))
    return response


def _call(app: str, api: str, arguments: dict[str, Any], start: float, error: str | None) -> dict:
    return {
        "app": app,
        "api": api,
        "arguments": json.loads(json.dumps(arguments, default=repr)),
        "ok": error is None,
        "error": None if error is None else error[:1000],
        "latency_s": clock() - start,
    }


Requester._request = _recorded_request


class Engine:
    """The open world (at most one) and what the host asked of it."""

    def __init__(self) -> None:
        self.world: Any = None
        self.max_output_chars = 20_000

    def initialize(self, task_id: str, timeout_s: int, max_output_chars: int) -> dict[str, Any]:
        self.close()
        self.max_output_chars = max_output_chars
        self.world = AppWorld(task_id=task_id, experiment_name="loop", timeout_seconds=timeout_s)
        calls.clear()
        task = self.world.task
        supervisor = {k: task.supervisor[k] for k in ("first_name", "last_name", "email")}
        supervisor["phone_number"] = task.supervisor["phone_number"]
        context = {
            "instruction": task.instruction,
            "datetime": task.datetime.isoformat(),
            "supervisor": supervisor,
        }
        return {"context": context}

    def execute(self, code: str) -> dict[str, Any]:
        world = self._open()
        calls.clear()
        output = world.execute(code)
        if len(output) > self.max_output_chars:
            cut = len(output) - self.max_output_chars
            output = output[: self.max_output_chars] + f"\n[output truncated: {cut} more chars]"
        return {"output": output, "api_calls": list(calls), "completed": world.task_completed()}

    def evaluate(self) -> dict[str, Any]:
        tracker = self._open().evaluate(suppress_errors=True)
        return {
            "passes": tracker.passes,
            "failures": tracker.failures,
            "test_data": tracker.test_data,
            "num_tests": tracker.num_tests,
        }

    def close(self) -> dict[str, Any]:
        if self.world is not None:
            world, self.world = self.world, None
            world.close()
        return {"rss_kb": rss_kb()}

    def _open(self) -> Any:
        if self.world is None:
            raise RuntimeError("no open task: send initialize first")
        return self.world


def rss_kb() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def handle(engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
    op = request.get("op")
    if op == "initialize":
        return engine.initialize(
            request["task_id"], int(request["timeout_s"]), int(request["max_output_chars"])
        )
    if op == "execute":
        return engine.execute(request["code"])
    if op == "evaluate":
        return engine.evaluate()
    if op == "close":
        return engine.close()
    if op == "ping":
        return {"rss_kb": rss_kb()}
    raise ValueError(f"unknown op {op!r}")


def reply(message: dict[str, Any]) -> None:
    PROTOCOL.write(json.dumps(message, default=repr) + "\n")


def main(argv: list[str]) -> None:
    engine = Engine()
    started = clock()
    if len(argv) == 2 and argv[0] == "--warmup":
        # The first world of a process imports the twelve FastAPI apps (seconds); pay it now,
        # before a rollout waits for it. It also proves the data root loads.
        engine.initialize(argv[1], 10, 100)
        engine.close()
    reply({"ok": True, "ready": True, "pid": os.getpid(), "start_s": clock() - started,
           "rss_kb": rss_kb()})  # fmt: skip
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            result = handle(engine, json.loads(line))
        except Exception as exc:
            text = "".join(traceback.format_exception(exc)[-6:])
            reply({"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": text})
            continue
        reply({"ok": True, **result})


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Exception as exc:  # start-up failure: say why on the protocol, then exit
        reply({"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()[-2000:]})  # fmt: skip
        sys.exit(1)
