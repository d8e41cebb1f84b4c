"""A tour of the sandbox: `python -m sandbox [--timeout 2]`.

Starts a small kernel pool, serves a tiny in-memory notes app through the `apis` bridge, and
runs cells that show what an agent gets: persistent state, API calls and API errors, readable
tracebacks, a cell cut at its time limit, a crash and its recovery, and blocked network access.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any

from sandbox import ApiError, KernelPool, isolation_report


class NotesApp:
    """A bridge handler with one app, `notes`: the host keeps the state, the kernel sees results."""

    def __init__(self) -> None:
        self.notes: dict[int, str] = {}

    def __call__(self, app: str, api: str, kwargs: dict[str, Any]) -> Any:
        if app != "notes":
            raise ApiError(f"no app named {app!r}; the only app is 'notes'", status=404)
        if api == "create":
            note_id = len(self.notes) + 1
            self.notes[note_id] = str(kwargs.get("text", ""))
            return {"note_id": note_id}
        if api == "show":
            wanted = kwargs.get("note_id")
            if not isinstance(wanted, int) or wanted not in self.notes:
                raise ApiError(f"no note with id {wanted!r}", status=404)
            return {"note_id": wanted, "text": self.notes[wanted]}
        raise ApiError(f"notes has no api {api!r} (try create, show)", status=404)


CELLS = [
    ("state persists across cells", "total = sum(range(10))"),
    ("", "total * 2"),
    ("an API call through the bridge", "apis.notes.create(text='buy milk')"),
    ("", "apis.notes.show(note_id=1)['text']"),
    ("an API error is an exception the agent reads", "apis.notes.show(note_id=99)"),
    ("no network", "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"),
    ("the host's files are not there", "open('/etc/shadow').read()"),
    ("a cell past its time limit is interrupted", "while True: pass"),
    ("the kernel dies", "import os; os._exit(1)"),
    ("a new kernel takes over", "print('alive again')"),
]


def main(argv: list[str] | None = None) -> int:
    """Run the tour; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m sandbox", description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=2.0, help="cell time limit in seconds")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    report = isolation_report()
    print("isolation:", {k: v for k, v in report.items() if k != "missing"})
    for gap in report["missing"]:
        print("  missing:", gap)
    started = time.monotonic()
    with KernelPool(size=1, timeout_s=args.timeout) as pool:
        sandbox = pool.acquire(handler=NotesApp())
        print(f"kernel ready in {time.monotonic() - started:.2f} s\n")
        for title, code in CELLS:
            if title:
                print(f"# {title}")
            result = sandbox.execute(code)
            print(">>> " + code.replace("\n", "\n... "))
            shown = result.output.strip().splitlines()
            for line in shown[-6:]:
                print("    " + line)
            flags = "".join(f", {f}" for f in ("timed_out", "crashed") if getattr(result, f))
            print(f"    ({result.duration_s * 1000:.0f} ms{flags})\n")
        pool.release(sandbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
