"""Plain-text tables for the terminal: the summary, iterations, tasks, rollouts, comparisons."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

from loop.inspect.metrics import INTERVAL_LEVEL, METRICS, MetricSpec, direction, ratio
from loop.inspect.summary import Aggregate, Row

MISSING = "-"


def format_value(value: float | None, kind: str) -> str:
    """A metric value as printed: counts as integers, rates with 3 decimals, means with 2."""
    if value is None:
        return MISSING
    if kind == "count":
        return str(int(value))
    return f"{value:.3f}" if kind == "rate" else f"{value:.2f}"


def plural(n: int, what: str) -> str:
    """ "1 rollout", "2 rollouts"."""
    return f"{n} {what}" + ("" if n == 1 else "s")


def format_ratio(value: float | None) -> str:
    """after/before as "1.60x"; "-" where undefined."""
    if value is None:
        return MISSING
    return "inf" if math.isinf(value) else f"{value:.2f}x"


def table(
    header: Sequence[str], rows: Sequence[Sequence[str]], left: Collection[int] = (0,)
) -> str:
    """Columns aligned: those numbered in `left` (text) to the left, the others (numbers) right."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lefts = set(left)

    def line(cells: Sequence[str]) -> str:
        parts = [
            f"{c:<{w}}" if i in lefts else f"{c:>{w}}"
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def metrics_table(columns: Sequence[tuple[str, Aggregate]]) -> str:
    """Metrics down, groups across (the summary table)."""
    header = ["metric", *(name for name, _ in columns)]
    rows = [
        [spec.label, *(format_value(agg[spec.key], spec.kind) for _, agg in columns)]
        for spec in METRICS
    ]
    return table(header, rows)


def groups_table(groups: Sequence[tuple[str, Aggregate]], first: str) -> str:
    """Groups down (iterations, tasks), metrics across under short names."""
    header = [first, *(short_name(spec) for spec in METRICS)]
    rows = [[name, *(format_value(agg[s.key], s.kind) for s in METRICS)] for name, agg in groups]
    return table(header, rows)


def compare_table(
    labels: tuple[str, str],
    before: Aggregate,
    after: Aggregate,
    intervals: Mapping[str, tuple[float, float] | None] | None = None,
) -> str:
    """Each metric for both runs, after/before with its bootstrap interval over tasks
    (`metrics.change_intervals`; none given: the runs share no task), the LOOP paper's
    after/before (32B) and whether the two go the same way."""
    rows = [
        [
            spec.label,
            format_value(before[spec.key], spec.kind),
            format_value(after[spec.key], spec.kind),
            *change_cells(spec, before, after, intervals, "[{}, {}]"),
        ]
        for spec in METRICS
    ]
    level = f"{INTERVAL_LEVEL:.0%} interval"
    header = ["metric", labels[0], labels[1], "ratio", level, "paper", "way"]
    return table(header, rows, left=(0, 6))


def change_cells(
    spec: MetricSpec,
    before: Aggregate,
    after: Aggregate,
    intervals: Mapping[str, tuple[float, float] | None] | None,
    span_format: str,
) -> tuple[str, str, str, str]:
    """A compare table's last cells for one metric, the terminal's and the report's: after /
    before, its interval (`span_format` of both ends; MISSING without one), the paper's factor
    and whether the two go the same way."""
    change = ratio(before[spec.key], after[spec.key])
    span = (intervals or {}).get(spec.key)
    shown = MISSING if span is None else span_format.format(*map(format_ratio, span))
    return format_ratio(change), shown, format_ratio(spec.paper), direction(change, spec.paper)


def rollouts_table(rows: Sequence[Row]) -> str:
    """One line per rollout (for `--task`), its API calls in order at the end."""
    header = ["rollout", "status", "outcome", "reward", "turns", "calls", "failed", "docs",
              "errors", "gave up", "assume", "dummy", "code", "calls in order"]  # fmt: skip
    lines = []
    for row in rows:
        m = row.metrics
        it = "" if row.iteration is None else f" it{row.iteration}"
        sequence = " ".join(call.split(".", 1)[-1] for call in m.sequence)
        lines.append([
            f"{row.task_id}#{row.sample_index} {row.split}{it}", row.status,
            "success" if m.success else "failure",
            f"{m.reward:.2f}", str(m.turns), str(m.api_calls), str(m.failed_api_calls),
            str(m.show_api_doc), str(m.execution_errors),
            f"{m.give_up_failed - m.give_up_recovered}/{m.give_up_failed}",
            str(m.assume), str(m.dummy), str(m.code_chars),
            sequence if len(sequence) <= 80 else sequence[:77] + "...",
        ])  # fmt: skip
    return table(header, lines, left=(0, 1, 2, len(header) - 1))


def short_name(spec: MetricSpec) -> str:
    """A column header for tables with a column per metric."""
    return {
        "rollouts": "n",
        "success_rate": "success",
        "reward_mean": "reward",
        "turns": "turns",
        "api_calls": "calls",
        "failed_api_calls": "failed",
        "show_api_doc": "docs",
        "multi_cell_turns": "multi",
        "execution_errors": "err/turn",
        "give_up_rate": "give-up",
        "assume": "assume",
        "dummy": "dummy",
        "code_chars": "code",
        "distinct_sequences": "distinct",
    }.get(spec.key, spec.key)
