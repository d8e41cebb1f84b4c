"""Inspect what agents do in their rollouts: behaviour metrics, terminal tables, HTML report.

    python -m loop.inspect runs/<name>/eval/dev --html report.html
    python -m loop.inspect runs/<name> --iteration 0 --compare runs/<name> --compare-iteration last

It reads rollouts files through `loop.run.records`. Modules: `metrics` (pure per-rollout
counts and their aggregates, after the LOOP paper's section 5), `summary` (grouping), `terminal`
(tables), `html`, `html_summary`, `assets` and `style` (the self-contained report), `cli` (the
command), `demo` (scripted rollouts through the real sandbox, for tests and a look at the report).
"""

from loop.inspect.metrics import METRICS, RolloutMetrics, aggregate, give_up_counts, rollout_metrics
from loop.run.records import InspectError, Rollout, find_sources, read_rollouts

__all__ = [
    "METRICS",
    "InspectError",
    "Rollout",
    "RolloutMetrics",
    "aggregate",
    "find_sources",
    "give_up_counts",
    "read_rollouts",
    "rollout_metrics",
]
