"""`python -m loop.inspect`: tables, comparisons, filters, JSON and HTML output, one-line errors.

Run: python -m pytest tests/inspect/test_cli.py -q
"""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loop.inspect.cli import main
from loop.inspect.picture import RATIO_CEILING, RATIO_FLOOR, on_axis
from tests.inspect.builders import rollout_a, rollout_b, write_jsonl
from tests.inspect.test_load import make_run


@pytest.fixture
def eval_dir(tmp_path: Path) -> Path:
    """runs/before/eval/dev with rollouts A and B of t_1 (their metrics: test_metrics.py)."""
    folder = tmp_path / "before" / "eval" / "dev"
    write_jsonl(folder / "rollouts.jsonl", [rollout_a().to_json(), rollout_b().to_json()])
    (folder / "config.yaml").write_text("eval:\n  split: dev\nmodel:\n  name: none\n")
    return folder


def page_index(html: str) -> dict[str, Any]:
    """The JSON index embedded in a report."""
    found = re.search(r'<script id="index" type="application/json">(.*?)</script>', html, re.S)
    assert found, "no index in the report"
    return json.loads(found.group(1))


def page_transcript(html: str, rollout_id: int) -> dict[str, Any]:
    """A rollout's transcript as the page stores it (gzip + base64)."""
    pattern = rf'<script id="t-{rollout_id}" type="application/gzip-base64">(.*?)</script>'
    found = re.search(pattern, html, re.S)
    assert found, f"no transcript {rollout_id}"
    return json.loads(gzip.decompress(base64.b64decode(found.group(1))))


def row(out: str, label: str) -> list[str]:
    """The cells after a row label in a printed table."""
    line = next(ln for ln in out.splitlines() if ln.startswith(label + "  "))
    return line[len(label) :].split()


def test_summary_table(eval_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(eval_dir)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("before/dev: 2 rollouts of 1 task from")
    assert row(out, "give-up rate (failed calls)") == ["0.667"]  # (3 - 1) / 3
    assert row(out, "multi-cell turns / turn") == ["0.143"]  # 1 / 7
    assert row(out, "'assume' / rollout") == ["2.00"]


def test_compare_prints_ratios(
    eval_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    after = write_jsonl(tmp_path / "after.jsonl", [rollout_a().to_json()])
    assert main([str(eval_dir), "--compare", str(after)]) == 0
    out = capsys.readouterr().out
    report = tmp_path / "compare.html"
    assert main([str(eval_dir), "--compare", str(after), "--html", str(report)]) == 0
    assert "<td>2.00x to 2.00x</td>" in report.read_text()  # 'dummy', as in the terminal
    # after / before, its interval over tasks (one task: one value), the paper's factor (none
    # for turns) and whether they agree
    assert "95% interval" in out
    assert row(out, "turns / rollout") == ["3.50", "3.00", "0.86x", "[0.86x,", "0.86x]", "-", "-"]
    assert row(out, "give-up rate (failed calls)") == [
        "0.667", "0.000", "0.00x", "[0.00x,", "0.00x]", "0.33x", "as", "paper",
    ]  # fmt: skip
    assert row(out, "'dummy' / rollout") == [
        "1.00", "2.00", "2.00x", "[2.00x,", "2.00x]", "0.17x", "against",
    ]  # fmt: skip
    picture = tmp_path / "compare.png"  # a 0x change (give-up) is drawn at the axis' end
    assert main([str(eval_dir), "--compare", str(after), "--plot", str(picture)]) == 0
    assert f"picture in {picture}" in capsys.readouterr().out
    assert picture.read_bytes().startswith(b"\x89PNG\r\n")
    assert (on_axis(0.0), on_axis(math.inf), on_axis(0.86)) == (RATIO_FLOOR, RATIO_CEILING, 0.86)


def test_task_filter_and_per_rollout_lines(
    eval_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(eval_dir), "--task", "t"]) == 0  # a scenario id selects its variants
    out = capsys.readouterr().out
    assert "t_1#0 dev" in out and "t_1#1 dev" in out
    assert "show_api_doc login login search_contacts" in out  # rollout A's calls in order
    assert main([str(eval_dir), "--task", "t_2"]) == 2
    assert capsys.readouterr().err.strip().endswith("no rollouts of task 't_2'; did you mean t_1?")


def test_errors_are_one_line(
    eval_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cases = [
        [str(tmp_path / "missing")],
        [str(eval_dir), "--html", str(tmp_path / "no" / "such" / "dir" / "r.html")],
        [str(eval_dir), "--split", "test_normal"],
        [str(eval_dir), "--iteration", "3"],
        [str(eval_dir), "--plot", str(tmp_path / "alone.png")],  # nothing to compare
    ]
    for argv in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("loop.inspect: error: ") and err.count("\n") == 1, err


def test_run_directory_iterations_and_self_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = make_run(tmp_path)
    assert main([str(run)]) == 0
    out = capsys.readouterr().out
    assert "demo: 4 rollouts of 1 task" in out
    assert [ln.split()[:3] for ln in out.splitlines() if ln.startswith(("iter ", "eval "))] == [
        ["eval", "dev", "1"], ["iter", "0", "train"], ["iter", "1", "dev"], ["iter", "1", "train"],
    ]  # fmt: skip
    argv = [str(run), "--iteration", "0", "--compare", str(run), "--compare-iteration", "last"]
    assert main(argv) == 0
    assert "demo (0): 1 rollout of 1 task" in capsys.readouterr().out


def test_json_and_html_outputs(
    eval_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report, metrics = tmp_path / "r.html", tmp_path / "m.json"
    assert main([str(eval_dir), "--html", str(report), "--json", str(metrics)]) == 0
    data = json.loads(metrics.read_text())["runs"][0]
    assert data["overview"]["all"]["rollouts"] == 2
    assert data["per_task"]["t_1"]["give_up_rate"] == pytest.approx(2 / 3)
    page = report.read_text()
    assert "<script src" not in page and "http://" not in page.replace("http://www.w3.org", "")
    index = page_index(page)
    assert [r["task"] for r in index["rollouts"]] == ["t_1", "t_1"]
    names = [name for name, _ in index["apis"]]
    first = index["rollouts"][0]
    assert [names[i] for i in first["seq"]] == [
        "api_docs.show_api_doc", "phone.login", "phone.login", "phone.search_contacts"
    ]  # fmt: skip
    assert first["bad"] == [1]  # the dummy login
    transcript = page_transcript(page, 0)
    assert transcript["turns"][1]["failed"] and transcript["turns"][1]["segs"][0] == [
        "t", "A dummy password."
    ]  # fmt: skip
    assert transcript["turns"][1]["calls"][0]["error"].startswith("401")
    assert "report in" in capsys.readouterr().out


def test_a_script_tag_in_agent_text_cannot_break_the_page(tmp_path: Path) -> None:
    traj = rollout_a()
    traj.turns[0].text = "</script><script>alert(1)</script>"
    path = write_jsonl(tmp_path / "x.jsonl", [traj.to_json()])
    report = tmp_path / "r.html"
    assert main([str(path), "--html", str(report)]) == 0
    page = report.read_text()
    assert "alert(1)" not in page.split('<script id="index"')[0]
    assert page.count("</script>") == page.count("<script")
    assert page_transcript(page, 0)["turns"][0]["segs"] == [["t", traj.turns[0].text]]


def test_module_entry_point(eval_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "loop.inspect", str(eval_dir), "--per-task"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "distinct call sequences / task" in done.stdout


def test_token_view_data(tmp_path: Path) -> None:
    traj = rollout_a()
    traj.append([1, 2], output=False)  # prompt
    traj.append([3, 4, 5], output=True, logprobs=[-0.1, -0.2, -0.3])  # turn 1's sampled ids
    traj.turns[0].output_start, traj.turns[0].output_end = 2, 5
    record = traj.to_json() | {
        "split": "train", "iteration": 0, "advantage": 0.0, "kept": False,
        "learner_logprobs": [None, None, -0.1, -0.25, -0.3],
    }  # fmt: skip
    path = write_jsonl(tmp_path / "r.jsonl", [record])
    out = tmp_path / "r.html"
    assert main([str(path), "--html", str(out), "--tokenizer", "none"]) == 0
    page = out.read_text()
    token_view = page_transcript(page, 0)["turns"][0]["tok"]
    # dropped by the |A| filter: no token was trained, so every mask bit is 0
    assert token_view == {"ids": [3, 4, 5], "lp": [-0.1, -0.2, -0.3],
                          "ll": [-0.1, -0.25, -0.3], "mask": "000"}  # fmt: skip
    index = page_index(page)
    assert index["rollouts"][0]["kept"] is False and index["rollouts"][0]["tok"]
    assert "token ids are shown as numbers" in index["tokenNote"]
    assert main([str(path), "--html", str(out), "--token-budget", "2"]) == 0
    page = out.read_text()
    assert "tok" not in page_transcript(page, 0)["turns"][0]
    assert "budget of 2 output tokens" in page_index(page)["tokenNote"]
