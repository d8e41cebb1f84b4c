"""What a run changed: before -> after on its evaluation splits, and the learning curve.

`learning_report(run_dir)` compares, for every split evaluated during training, the first
evaluation (`eval/<split>/iter-0/`, the policy RL started from, after any warm start) with the
last one (`iter-N/`, the trained policy): success over rollouts with 95% Wilson intervals and
one-sided p-values that the rate rose (Fisher's exact test over rollouts, and a paired bootstrap
over tasks, which does not treat a task's K rollouts as independent). It also writes
`learning_curve.png` into the run directory (the inspector's report shows it), and per
scenario the same first -> last counts, marking a scenario whose rate fell below its first
interval (`scenario_tables`). A sampled pass (`eval.sampled_rollouts_per_task`) is a split of
its own, `<split>@T<t>`, in both:

- top: the training rollouts' mean reward and success rate per iteration, the share of
  rollouts kept by the |A| filter (the ones LOOP learned from), and, in a run that collects
  ahead (`train.overlap.max_staleness`), the share of groups sampled by an older policy version, and
  with inference servers the share of each iteration they sat idle;
- bottom: evaluation success per split at each evaluation, with its 95% interval.

    python -m loop.run.report runs/quickstart        # print the comparison, redraw the picture
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from loop.run.rundir import RunDir
from loop.run.significance import Comparison, compare, wilson_interval


def eval_points(run_dir: Path, by: str = "task_id") -> dict[str, dict[int, dict[str, list[bool]]]]:
    """split -> iteration -> task id (or another record field, `by`: "scenario_id") -> its
    rollouts' successes, for every in-training evaluation under
    `run_dir/eval/<split>/iter-N/rollouts.jsonl` (a sampled pass is the split `<split>@T<t>`)."""
    points: dict[str, dict[int, dict[str, list[bool]]]] = defaultdict(dict)
    for path in RunDir(run_dir).eval_rollout_files():
        iteration = int(path.parent.name.removeprefix("iter-"))
        outcomes: dict[str, list[bool]] = defaultdict(list)
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            outcomes[str(record[by])].append(bool(record.get("success")))
        if outcomes:
            points[path.parent.parent.name][iteration] = dict(outcomes)
    return dict(points)


def compare_first_last(run_dir: Path) -> dict[str, Comparison]:
    """Per split with at least two evaluations: the first against the last."""
    result = {}
    for split, by_iteration in eval_points(run_dir).items():
        if len(by_iteration) >= 2:
            first, last = min(by_iteration), max(by_iteration)
            result[split] = compare(by_iteration[first], by_iteration[last])
    return result


def scenario_tables(run_dir: Path) -> dict[str, list[str]]:
    """Per split with at least two evaluations and more than one scenario: a line per scenario,
    first -> last evaluation with Wilson intervals, marked where the last rate falls below the
    first's interval (a regression beyond noise, which the split's overall rise can hide)."""
    tables = {}
    for split, by_iteration in eval_points(run_dir, by="scenario_id").items():
        first, last = by_iteration[min(by_iteration)], by_iteration[max(by_iteration)]
        scenarios = sorted(set(first) | set(last))
        if len(by_iteration) < 2 or len(scenarios) < 2:
            continue
        width = max(map(len, scenarios))
        rows, ends = [], (first, last)
        for scenario in scenarios:
            (b_s, b_n), (a_s, a_n) = (_count({scenario: e.get(scenario, [])}) for e in ends)
            b_lo, b_hi = wilson_interval(b_s, b_n)
            a_lo, a_hi = wilson_interval(a_s, a_n)
            fell = b_n and a_n and a_s / a_n < b_lo
            rows.append(
                f"{scenario:<{width}}  {b_s:>3}/{b_n:<3} [{b_lo:.2f}, {b_hi:.2f}] -> "
                f"{a_s:>3}/{a_n:<3} [{a_lo:.2f}, {a_hi:.2f}]" + ("  FELL" if fell else "")
            )
        tables[split] = rows
    return tables


def learning_report(run_dir: Path) -> str:
    """The before -> after lines, the wall time per stage, and the picture's path."""
    lines = [f"{run_dir}: what training changed (first -> last evaluation, one-sided tests)"]
    comparisons = compare_first_last(run_dir)
    lines += [f"  {result.line(split)}" for split, result in comparisons.items()]
    if not comparisons:
        lines.append("  (fewer than two evaluations of any split: nothing to compare)")
    for split, table in scenario_tables(run_dir).items():
        lines.append(f"  per scenario, {split} (first -> last, successes/rollouts [95% interval]):")
        lines += [f"    {row}" for row in table]
    records = _metrics(run_dir)
    stages = _stage_times(records)
    if stages:
        lines.append(
            "  wall time: " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in stages.items())
        )
    trained = [r for r in records if r.get("rollout/count")]
    if idle := [r["iteration"] + 1 for r in trained if not r.get("rollout/kept")]:
        lines.append(
            f"  nothing kept in {len(idle)} of {len(trained)} iterations (no rollout's advantage "
            f"passed the filter): iterations {', '.join(map(str, idle))}"
        )
    picture = plot_learning_curve(run_dir, records)
    if picture is not None:
        lines.append(f"  learning curve: {picture}")
    return "\n".join(lines)


def plot_learning_curve(run_dir: Path, records: list[dict[str, Any]] | None = None) -> Path | None:
    """Draw `learning_curve.png` (see the module docstring); None when there is nothing to draw."""
    records = _metrics(run_dir) if records is None else records
    train = [r for r in records if r.get("rollout/count")]
    points = eval_points(run_dir)
    if not train and not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 6.5), sharex=True)
    x = [r["iteration"] for r in train]
    for key, label in (
        ("rollout/reward_mean", "train reward"),
        ("rollout/success_rate", "train success"),
    ):
        top.plot(x, [_num(r.get(key)) for r in train], marker="o", label=label)
    kept = [_num(r.get("rollout/kept")) / _num(r.get("rollout/count")) for r in train]
    top.plot(x, kept, linestyle="--", color="grey", label="kept by |A| filter")
    stale = [_stale_share(r) for r in train]
    if any(share > 0 for share in stale):
        top.plot(x, stale, linestyle=":", color="tab:red", label="groups from an older version")
    idle = [_num(r.get("time/server_idle_share")) for r in train]
    if any(not math.isnan(share) for share in idle):
        top.plot(x, idle, linestyle="-.", color="tab:purple", label="servers idle (share)")
    top.set_ylim(-0.03, 1.03)
    top.set_ylabel("training rollouts")
    top.legend(loc="best", fontsize=8)
    top.grid(alpha=0.3)
    for split, by_iteration in sorted(points.items()):
        its = sorted(by_iteration)
        counts = [_count(by_iteration[i]) for i in its]
        rates = [s / n if n else math.nan for s, n in counts]
        bands = [wilson_interval(s, n) for s, n in counts]
        errors = [
            [r - lo for r, (lo, _) in zip(rates, bands, strict=False)],
            [hi - r for r, (_, hi) in zip(rates, bands, strict=False)],
        ]
        n_text = f"{counts[0][1]} rollouts" if counts else ""
        bottom.errorbar(its, rates, yerr=errors, marker="s", capsize=4, label=f"{split} ({n_text})")
    bottom.set_ylim(-0.03, 1.03)
    bottom.set_xlabel("iteration (evaluations run before it; the last after the last iteration)")
    bottom.set_ylabel("evaluation success (95% CI)")
    if points:
        bottom.legend(loc="best", fontsize=8)
    bottom.grid(alpha=0.3)
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))  # iterations are whole
    fig.suptitle(f"{run_dir.name}: learning curve")
    fig.tight_layout()
    path = RunDir(run_dir).learning_curve
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _stale_share(record: dict[str, Any]) -> float:
    """The share of an iteration's groups that sampled an older version (`stale/groups_lag_n`,
    n >= 1; dropped ones included); 0 in runs that record no lags."""
    lags = {k: _num(v) for k, v in record.items() if k.startswith("stale/groups_lag_")}
    total = sum(lags.values())
    return (total - lags.get("stale/groups_lag_0", 0.0)) / total if total else 0.0


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return RunDir(run_dir).read_metrics()


def _stage_times(records: list[dict[str, Any]]) -> dict[str, float]:
    totals: dict[str, float] = {}
    for key, name in (
        ("time/warm_start_s", "warm start"),
        ("time/eval_s", "evaluation"),
        ("time/rollout_s", "rollouts"),
        ("time/learn_s", "learning"),
        ("time/sync_s", "weight sync"),
    ):
        values = [_num(r.get(key)) for r in records if r.get(key) is not None]
        if values:
            totals[name] = sum(values)
    return totals


def _count(outcomes: dict[str, list[bool]]) -> tuple[int, int]:
    return sum(sum(v) for v in outcomes.values()), sum(len(v) for v in outcomes.values())


def _num(value: Any) -> float:
    return math.nan if value is None else float(value)


def main(argv: list[str] | None = None) -> int:
    """`python -m loop.run.report RUN_DIR`."""
    parser = argparse.ArgumentParser(
        prog="python -m loop.run.report", description=__doc__.split("\n")[0]
    )
    parser.add_argument("run_dir", type=Path, help="a training run directory (runs/<name>)")
    args = parser.parse_args(argv)
    run = RunDir(args.run_dir)
    if not run.eval_root.is_dir() and not run.metrics.is_file():
        print(f"loop.run.report: {args.run_dir} is not a training run directory", file=sys.stderr)
        return 2
    print(learning_report(args.run_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
