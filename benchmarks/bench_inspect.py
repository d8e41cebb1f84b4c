"""Speed and size of the inspector's HTML report for N rollouts, and how fast Chromium opens it.

The rollouts are real scripted ones from the built-in app world (`loop.inspect.demo`, about two
minutes to make, or `--source` any rollouts file or directory), repeated under 40 task ids up to
N. For each N it prints: the report's build time beside plain `json.loads` of the same file
(the ratio is what metrics, packing and HTML cost), the report's size beside the rollouts
file's, and headless Chromium's wall time to the rendered DOM (start included) with the page's
own first-render time; then the same for opening one transcript (`#rollout=K`).

Run: python benchmarks/bench_inspect.py [--sizes 1000 5000] [--source PATH] [--no-browser]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loop.inspect.cli import main as inspect_main
from loop.run.records import find_sources

TASKS = 40


def source_records(source: Path | None, scratch: Path) -> list[str]:
    """Rollout lines to repeat: from `source`, else from a fresh demo run."""
    if source is None:
        from loop.inspect.demo import write_demo_run

        print("making a demo run (scripted rollouts through the sandbox, about 2 min) ...")
        source = write_demo_run(scratch / "demo", tasks=6, k=3, iterations=0)
    lines: list[str] = []
    for found in find_sources(source):
        if found.path.name.endswith(".gz"):
            with gzip.open(found.path, "rt") as stream:
                lines += [line for line in stream if line.strip()]
        else:
            lines += [ln for ln in found.path.read_text().splitlines() if ln.strip()]
    return lines


def write_rollouts(lines: list[str], n: int, path: Path) -> None:
    """N rollouts cycling through `lines`, spread over about TASKS task ids."""
    records = [json.loads(line) for line in lines]
    copies = max(1, TASKS // len({r["task_id"] for r in records}))
    with path.open("w") as sink:
        for i in range(n):
            record = dict(records[i % len(records)])
            record["task_id"] = f"{record['task_id']}_copy{(i // len(records)) % copies}"
            record["sample_index"] = i
            sink.write(json.dumps(record) + "\n")


def chromium(url: str) -> tuple[float, int | None]:
    """(wall seconds to the rendered DOM, the page's data-render-ms)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "no chromium (bash scripts/setup.sh test installs it)"
    with tempfile.TemporaryDirectory() as profile:
        started = time.monotonic()
        done = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             f"--user-data-dir={profile}", "--virtual-time-budget=30000", "--dump-dom", url],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        wall = time.monotonic() - started
    found = re.search(r'data-render-ms="(\d+)"', done.stdout)
    return wall, int(found.group(1)) if found else None


def main() -> None:
    """Measure and print one line per size."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    p.add_argument("--source", type=Path, help="rollouts file or run/eval directory to repeat")
    p.add_argument("--no-browser", action="store_true", help="skip the Chromium timings")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-inspect-") as tmp:
        scratch = Path(tmp)
        lines = source_records(args.source, scratch)
        print(f"{len(lines)} distinct rollouts repeated over {TASKS} task ids")
        for n in args.sizes:
            rollouts, report = scratch / f"r{n}.jsonl", scratch / f"r{n}.html"
            write_rollouts(lines, n, rollouts)
            started = time.monotonic()
            with rollouts.open() as stream:
                for line in stream:
                    json.loads(line)
            parse = time.monotonic() - started
            started = time.monotonic()
            with contextlib.redirect_stdout(io.StringIO()):
                assert (
                    inspect_main([str(rollouts), "--html", str(report), "--tokenizer", "none"]) == 0
                )
            build = time.monotonic() - started
            size, raw = report.stat().st_size / 1e6, rollouts.stat().st_size / 1e6
            print(
                f"N={n}: report built in {build:.1f} s vs json.loads alone {parse:.1f} s "
                f"({build / parse:.1f}x); {size:.1f} MB vs {raw:.1f} MB of rollouts "
                f"({size / raw:.2f}x)"
            )
            if args.no_browser:
                continue
            wall, render = chromium(report.as_uri())
            print(f"  Chromium: page rendered in {wall:.1f} s wall, first render {render} ms")
            wall, render = chromium(report.as_uri() + f"#rollout={n // 2}&tokens")
            print(f"  Chromium: one transcript + token view in {wall:.1f} s wall ({render} ms)")


if __name__ == "__main__":
    main()
