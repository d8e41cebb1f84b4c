"""The HTML report in a real browser: headless Chromium renders it, and the test checks what
is on screen (heat map, transcript, token view) from the DOM after the scripts ran and from
the pixels of a screenshot; then a 1,200-rollout report is rendered and timed.

The rollouts are real: scripted solutions of the built-in app world run through the real
episode loop and sandbox (`loop.inspect.demo`), about two minutes on 2 CPUs.
Needs Chromium (`bash scripts/setup.sh test` installs it; LOOP_SKIP_BROWSER_TESTS=1 skips).
Run: python -m pytest tests/inspect/test_report_browser.py -q -s   (-s prints the timings)
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from loop.inspect.cli import main
from loop.inspect.demo import write_demo_run
from tests.inspect.browser import _png_colors, dump_dom, hex_rgb, png_colors, screenshot
from tests.inspect.test_cli import page_index, page_transcript

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dev evaluation and two training iterations of 4 tasks x 3 scripted rollouts."""
    return write_demo_run(tmp_path_factory.mktemp("runs") / "demo", tasks=4, k=3, iterations=2)


@pytest.fixture(scope="module")
def report(demo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("report") / "report.html"
    assert main([str(demo_run), "--html", str(out)]) == 0
    return out


def _failed_rollout(index: dict[str, Any]) -> dict[str, Any]:
    """A rollout with a failed API call and a later successful one (a good transcript)."""
    return next(
        r for r in index["rollouts"]
        if r["bad"] and len(r["seq"]) > len(r["bad"]) + 2 and r["kept"] is not None
    )  # fmt: skip


def test_heat_map_and_transcript_are_rendered(report: Path) -> None:
    page = report.read_text()
    index = page_index(page)
    assert "<|im_end|>" in index["vocab"].values()  # decoded with the run's tokenizer
    chosen = _failed_rollout(index)
    dom, wall = dump_dom(f"{report.as_uri()}#rollout={chosen['id']}&tokens")
    print(f"\nDOM of {len(index['rollouts'])} rollouts in {wall:.1f} s (Chromium start included)")
    assert 'data-ready="1"' in dom
    # the heat map of the task: a cell per call of every rollout drawn, crosses on failures
    same_task = [r for r in index["rollouts"] if r["task"] == chosen["task"]]
    assert dom.count('class="cell"') == sum(len(r["seq"]) for r in same_task)
    assert dom.count('class="outcome"') == len(same_task)
    # the transcript: each turn with its code, the failed call highlighted, the test report
    transcript = page_transcript(page, chosen["id"])
    body = dom[dom.index('class="transcript-body"') :]
    for number, turn in enumerate(transcript["turns"], start=1):
        assert f"Turn {number}" in body
        for kind, text in turn["segs"]:
            if kind == "c":
                assert _escaped(text.strip()) in body
    assert '<tr class="fail">' in body and "execution failed" in body
    assert re.search(r"Tests: \d+ of \d+ passed", body)
    # the token view: every sampled token of every turn, with its log-probs in the tooltip
    tokens = sum(len(turn["tok"]["ids"]) for turn in transcript["turns"])
    assert body.count('class="tok trained"') + body.count('class="tok untrained"') == tokens
    assert "colour: learner" in body  # a training rollout: learner vs sampler log-probs


def test_screenshot_shows_the_heat_map_and_the_transcript(report: Path, tmp_path: Path) -> None:
    index = page_index(report.read_text())
    chosen = _failed_rollout(index)
    shot = tmp_path / "report.png"
    wall = screenshot(f"{report.as_uri()}#rollout={chosen['id']}", shot)
    colors = png_colors(shot)
    print(f"\nscreenshot {shot} in {wall:.1f} s; {len(colors)} colours")
    names = [name for name, _ in index["apis"]]
    drawn = {names[i] for r in index["rollouts"] if r["task"] == chosen["task"] for i in r["seq"]}
    palette = {name: hex_rgb(color) for name, color in index["apis"]}
    visible = [name for name in drawn if colors[palette[name]] >= 40]
    assert len(visible) == len(drawn), f"heat-map colours missing: {set(drawn) - set(visible)}"
    assert colors[hex_rgb("#fdecea")] > 2000  # the failed turn's observation, in the transcript
    assert colors[hex_rgb("#f3f6fa")] > 2000  # code cells


def test_the_png_reader_agrees_with_pillow(report: Path, tmp_path: Path) -> None:
    pytest.importorskip("PIL")
    shot = tmp_path / "small.png"
    screenshot(report.as_uri(), shot, size="320,200")
    assert _png_colors(shot) == png_colors(shot)


def test_a_report_of_1200_rollouts_opens_without_freezing(demo_run: Path, tmp_path: Path) -> None:
    source = demo_run / "eval" / "dev" / "rollouts.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines()]
    big = tmp_path / "big" / "rollouts.jsonl"
    big.parent.mkdir()
    with big.open("w") as sink:
        for i in range(1200):  # 40 tasks x 30 rollouts, cycling through the real ones
            record = dict(records[i % len(records)])
            record["task_id"] = f"{record['task_id']}_copy{i % 10}"
            record["sample_index"] = i // 40
            sink.write(json.dumps(record) + "\n")
    out = tmp_path / "big.html"
    started = time.monotonic()
    assert main([str(big), "--html", str(out), "--tokenizer", "none"]) == 0
    build = time.monotonic() - started
    dom, wall = dump_dom(out.as_uri(), budget_ms=20_000)
    render_ms = int(re.search(r'data-render-ms="(\d+)"', dom).group(1))  # type: ignore[union-attr]
    size = out.stat().st_size / 1e6
    print(
        f"\n1200 rollouts: report built in {build:.1f} s, {size:.1f} MB; Chromium {wall:.1f} s "
        f"wall, first render {render_ms} ms after navigation"
    )
    assert 'data-ready="1"' in dom
    assert "1200 rollouts of " in dom and dom.count('class="card"') == 12  # the first page
    assert wall < 180, f"the page took {wall:.0f} s to open"  # generous: shared 2-core CI


def _escaped(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
