"""The report's static part: summary tables, before/after charts, per-iteration and per-task
tables, and the metric definitions (plain HTML, no script needed to read it)."""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path

from loop.inspect.metrics import INTERVAL_LEVEL, METRICS, MetricSpec, ratio
from loop.inspect.summary import (
    Aggregate,
    Run,
    by_iteration,
    by_task,
    change_intervals_of,
    iterations,
    overview,
)
from loop.inspect.terminal import change_cells, format_ratio, format_value, plural, short_name
from loop.run.rundir import RunDir

BEFORE, AFTER = "#9aa5b1", "#2f6fdf"


def summary_html(runs: Sequence[Run]) -> str:
    """Everything above the task cards."""
    parts = [_sources(runs), *learning_curves(runs)]
    if len(runs) == 2:
        before, after = (overview(run.rows)[0][1] for run in runs)
        labels = (runs[0].label, runs[1].label)
        parts += [
            "<h2>Before / after</h2>",
            compare_table(labels, before, after, change_intervals_of(runs[0].rows, runs[1].rows)),
            compare_charts(labels, before, after),
        ]
    for run in runs:
        prefix = f"{html.escape(run.label)}: " if len(runs) > 1 else ""
        columns = overview(run.rows)
        if len(runs) == 1 or len(columns) > 1:  # a lone "all" column repeats the comparison
            parts += [f"<h2>{prefix}behaviour metrics</h2>", metrics_table(columns)]
        if len(iterations(run.rows)) > 1:
            parts += [
                f"<h2>{prefix}per iteration</h2>",
                groups_table(by_iteration(run.rows), "iteration"),
            ]
        parts += [
            f"<details class='tasks'><summary>{prefix}per task ({len(by_task(run.rows))})"
            "</summary>",
            groups_table(by_task(run.rows), "task", link=True),
            "</details>",
        ]
    parts.append(definitions())
    return "\n".join(parts)


def learning_curves(runs: Sequence[Run]) -> list[str]:
    """The `learning_curve.png` of each run directory that has one, inline (loop/run/report.py)."""
    parts = []
    for run in runs:
        picture = RunDir(Path(run.path)).learning_curve
        if picture.is_file():
            data = base64.b64encode(picture.read_bytes()).decode()
            parts += [
                f"<h2>{html.escape(run.label)}: learning curve</h2>",
                f"<img class='curve' alt='learning curve of {html.escape(run.path)}' "
                f"src='data:image/png;base64,{data}'>",
            ]
    return parts


def _sources(runs: Sequence[Run]) -> str:
    items = []
    for run in runs:
        tasks = len({row.task_id for row in run.rows})
        splits = ", ".join(sorted({row.split for row in run.rows}))
        items.append(
            f"<li><b>{html.escape(run.label)}</b>: {plural(len(run.rows), 'rollout')} of "
            f"{plural(tasks, 'task')} "
            f"(split {html.escape(splits)}) from <code>{html.escape(run.path)}</code></li>"
        )
    return f"<ul class='sources'>{''.join(items)}</ul>"


def _cell(spec: MetricSpec, value: float | None) -> str:
    return f"<td>{format_value(value, spec.kind)}</td>"


def _label(spec: MetricSpec) -> str:
    return f"<th title='{html.escape(spec.doc, quote=True)}'>{html.escape(spec.label)}</th>"


def metrics_table(columns: Sequence[tuple[str, Aggregate]]) -> str:
    """Metrics down, groups across."""
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns)
    body = "".join(
        f"<tr>{_label(spec)}{''.join(_cell(spec, agg[spec.key]) for _, agg in columns)}</tr>"
        for spec in METRICS
    )
    return f"<table class='metrics'><tr><th>metric</th>{head}</tr>{body}</table>"


def groups_table(groups: Sequence[tuple[str, Aggregate]], first: str, link: bool = False) -> str:
    """Groups down (iterations or tasks), metrics across (short names, the label and definition
    on hover); task names link to their card."""
    head = "".join(
        f"<th title='{html.escape(f'{s.label}: {s.doc}', quote=True)}'>{short_name(s)}</th>"
        for s in METRICS
    )
    rows = []
    for name, agg in groups:
        label = html.escape(name)
        if link:
            label = f"<a href='#task={html.escape(name, quote=True)}'>{label}</a>"
        cells = "".join(_cell(spec, agg[spec.key]) for spec in METRICS)
        rows.append(f"<tr><th>{label}</th>{cells}</tr>")
    return f"<table class='groups'><tr><th>{first}</th>{head}</tr>{''.join(rows)}</table>"


def compare_table(
    labels: tuple[str, str],
    before: Aggregate,
    after: Aggregate,
    intervals: Mapping[str, tuple[float, float] | None] | None = None,
) -> str:
    """Each metric for both runs, the ratio after/before with its bootstrap interval over
    tasks (none given: the runs share no task), the paper's factor and the way."""
    head = f"<tr><th>metric</th><th>{html.escape(labels[0])}</th>"
    head += f"<th>{html.escape(labels[1])}</th><th>ratio</th>"
    head += f"<th title='tasks drawn with replacement, paired'>{INTERVAL_LEVEL:.0%} interval</th>"
    head += "<th title='base Qwen2.5-32B to LOOP, [P] section 5'>paper</th><th>way</th></tr>"
    rows = []
    for s in METRICS:
        cells = "".join(
            f"<td>{cell}</td>" for cell in change_cells(s, before, after, intervals, "{} to {}")
        )
        rows.append(f"<tr>{_label(s)}{_cell(s, before[s.key])}{_cell(s, after[s.key])}{cells}</tr>")
    return f"<table class='metrics compare'>{head}{''.join(rows)}</table>"


def compare_charts(labels: tuple[str, str], before: Aggregate, after: Aggregate) -> str:
    """A small before/after bar chart per metric."""
    legend = (
        f"<p class='legend'><span class='swatch' style='background:{BEFORE}'></span>"
        f"{html.escape(labels[0])} <span class='swatch' style='background:{AFTER}'></span>"
        f"{html.escape(labels[1])}</p>"
    )
    charts = "".join(bar_chart(s, before[s.key], after[s.key]) for s in METRICS)
    return f"{legend}<div class='charts'>{charts}</div>"


def bar_chart(spec: MetricSpec, before: float | None, after: float | None) -> str:
    """Two bars (before, after) scaled to the larger value, with values and the ratio."""
    width, height, top, bottom = 196, 110, 30, 18
    scale = max(before or 0.0, after or 0.0) or 1.0
    bars = []
    for i, (value, color) in enumerate(((before, BEFORE), (after, AFTER))):
        x = 44 + i * 64
        size = 0 if value is None else (height - top - bottom) * value / scale
        y = height - bottom - size
        bars.append(
            f"<rect x='{x}' y='{y:.1f}' width='40' height='{size:.1f}' fill='{color}'/>"
            f"<text x='{x + 20}' y='{y - 3:.1f}' text-anchor='middle'>"
            f"{format_value(value, spec.kind)}</text>"
        )
    title = html.escape(spec.label)
    change = format_ratio(ratio(before, after))
    return (
        f"<figure class='chart'><svg width='{width}' height='{height}' role='img' "
        f"aria-label='{title}'><text x='{width / 2}' y='12' text-anchor='middle' "
        f"class='chart-title'>{title}</text>{''.join(bars)}"
        f"<line x1='25' x2='{width - 25}' y1='{height - bottom}' y2='{height - bottom}' "
        f"stroke='#555'/><text x='{width / 2}' y='{height - 3}' text-anchor='middle'>"
        f"ratio {change}</text></svg></figure>"
    )


def definitions() -> str:
    """What each metric means (the paper's definitions, loop_spec.md section 5)."""
    items = "".join(
        f"<dt>{html.escape(s.label)}</dt><dd>{html.escape(s.doc)}</dd>" for s in METRICS
    )
    return (
        "<details class='definitions'><summary>Metric definitions</summary>"
        f"<dl>{items}</dl><p>Ratios over turns are pooled over the group; per-rollout values "
        "are means. Give-up rate: walking each rollout's turns, a turn whose cell failed adds "
        "the endpoints it called to a set of failed endpoints; a later turn that calls one "
        "without failing removes it (recovered). Rate = (failed - recovered) / failed.</p>"
        "</details>"
    )
