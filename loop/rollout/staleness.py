"""The staleness bound of collecting ahead (`train.overlap.max_staleness` S): pure bookkeeping,
no I/O.

With S >= 1 the trainer dispatches iteration k+1's groups (up to k+S) while iteration k learns,
so a group may have sampled an older policy than the one that trains on it. Its lag is

    lag = iteration - policy_version

(`Trajectory.policy_version`: the updates published when the group was dispatched; 0 in the
synchronous loop). The rules, prime-rl's `max_off_policy_steps` and AReaL's staleness bound:
- admission: groups are dispatched only while the groups accepted (collected, not yet
  trained) plus those in flight stay within (S+1) x tasks_per_iteration (`admits`);
- assembly: when iteration k assembles its groups, a group whose lag exceeds S is dropped
  whole (`stale`), never trained on, and counted; so is a group whose rollouts name more than
  one version (`mixed_versions`: the pinning failed; it should never happen, and is loud if
  it does). The straggler cut-off, the |A| filter and the sharding then run as before on the
  groups that remain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import NamedTuple

from loop.rollout.trajectory import Trajectory

DROP_REASONS = ("stale", "mixed_versions")


class Assembly(NamedTuple):
    """An iteration's groups after the staleness rules."""

    groups: list[list[Trajectory]]  # the groups it trains on
    lags: list[int]  # the lag of every group collected (kept or dropped), in order
    dropped: dict[str, int]  # groups dropped, by reason (every reason, 0 included)


def admits(accepted: int, in_flight: int, new: int, tasks_per_iteration: int, s: int) -> bool:
    """Whether `new` more groups may be dispatched: accepted + in flight + new <= (S+1) x N.

    With S = 0 this admits one iteration's groups at a time: the synchronous loop."""
    if min(accepted, in_flight, new, s) < 0 or tasks_per_iteration < 1:
        raise ValueError(f"bad counts: {accepted}, {in_flight}, {new}, "
                         f"{tasks_per_iteration}, {s}")  # fmt: skip
    return accepted + in_flight + new <= (s + 1) * tasks_per_iteration


def group_version(group: Sequence[Trajectory]) -> int | None:
    """The one policy version a group sampled; None when it names none or several."""
    versions = {t.policy_version for t in group}
    names = {turn.adapter_version for t in group for turn in t.turns} - {None}
    if len(versions) != 1 or len(names) > 1:
        return None
    return next(iter(versions))


def assemble(groups: Sequence[list[Trajectory]], iteration: int, s: int) -> Assembly:
    """Drop the groups `iteration` must not train on (see the module docstring).

    A group without a recorded version (`policy_version` None on all its rollouts: collected
    unpinned) counts as current, lag 0."""
    kept: list[list[Trajectory]] = []
    lags: list[int] = []
    dropped = dict.fromkeys(DROP_REASONS, 0)
    for group in groups:
        if all(t.policy_version is None for t in group):
            version: int | None = iteration
        else:
            version = group_version(group)
        if version is None:
            dropped["mixed_versions"] += 1
            continue
        lag = iteration - version
        if lag < 0:
            raise ValueError(f"a group of iteration {iteration} sampled version {version}, "
                             "which was not yet published")  # fmt: skip
        lags.append(lag)
        if lag > s:
            dropped["stale"] += 1
        else:
            kept.append(group)
    return Assembly(kept, lags, dropped)


def staleness_metrics(assembly: Assembly, recollected: int = 0) -> dict[str, float]:
    """`stale/*`: the lag of the groups collected (mean, max, and a count per lag value),
    the groups dropped by reason, and those re-collected after a resume."""
    lags = assembly.lags
    metrics = {
        "stale/lag_mean": sum(lags) / len(lags) if lags else 0.0,
        "stale/lag_max": float(max(lags, default=0)),
        "stale/groups_dropped": float(sum(assembly.dropped.values())),
        "stale/groups_recollected": float(recollected),
    }
    metrics |= {f"stale/groups_dropped_{r}": float(n) for r, n in assembly.dropped.items()}
    counts = Counter(lags)
    metrics |= {
        f"stale/groups_lag_{lag}": float(counts[lag]) for lag in range(max(lags, default=0) + 1)
    }
    return metrics
