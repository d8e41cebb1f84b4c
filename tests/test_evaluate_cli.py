"""evaluate.py's bad input: a one-line error, exit status 2, no traceback.

evaluate.py run end to end (the real SmolLM2, the real sandbox, its files, greedy and sampled)
is tests/test_train_cli.py's, which evaluates the checkpoint it trains.

Run: python -m pytest tests/test_evaluate_cli.py
"""

from __future__ import annotations

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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--split", "validation"], "eval.split: unknown split 'validation'"),
        (["--split", "dev", "--checkpoint", "/no/such/dir"], "checkpoint directory not found"),
        (["--split", "dev", "--checkpoint", "configs"], "configs: neither a LoRA adapter"),
        (["--split", "dev", "agent.max_turn=3"], "unknown config key agent.max_turn"),
        (["--split", "dev", "--limit", "0"], "eval.limit: must be > 0"),
        (["--split", "dev", "eval.max_difficulty=0"], "split 'dev' has no task of difficulty <= 0"),
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


def test_checkpoint_means_its_adapter(tmp_path: Path) -> None:
    from loop.config_types import ConfigError
    from loop.model.checkpoint import adapter_dir

    checkpoint = tmp_path / "iter-3"
    (checkpoint / "adapter").mkdir(parents=True)
    (checkpoint / "adapter" / "adapter_config.json").write_text("{}")
    assert adapter_dir(checkpoint) == checkpoint / "adapter"
    assert adapter_dir(checkpoint / "adapter") == checkpoint / "adapter"
    (tmp_path / "full" / "model").mkdir(parents=True)
    with pytest.raises(ConfigError, match="holds full weights"):
        adapter_dir(tmp_path / "full")


@pytest.mark.slow
def test_resume_keeps_an_interrupted_evaluations_rollouts(tmp_path: Path) -> None:
    """The real evaluate.py twice, the first cut short by hand: --resume rolls out the rest
    (the kept line is byte for byte the first run's: its `duration_s` differs in a new one)."""
    common = ["--config", str(QUICKSTART), "--split", "dev", "--limit", "2", "name=e",
              f"output_dir={tmp_path}", "agent.max_turns=1", "agent.max_new_tokens=8",
              "eval.sampled_rollouts_per_task=0"]  # fmt: skip
    assert evaluate(*common).returncode == 0
    rollouts = tmp_path / "e" / "eval" / "dev" / "rollouts.jsonl"
    first = rollouts.read_text().splitlines()
    rollouts.write_text(first[0] + "\n" + first[1][:30])  # killed while writing the second
    (rollouts.parent / "metrics.json").unlink()
    done = evaluate(*common, "--resume")
    assert done.returncode == 0, done.stderr[-2000:]
    again = rollouts.read_text().splitlines()
    assert again[0] == first[0] and len(again) == len(first)
    assert (rollouts.parent / "metrics.json").is_file()
