"""evaluate.py end to end, as a user runs it: the real SmolLM2, the real sandbox, real files.

Run: python -m pytest tests/test_evaluate_cli.py       (slow: loads the model, runs rollouts)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def evaluate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "evaluate.py", *args], capture_output=True, text=True, cwd=ROOT,
        timeout=900,
    )  # fmt: skip


@pytest.mark.slow
def test_evaluate_runs_end_to_end_and_writes_rollouts_and_metrics(tmp_path: Path) -> None:
    done = evaluate(
        "--config", str(QUICKSTART), "--split", "dev", "--limit", "2", "--rollouts-per-task", "1",
        f"output_dir={tmp_path}", "agent.max_turns=2", "agent.max_new_tokens=48",
        "eval.sampled_rollouts_per_task=1",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    out = tmp_path / "quickstart" / "eval" / "dev"
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert rollout["status"] in {"ok", "max_turns", "context_exhausted"}, rollout["error"]
        assert rollout["reward"] is not None and rollout["num_output_tokens"] > 0
        assert rollout["tests"] and rollout["turns"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "eval/tgc",
        "eval/sgc",
        "eval/pass@1",
        "eval/reward_mean",
        "eval/difficulty_1/success_rate",
        "eval/api_calls_mean",
        "eval/infra_failures",
    ):
        assert key in metrics, key
    assert metrics["eval/infra_failures"] == 0
    assert "eval/tgc" in done.stdout  # the summary table
    assert (out / "config.yaml").is_file()
    # the sampled pass, in the same run: its own folder, its rollouts at temperature 1
    sampled = tmp_path / "quickstart" / "eval" / "dev@T1"
    assert len((sampled / "rollouts.jsonl").read_text().splitlines()) == 2
    assert json.loads((sampled / "metrics.json").read_text())["eval/infra_failures"] == 0
    assert "eval/sampled/tgc" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split", "validation"], "eval.split: unknown split 'validation'"),
        (["--split", "dev", "--checkpoint", "/no/such/dir"], "checkpoint directory not found"),
        (["--split", "dev", "agent.max_turn=3"], "unknown config key agent.max_turn"),
        (["--split", "dev", "--limit", "0"], "eval.limit: must be > 0"),
    ],
)
def test_bad_input_is_a_one_line_error(args: list[str], message: str) -> None:
    done = evaluate("--config", str(QUICKSTART), *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_malformed_config_file_is_a_one_line_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("agent: [unclosed\n")
    done = evaluate("--config", str(bad), "--split", "dev")
    assert done.returncode == 2 and "not valid YAML" in done.stderr
    assert "Traceback" not in done.stderr
