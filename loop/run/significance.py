"""Before/after statistics of success rates: intervals and one-sided tests (pure functions).

A training run claims that its policy solves more held-out tasks after training than before.
These functions say how sure that claim is, from the evaluation rollouts alone:

- `wilson_interval`: the Wilson score interval of a success rate (well-behaved at 0 and n).
- `fisher_one_sided`: Fisher's exact test that the "after" rate exceeds the "before" rate, over
  rollouts as independent trials (the hypergeometric tail; no approximation).
- `task_bootstrap_one_sided`: a paired bootstrap over tasks, for rollouts that are not
  independent (K rollouts of one task share its difficulty): resample tasks with replacement
  and count how often the resampled after-minus-before difference is <= 0.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import NamedTuple

Z_95 = 1.959963984540054  # the two-sided 95% normal quantile


class Comparison(NamedTuple):
    """Success before and after, with intervals and one-sided p-values (after > before)."""

    before_successes: int
    before_n: int
    after_successes: int
    after_n: int
    before_interval: tuple[float, float]
    after_interval: tuple[float, float]
    p_fisher: float
    p_bootstrap: float | None  # None when the per-task outcomes were not given

    @property
    def before_rate(self) -> float:
        return self.before_successes / self.before_n if self.before_n else math.nan

    @property
    def after_rate(self) -> float:
        return self.after_successes / self.after_n if self.after_n else math.nan

    def line(self, name: str) -> str:
        """`name: 0.250 [0.14, 0.40] -> 0.500 [0.37, 0.63]  (+0.250, p=0.012 Fisher, ...)`."""
        (b_lo, b_hi), (a_lo, a_hi) = self.before_interval, self.after_interval
        boot = "" if self.p_bootstrap is None else f", p={self.p_bootstrap:.3g} task bootstrap"
        return (
            f"{name}: {self.before_rate:.3f} [{b_lo:.2f}, {b_hi:.2f}] ({self.before_successes}/"
            f"{self.before_n}) -> {self.after_rate:.3f} [{a_lo:.2f}, {a_hi:.2f}] "
            f"({self.after_successes}/{self.after_n})  ({self.after_rate - self.before_rate:+.3f}"
            f", one-sided p={self.p_fisher:.3g} Fisher{boot})"
        )


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of successes/n; (0, 1) when n is 0."""
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes}/{n}")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact bounds at the edges
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def fisher_one_sided(
    after_successes: int, after_n: int, before_successes: int, before_n: int
) -> float:
    """P(X >= after_successes) for X hypergeometric with the table's margins.

    The 2x2 table [[a, after_n - a], [b, before_n - b]]; the one-sided alternative is that the
    after rate is higher (scipy's `fisher_exact(..., alternative="greater")`).
    """
    for s, n in ((after_successes, after_n), (before_successes, before_n)):
        if not 0 <= s <= n:
            raise ValueError(f"need 0 <= successes <= n, got {s}/{n}")
    total_success, total = after_successes + before_successes, after_n + before_n
    if total == 0:
        return 1.0
    denominator = math.comb(total, after_n)
    top = min(total_success, after_n)
    tail = sum(
        math.comb(total_success, x) * math.comb(total - total_success, after_n - x)
        for x in range(after_successes, top + 1)
    )
    return min(1.0, tail / denominator)


def task_bootstrap_one_sided(
    before: Mapping[str, Sequence[bool]],
    after: Mapping[str, Sequence[bool]],
    *,
    samples: int = 10_000,
    seed: int = 0,
) -> float:
    """Paired bootstrap over the tasks both evaluations share: the share of resamples in which
    mean(after success rate - before success rate) <= 0 (with a +1 correction, so never 0).

    before, after: task id -> that task's rollout outcomes.
    """
    tasks = sorted(set(before) & set(after))
    if not tasks:
        raise ValueError("the two evaluations share no task")
    diffs = [_rate(after[t]) - _rate(before[t]) for t in tasks]
    rng = random.Random(seed)
    n = len(diffs)
    not_better = sum(sum(rng.choice(diffs) for _ in range(n)) <= 0 for _ in range(samples))
    return (not_better + 1) / (samples + 1)


def compare(
    before: Mapping[str, Sequence[bool]], after: Mapping[str, Sequence[bool]]
) -> Comparison:
    """Before/after success over all rollouts, with intervals and both one-sided tests."""
    b_s, b_n = sum(sum(v) for v in before.values()), sum(len(v) for v in before.values())
    a_s, a_n = sum(sum(v) for v in after.values()), sum(len(v) for v in after.values())
    shared = set(before) & set(after)
    return Comparison(
        b_s, b_n, a_s, a_n, wilson_interval(b_s, b_n), wilson_interval(a_s, a_n),
        fisher_one_sided(a_s, a_n, b_s, b_n),
        task_bootstrap_one_sided(before, after) if shared else None,
    )  # fmt: skip


def _rate(outcomes: Sequence[bool]) -> float:
    return sum(outcomes) / len(outcomes) if outcomes else 0.0
