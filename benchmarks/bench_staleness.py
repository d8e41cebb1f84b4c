"""Collecting ahead, measured: `train.overlap.max_staleness` 0 against 1, back to back in one run.

Run: python benchmarks/bench_staleness.py [--iterations 2] [--eval-limit 12] [--out DIR]
     (about an hour on 2 cores with the defaults, 80 minutes with `--eval-limit 0`, all 36
     held-out tasks; `--runs 1` runs S = 1 alone, the table keeps an earlier S = 0 from the
     same --out)

Each run is `train.py --config configs/quickstart-servers.yaml` (one vLLM CPU server the trainer
starts, bound to core 0; one learner process with one torch thread), the same cached warm start,
the same seed and tasks, the decoupled correction on (`train.off_policy.correction=truncate`), the
mismatch split at the weights each group sampled (`train.off_policy.split_mismatch`), and a greedy
evaluation of the first `--eval-limit` held-out tasks (0: all of them) before iteration 0 and
after the last. Printed at the end, from the runs' own metrics.jsonl and evaluation folders:
per iteration the rollout, learner-wait, learn, split and publish seconds, the iteration's wall
time, the server's idle share and the two parts of the mismatch; the whole command's wall
time; and held-out success before -> after for each S, with 95% intervals and one-sided
p-values (loop/run/significance.py), overall and per scenario, plus S = 1's last evaluation
against S = 0's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loop.run.report import compare_first_last, eval_points, scenario_tables  # noqa: E402
from loop.run.significance import compare  # noqa: E402

COLUMNS = (
    ("time/rollout_s", "rollout"),
    ("time/wait_rollouts_s", "learner waited"),
    ("time/learn_s", "learn"),
    ("time/split_mismatch_s", "split (pi_v)"),
    ("time/sync_s", "publish"),
    ("time/iteration_s", "iteration"),
    ("time/server_idle_share", "server idle share"),
    ("mismatch/engine_k3", "engine k3"),
    ("mismatch/staleness_k3", "staleness k3"),
)


def run(out: Path, staleness: int, iterations: int, eval_limit: int) -> tuple[float, int]:
    """One training run; returns its wall time (the server's start included) and exit code."""
    command = [
        sys.executable, "train.py", "--config", "configs/quickstart-servers.yaml",
        f"output_dir={out}", f"name=s{staleness}", f"train.overlap.max_staleness={staleness}",
        "train.off_policy.correction=truncate", "train.off_policy.split_mismatch=true",
        f"train.iterations={iterations}",
        f"train.eval_every={iterations}", f"eval.limit={eval_limit or 'null'}",
        "generator.devices=[0]", "model.torch_threads=1", "train.tensorboard=false",
    ]  # fmt: skip
    shutil.rmtree(out / f"s{staleness}", ignore_errors=True)  # a run left there would resume
    started = time.monotonic()
    with (out / f"s{staleness}.log").open("w") as log:
        done = subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    print(f"S={staleness}: exit {done.returncode} in {wall:.0f} s (log {out}/s{staleness}.log)")
    return wall, done.returncode


def cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}" if abs(value) >= 10 else f"{value:.3g}"


def table(out: Path, walls: dict[int, tuple[float, int]], iterations: int) -> str:
    lines = ["| S | iteration | " + " | ".join(name for _, name in COLUMNS) + " |"]
    lines.append("|---" * (len(COLUMNS) + 2) + "|")
    for staleness in walls:
        path = out / f"s{staleness}" / "metrics.jsonl"
        records = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        for record in records:
            if "rollout/count" not in record:
                continue
            cells = [cell(record.get(k)) for k, _ in COLUMNS]
            lines.append(f"| {staleness} | {record['iteration']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"S={s}: whole command {t:.0f} s, exit {code}" for s, (t, code) in walls.items()]
    last = {}
    for staleness in walls:
        for split, result in compare_first_last(out / f"s{staleness}").items():
            lines.append(f"S={staleness} held out, first -> last: {result.line(split)}")
        for split, rows in scenario_tables(out / f"s{staleness}").items():
            lines += [f"S={staleness} {split} by scenario, first -> last:", *rows]
        for by_iteration in eval_points(out / f"s{staleness}").values():
            if iterations in by_iteration:  # the run got to its final evaluation
                last[staleness] = by_iteration[iterations]
    if len(last) == 2:
        lines.append(f"last evaluation, S=0 -> S=1: {compare(last[0], last[1]).line('held out')}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument(
        "--eval-limit", type=int, default=12, help="held-out tasks evaluated (0: all)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench-staleness")
    parser.add_argument(
        "--runs", type=int, nargs="+", default=[0, 1],
        help="which S to run now; the table also shows runs kept in --out from before",
    )  # fmt: skip
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    kept = args.out / "walls.json"
    walls: dict[int, tuple[float, int]] = {}
    if kept.exists():
        walls = {int(k): (float(v[0]), int(v[1])) for k, v in json.loads(kept.read_text()).items()}
    for staleness in args.runs:
        walls[staleness] = run(args.out, staleness, args.iterations, args.eval_limit)
        kept.write_text(json.dumps(walls))
    walls = dict(sorted(walls.items()))
    text = table(args.out, walls, args.iterations)
    (args.out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
