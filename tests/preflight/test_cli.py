"""`python train.py --config X --preflight`: exit 0 and the plan, or exit 2 and one line per
refusal; the traced step stubbed (its own tests: test_trace.py), and one real run.

Run: python -m pytest tests/preflight/test_cli.py      (about 15 s: one real run, traced)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import loop.preflight.report as report
import train
from tests.preflight.test_plan import traced

ROOT = Path(__file__).resolve().parents[2]
CONFIG_7B = str(ROOT / "configs" / "qwen2.5-7b-1gpu.yaml")
SERVER_7B = ["generator.backend=vllm_server", "generator.gpu_memory_utilization=0.35"]


@pytest.fixture
def stub_trace(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    monkeypatch.setattr(report, "run_trace", traced(30.0))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    return [f"output_dir={tmp_path}"]


def test_a_plan_exits_0(stub_trace: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert train.main(["--config", CONFIG_7B, "--preflight", "--gpu", "h200", *stub_trace]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.rstrip().endswith("preflight: nothing refused")
    for section in ("learners:", "hf engine:", "host:", "open files:", "disk:", "timeouts:"):
        assert f"\n{section}\n" in out


def test_a_refusal_exits_2_with_one_line(
    stub_trace: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """The 7B server variant as documented before: max_model_len left at 8192."""
    assert train.main(["--config", CONFIG_7B, "--preflight", *SERVER_7B, *stub_trace]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("train.py: preflight refuses: agent.max_context")
    fixed = [*SERVER_7B, "generator.max_model_len=32768", *stub_trace]
    assert train.main(["--config", CONFIG_7B, "--preflight", *fixed]) == 0


def test_a_bad_config_or_gpu_is_one_line_and_exit_2(
    stub_trace: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert train.main(["--config", CONFIG_7B, "--preflight", "--gpu", "h300", *stub_trace]) == 2
    assert capsys.readouterr().err.startswith("train.py: --gpu 'h300': use one of h100")
    assert train.main(["--config", CONFIG_7B, "--preflight", "agent.temperature=0"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "agent.temperature > 0" in line


def test_the_real_preflight_of_a_tiny_model(tmp_path: Path) -> None:
    """Out of process, traced for real: the quickstart with the tiny shape."""
    done = subprocess.run(
        [sys.executable, "train.py", "--config", "configs/quickstart.yaml",
         "--preflight", "model.name=tiny", f"output_dir={tmp_path}"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "traced peak" in done.stdout and done.stderr == ""
