"""The end-of-run report: first -> last evaluation per split, per scenario, and the picture.

Run: python -m pytest tests/loop/test_report.py
"""

from __future__ import annotations

import json
from pathlib import Path

from loop.run.report import learning_report, scenario_tables
from loop.run.rundir import RunDir


def write_eval(run: RunDir, split: str, iteration: int, solved: dict[str, list[bool]]) -> None:
    """One evaluation's rollouts.jsonl: `solved` maps scenario -> each rollout's success (a
    task per rollout, `<scenario>-<i>`)."""
    folder = run.eval_dir(split, iteration)
    folder.mkdir(parents=True)
    lines = [
        json.dumps({"task_id": f"{scenario}-{i}", "scenario_id": scenario, "success": ok})
        for scenario, outcomes in solved.items()
        for i, ok in enumerate(outcomes)
    ]
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n")


def test_both_passes_are_compared_and_a_scenario_that_fell_beyond_noise_is_marked(
    tmp_path: Path,
) -> None:
    run = RunDir(tmp_path / "run")

    # greedy: counting rises a lot, writing stays; sampled: counting rises, writing collapses
    def outcomes(solved: int, of: int = 12) -> list[bool]:
        return [True] * solved + [False] * (of - solved)

    write_eval(run, "heldout", 0, {"count": outcomes(0), "write": outcomes(6)})
    write_eval(run, "heldout", 4, {"count": outcomes(10), "write": outcomes(6)})
    write_eval(run, "heldout@T1", 0, {"count": outcomes(0), "write": outcomes(10)})
    write_eval(run, "heldout@T1", 4, {"count": outcomes(8), "write": outcomes(2)})

    tables = scenario_tables(run.path)
    assert set(tables) == {"heldout", "heldout@T1"}
    count, write = tables["heldout@T1"]
    assert count.startswith("count") and "0/12" in count and "8/12" in count
    assert "FELL" not in count  # a rise is never marked
    assert write.startswith("write") and "10/12" in write and "2/12" in write
    assert write.endswith("FELL")  # 2/12 lies below the first interval [0.55, 0.95]
    assert not any("FELL" in row for row in tables["heldout"])  # 6/12 -> 6/12

    for iteration, kept in enumerate([0, 5, 0, 3]):  # iterations 1 and 3 learned nothing
        run.append_metrics({"iteration": iteration, "rollout/count": 8, "rollout/kept": kept})
    report = learning_report(run.path)
    assert "heldout: 0.250" in report and "heldout@T1: 0.417" in report  # both passes
    assert "nothing kept in 2 of 4 iterations" in report and report.endswith(
        "iterations 1, 3\n  learning curve: " + str(run.learning_curve)
    )
    assert "per scenario, heldout@T1" in report and report.count("FELL") == 1
    assert run.learning_curve.is_file()


def test_one_evaluation_or_one_scenario_makes_no_table(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run")
    write_eval(run, "once", 0, {"a": [True], "b": [False]})
    write_eval(run, "single", 0, {"a": [False, False]})
    write_eval(run, "single", 2, {"a": [True, True]})
    assert scenario_tables(run.path) == {}
