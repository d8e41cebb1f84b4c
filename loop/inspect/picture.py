"""`--plot OUT` with `--compare`: each behaviour metric's after / before as a picture (PNG).

One row per metric whose change is defined, on a log axis (a halving and a doubling are the same
distance from 1): the measured ratio as a dot with its bootstrap interval over tasks
(`metrics.change_intervals`) as a bar, and, for the metrics the LOOP paper quantifies, its
factor (Qwen2.5-32B before -> after LOOP, loop_spec.md section 5 [P]) as a diamond. A dot on
the diamond's side of the line at 1 moves the paper's way; an interval that crosses 1 is a
change the evaluated tasks do not establish. The run's sizes and success are in the title.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

from loop.inspect.metrics import METRICS, ratio
from loop.inspect.summary import Aggregate
from loop.inspect.terminal import format_ratio

# Ratios drawn at the axis' ends when they are 0 or infinite (x / 0): shown, never dropped.
RATIO_FLOOR, RATIO_CEILING = 1 / 64, 64.0


def plot_changes(
    labels: tuple[str, str],
    before: Aggregate,
    after: Aggregate,
    intervals: Mapping[str, tuple[float, float] | None] | None,
    out: Path,
) -> Path:
    """Draw the picture (see the module docstring) to `out`; returns `out`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    specs = [s for s in METRICS if s.kind != "count" and s.key != "distinct_sequences"]
    rows = [(s, ratio(before[s.key], after[s.key])) for s in specs]
    rows = [(s, r) for s, r in rows if r is not None or s.paper is not None]
    fig, ax = plt.subplots(figsize=(7.5, 0.42 * len(rows) + 1.6))
    for y, (spec, change) in enumerate(reversed(rows)):
        span = (intervals or {}).get(spec.key)
        if span is not None:
            low, high = (on_axis(v) for v in span)
            ax.plot([low, high], [y, y], color="tab:blue", linewidth=2.5, alpha=0.6)
        if change is not None:
            ax.plot(on_axis(change), y, "o", color="tab:blue", markersize=7)
            point, text = (on_axis(change), y), format_ratio(change)
            ax.annotate(text, point, xytext=(0, 7), textcoords="offset points", ha="center")
        if spec.paper is not None:
            ax.plot(spec.paper, y, "D", color="tab:orange", markersize=7, alpha=0.9)
    ax.axvline(1.0, color="grey", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_xlim(RATIO_FLOOR / 1.3, RATIO_CEILING * 1.3)
    ticks = [4.0**k for k in range(-3, 4)]
    ax.set_xticks(ticks, [f"1/{1 / t:.0f}" if t < 1 else f"{t:.0f}" for t in ticks])
    ax.set_yticks(range(len(rows)), [spec.label for spec, _ in reversed(rows)], fontsize=8)
    ax.set_xlabel("after / before (log scale; 1: no change)", fontsize=8)
    handles = [
        ax.plot([], [], "o-", color="tab:blue", label="measured, 95% interval over tasks")[0],
        ax.plot([], [], "D", color="tab:orange", label="LOOP paper, Qwen2.5-32B")[0],
    ]
    ax.legend(handles=handles, loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(_title(labels, before, after), fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def on_axis(value: float) -> float:
    """A ratio on the axis: 0 and infinity at its ends."""
    if math.isinf(value):
        return RATIO_CEILING
    return min(max(value, RATIO_FLOOR), RATIO_CEILING)


def _title(labels: tuple[str, str], before: Aggregate, after: Aggregate) -> str:
    def side(label: str, values: Aggregate) -> str:
        success = values["success_rate"]
        shown = "-" if success is None else f"{success:.2f}"
        return f"{label} ({values['rollouts']} rollouts, success {shown})"

    return f"before: {side(labels[0], before)}\nafter: {side(labels[1], after)}"
