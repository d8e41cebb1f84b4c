"""The `hf` generator's KV store: what earlier requests computed, reusable by later ones.

Two kinds of cached keys and values, both valid for one weight version only:

- **Prefix entries**: the KV of a whole first-turn prompt, frozen. A later prompt reuses the
  longest common prefix with any entry (the system message and worked example are shared by
  every rollout; the K rollouts of one task share their whole first prompt). Entries are
  immutable, so a view of their first n tokens stays valid.
- **Retained caches**: a rollout's own KV past its prefix entry, kept when its turn ends
  (unless it was the rollout's last: `SamplingParams.last_turn`). Its next prompt extends the
  ids it covers (token in, token out), so the next turn prefills only the glue and the
  observation.

`match` picks the candidate that covers most of a prompt (never all of it: the last prompt
token is always run, since its logits give the first sampled token). The store never holds more
than `budget_bytes`: the least recently used items are evicted first (an entry takes the
retained caches built on it along). `invalidate` drops everything; the generator calls it
whenever the weights' fingerprint changes, so no request is ever served from stale keys.

Tensors are shaped (layers, 2, kv_heads, tokens, head_dim): keys at [:, 0], values at [:, 1].
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from torch import Tensor


@dataclass(eq=False)
class PrefixEntry:
    """The frozen KV of `ids` (a whole prompt)."""

    ids: tuple[int, ...]
    kv: Tensor  # (layers, 2, kv_heads, len(ids), head_dim)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


@dataclass(eq=False)
class Retained:
    """A rollout's cache at the end of its turn: `entry`'s first `n_prefix` tokens + `own`."""

    ids: tuple[int, ...]  # every id whose KV is held: n_prefix from the entry, then own
    entry: PrefixEntry | None
    n_prefix: int
    own: Tensor  # (layers, 2, kv_heads, len(ids) - n_prefix, head_dim)
    last_used: int = 0

    @property
    def nbytes(self) -> int:
        return self.own.numel() * self.own.element_size()


@dataclass(frozen=True)
class Match:
    """How much of a prompt is cached: `entry[:n_prefix]`, then `own` (None: nothing own)."""

    entry: PrefixEntry | None
    n_prefix: int
    own: Tensor | None
    from_retained: bool

    @property
    def reused(self) -> int:
        return self.n_prefix + (0 if self.own is None else self.own.shape[3])


NO_MATCH = Match(None, 0, None, False)


@dataclass
class KVStoreStats:
    """Counters for logs and benchmarks (tokens reused against tokens prefilled)."""

    requests: int = 0
    reused_tokens: int = 0
    prefill_tokens: int = 0
    retained_hits: int = 0
    prefix_hits: int = 0
    evictions: int = 0
    invalidations: int = 0
    peak_bytes: int = 0


@dataclass
class KVStore:
    """Prefix entries and retained caches under a byte budget (see the module docstring)."""

    budget_bytes: int
    entries: list[PrefixEntry] = field(default_factory=list)
    retained: list[Retained] = field(default_factory=list)
    stats: KVStoreStats = field(default_factory=KVStoreStats)
    _clock: itertools.count = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.budget_bytes < 0:
            raise ValueError(f"KV cache budget must be >= 0 bytes, got {self.budget_bytes}")

    @property
    def nbytes(self) -> int:
        """Bytes held by entries and retained caches (active rows are the engine's)."""
        return sum(e.nbytes for e in self.entries) + sum(r.nbytes for r in self.retained)

    def match(self, prompt: list[int], *, take: bool = True) -> Match:
        """The cached KV covering most of `prompt[:-1]`; a retained cache used is taken out
        (`take=False`: a look only, nothing taken, touched or counted)."""
        limit = len(prompt) - 1
        best, best_reused, taken = NO_MATCH, 0, None
        for retained in self.retained:
            n = len(retained.ids)
            if n <= len(prompt) and prompt[:n] == list(retained.ids):
                candidate = _trim(retained, limit)
                if candidate.reused > best_reused:
                    best, best_reused, taken = candidate, candidate.reused, retained
        for entry in self.entries:
            n = min(common_prefix_length(prompt, entry.ids), limit)
            if n > best_reused:
                best, best_reused, taken = Match(entry, n, None, False), n, None
        if not take:
            return best
        if taken is not None:  # a rollout's cache continues in exactly one request
            self.retained.remove(taken)
        self._touch(best.entry)
        self.stats.requests += 1
        self.stats.reused_tokens += best_reused
        self.stats.prefill_tokens += len(prompt) - best_reused
        self.stats.retained_hits += best.from_retained
        self.stats.prefix_hits += best.entry is not None and not best.from_retained
        return best

    def add_entry(self, ids: list[int], kv: Tensor) -> PrefixEntry | None:
        """Keep `kv` as the entry for `ids`; None when it alone exceeds the budget."""
        entry = PrefixEntry(tuple(ids), kv, next(self._clock))
        if entry.nbytes > self.budget_bytes:
            return None
        self.entries.append(entry)
        self._evict()
        return entry if entry in self.entries else None

    def retain(self, ids: list[int], entry: PrefixEntry | None, n_prefix: int, own: Tensor) -> None:
        """Keep a finished turn's cache for the rollout's next turn."""
        if entry is not None and entry not in self.entries:
            return  # its prefix entry was evicted meanwhile: the rest alone is of no use
        retained = Retained(tuple(ids), entry, n_prefix, own, next(self._clock))
        if retained.nbytes > self.budget_bytes:
            return
        self.retained.append(retained)
        self._evict()

    def invalidate(self) -> None:
        """Drop everything (the weights changed)."""
        if self.entries or self.retained:
            self.stats.invalidations += 1
        self.entries, self.retained = [], []

    def _touch(self, entry: PrefixEntry | None) -> None:
        if entry is not None:
            entry.last_used = next(self._clock)

    def _evict(self) -> None:
        """Least recently used first, until the budget holds; record the peak."""
        while self.nbytes > self.budget_bytes:
            items: list[PrefixEntry | Retained] = [*self.entries, *self.retained]
            oldest = min(items, key=lambda item: item.last_used)
            self.stats.evictions += 1
            if isinstance(oldest, PrefixEntry):
                self.entries.remove(oldest)
                self.retained = [r for r in self.retained if r.entry is not oldest]
            else:
                self.retained.remove(oldest)
        self.stats.peak_bytes = max(self.stats.peak_bytes, self.nbytes)


def common_prefix_length(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    """The number of leading ids `a` and `b` share (compared in blocks, then one by one)."""
    n, block, i = min(len(a), len(b)), 256, 0
    while i + block <= n and list(a[i : i + block]) == list(b[i : i + block]):
        i += block
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _trim(retained: Retained, limit: int) -> Match:
    """`retained` as a match of at most `limit` tokens (it may cover the whole prompt)."""
    n_prefix = min(retained.n_prefix, limit)
    own_len = max(0, min(len(retained.ids), limit) - retained.n_prefix)
    own = retained.own[:, :, :, :own_len] if own_len else None
    return Match(retained.entry if n_prefix else None, n_prefix, own, True)
