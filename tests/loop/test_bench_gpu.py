"""benchmarks/bench_gpu.py runs end to end (`--tiny`: its sections on a 2-layer model on the CPU),
so the script a GPU is lent for works before the GPU is spent on it.

Run: python -m pytest tests/loop/test_bench_gpu.py -q        (`slow`: about 4 minutes)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(900)  # as its subprocess: under load it outgrew 300 s (a vLLM server starts)
def test_every_cpu_runnable_section_gives_its_rows(tmp_path: Path) -> None:
    sections = ["env", "sdpa", "learner", "lora", "checkpointing", "peak", "prefix", "logprobs"]
    sections += ["engine", "engine_long"]
    sections += ["parity", "server"]
    sections.append("skipped")
    command = [sys.executable, str(ROOT / "benchmarks/bench_gpu.py"), "--out", str(tmp_path)]
    done = subprocess.run(
        [*command, "--tiny", "--sections", *sections], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert not [r for r in rows if "error" in r]
    by_section: dict[str, list[dict]] = {}
    for row in rows:
        by_section.setdefault(row["section"], []).append(row)
    assert set(by_section) == {*sections, "engine_syncs"}
    learner = by_section["learner"]
    assert len(learner) == 8 and all(r["step_tok_s"] > 0 and r["forward_s"] > 0 for r in learner)
    assert {(r["model"], r["mode"]) for r in learner} == {
        (m, t) for m in ("qwen2.5-0.5b", "qwen2.5-7b") for t in ("lora", "full")
    }
    prefix = by_section["prefix"]
    assert [r["way"] for r in prefix] == ["whole", "shared"] * 2
    assert all(r["step_s"] > 0 and r["recompute_s"] > 0 for r in prefix)
    assert all(r["logprob_gap_max"] < 0.1 for r in prefix if r["way"] == "shared")
    assert all(r["rows_ok"] == r["rows"] for r in by_section["engine"] + by_section["engine_long"])
    lora = by_section["lora"]  # peft's forward against one product: the same step, both timed
    learning = [r for r in lora if r["kind"] == "learning" and "way" in r]
    assert [r["way"] for r in learning] == ["peft", "one product"]
    assert learning[0]["loss"] == pytest.approx(learning[1]["loss"], abs=1e-3)
    assert learning[0]["grad_norm"] == pytest.approx(learning[1]["grad_norm"], rel=1e-2)
    steps = [r for r in lora if r["kind"] == "step"]
    assert len(steps) == 4 and all(r["step_s"] > 0 for r in steps)
    checkpointing = by_section["checkpointing"]  # with and without, and the two norms' ways
    learning = [r for r in checkpointing if r["kind"] == "learning" and "norms" in r]
    assert [r["norms"] for r in learning] == ["transformers", "one kernel"]
    assert learning[0]["loss"] == pytest.approx(learning[1]["loss"], abs=1e-3)
    assert learning[0]["grad_norm"] == pytest.approx(learning[1]["grad_norm"], rel=1e-2)
    steps = [r for r in checkpointing if r["kind"] == "step"]
    assert [(r["gradient_checkpointing"], r.get("norms")) for r in steps] == [
        (True, None), (True, "transformers"), (True, "one kernel"), (False, None)
    ]  # fmt: skip
    assert all(r["step_s"] > 0 for r in steps)
    assert by_section["peak"] == [
        {"section": "peak", "skipped": "the profiler's CUDA memory timeline needs a GPU"}
    ]
    assert all(r["abs_logprob_diff_max"] < 0.1 for r in by_section["parity"])
    server = by_section["server"]
    if importlib.util.find_spec("vllm") is None:
        assert server == [{"section": "server", "skipped": "vLLM is not installed here"}]
    else:  # two versions published the trainer's way, each sampled with the learner's weights
        assert [r["version"] for r in server] == ["smoke-v1", "smoke-v2"], server
        assert all(r["tokens"] > 0 and r["abs_logprob_diff_max"] < 1e-3 for r in server), server
    assert "### learner" in (tmp_path / "table.md").read_text()
    assert any("torchrun" in r["step"] for r in by_section["skipped"])  # said plainly
