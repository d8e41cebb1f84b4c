"""benchmarks/compare_methods.py's bookkeeping: rows' overrides, held-out counts with Wilson
intervals, results appended per row x seed, a rerun skipping finished rows, `--max-minutes`,
and the summary and picture, with a fake row runner in place of train.py.

Run: python -m pytest tests/loop/test_compare_methods.py -q        (seconds)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location(
    "compare_methods", ROOT / "benchmarks/compare_methods.py"
)
assert SPEC and SPEC.loader
compare = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(compare)


def _write_eval(run_dir: Path, split: str, iteration: int, successes: list[bool]) -> None:
    folder = run_dir / "eval" / split / f"iter-{iteration}"
    folder.mkdir(parents=True)
    lines = [json.dumps({"task_id": f"t{i}", "success": s}) for i, s in enumerate(successes)]
    (folder / "rollouts.jsonl").write_text("\n".join(lines) + "\n")


class FakeRunner:
    """Writes a run directory as the trainer would (metrics, two evaluations) and counts calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def __call__(self, row: str, seed: int, iterations: int | None, out: Path) -> dict[str, Any]:
        self.calls.append((row, seed))
        run_dir = out / compare.run_name(row, seed)
        run_dir.mkdir(parents=True)
        records = [{"warm_start/cached": 1.0}] + [
            {"rollout/reward_mean": 0.1 * i, "rollout/success_rate": 0.0} for i in range(2)
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        _write_eval(run_dir, "easy_heldout", 0, [True, False, False, False])
        _write_eval(run_dir, "easy_heldout", 2, [True, True, True, False])
        _write_eval(run_dir, "easy_heldout@T1", 0, [False] * 8)
        _write_eval(run_dir, "easy_heldout@T1", 2, [True] * 2 + [False] * 6)
        return {"wall_s": 1.0, "peak_rss_mib": 100.0}


def test_results_resume_summary_and_picture(tmp_path: Path) -> None:
    fake = FakeRunner()
    argv = ["--out", str(tmp_path), "--rows", "loop-token", "grpo", "verlog", "--plot"]
    assert compare.main(argv, runner=fake) == 0
    lines = [json.loads(x) for x in (tmp_path / compare.RESULTS).read_text().splitlines()]
    assert [(x["row"], x["seed"]) for x in lines] == [("loop-token", 0), ("grpo", 0), ("verlog", 0)]
    first = lines[0]
    assert first["greedy_before"]["successes"] == 1 and first["greedy_after"]["successes"] == 3
    assert first["sampled_after"]["n"] == 8 and first["warm_start_cached"] is True
    assert first["greedy_after"]["low"] == pytest.approx(compare.wilson_interval(3, 4)[0])
    assert first["paper_test_n_tgc"] == 71.3 and lines[2]["paper_test_n_tgc"] is None
    assert first["reward_last"] == pytest.approx(0.1) and first["peak_rss_mib"] == 100.0
    assert (tmp_path / compare.PLOT).stat().st_size > 0
    assert "not in Table 1" in (tmp_path / "summary.md").read_text()

    assert compare.main([*argv, "--seeds", "0", "1"], runner=fake) == 0  # seed 0 done: skipped
    assert fake.calls[3:] == [("loop-token", 1), ("grpo", 1), ("verlog", 1)]
    assert len((tmp_path / compare.RESULTS).read_text().splitlines()) == 6


def test_a_results_file_elsewhere_is_read_and_appended(tmp_path: Path) -> None:
    """Rows measured on another machine (lines kept in the repository) are done here too."""
    kept = tmp_path / "kept.jsonl"
    fake = FakeRunner()
    first = ["--out", str(tmp_path / "a"), "--results", str(kept), "--rows", "rloo"]
    assert compare.main(first, runner=fake) == 0
    second = ["--out", str(tmp_path / "b"), "--results", str(kept), "--rows", "rloo", "grpo"]
    assert compare.main(second, runner=fake) == 0
    assert fake.calls == [("rloo", 0), ("grpo", 0)]  # rloo's line was in the file: skipped
    assert [json.loads(x)["row"] for x in kept.read_text().splitlines()] == ["rloo", "grpo"]
    assert not (tmp_path / "b" / compare.RESULTS).exists()
    assert "| rloo |" in (tmp_path / "b" / "summary.md").read_text()


def test_max_minutes_starts_no_row_once_spent(tmp_path: Path, capsys: Any) -> None:
    fake = FakeRunner()
    argv = ["--out", str(tmp_path), "--rows", "rloo", "grpo", "--max-minutes", "0"]
    assert compare.main(argv, runner=fake) == 0
    assert fake.calls == [("rloo", 0)]  # the budget is looked at before each row
    assert (
        "not started (--max-minutes spent; rerun to go on): grpo-seed0" in capsys.readouterr().out
    )


def test_rows_keep_their_method_and_take_the_scale() -> None:
    assert compare.row_overrides("sft-gt") == [
        "warm_start.source=gold", "warm_start.style=paper", "train.iterations=0",
        "train.replay.coef=0",
    ]  # fmt: skip
    assert "critic.warmup_iterations=1" in compare.row_overrides("ppo-critic")
    assert not any(a.startswith("train.lr=") for a in compare.row_overrides("dmpo"))
    assert "train.iterations=5" not in compare.quickstart_command("sft-gt", 0, 5, Path("/x"))
    command = compare.quickstart_command("dpo-mcts", 0, None, Path("/x"))
    search = [a for a in command if a.startswith("train.preference=")]
    assert json.loads(search[0].split("=", 1)[1])["search_iterations"] == 4  # the quickstart's K
    kl = [a for a in compare.quickstart_command("grpo", 0, None, Path("/x")) if "train.kl=" in a]
    assert json.loads(kl[0].split("=", 1)[1]) == {"coef": 0.04, "reference": "start"}
    assert "reference" not in " ".join(compare.row_overrides("grpo"))  # the config's: the base
    assert set(compare.PAPER_TEST_N_TGC) == set(compare.ROWS)
    assert compare.paper_ranks(["loop-token", "sft-gt", "verlog"]) == {"loop-token": 1, "sft-gt": 2}


@pytest.mark.parametrize("row", list(compare.ROWS))
def test_every_rows_command_passes_the_config_checks(row: str) -> None:
    """What train.py checks before it starts: no row is refused after the driver began it."""
    from loop.checks import check_run
    from loop.config import load_config

    command = compare.quickstart_command(row, 0, 4, Path("/x"))
    config = load_config(compare.QUICKSTART, [a for a in command[3:] if "=" in a])
    check_run(config, world_size=1, local_world_size=1)


def test_a_stop_is_one_line_and_resumable(tmp_path: Path, capsys: Any) -> None:
    def stopped(row: str, seed: int, iterations: int | None, out: Path) -> dict[str, Any]:
        compare._stop(15, None)  # what SIGTERM does during a row
        raise AssertionError("unreachable")

    assert compare.main(["--out", str(tmp_path), "--rows", "rloo"], runner=stopped) == 130
    err = capsys.readouterr().err
    assert err.strip() == "compare_methods: stopped (signal 15); rerun to resume"
    assert not (tmp_path / compare.RESULTS).exists()  # nothing half-written


def test_a_row_records_the_commit_it_ran() -> None:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    commit = compare.checkout_commit()
    if done.returncode != 0:  # not a git checkout (an exported tree): nothing to record
        assert commit is None
        return
    assert commit is not None and len(commit.rstrip("+")) >= 7
    assert done.stdout.strip().startswith(commit.rstrip("+"))
