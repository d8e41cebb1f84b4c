"""Which server samples a request: a group's rollouts together, new groups where load is least.

The K rollouts of a task start from the same first prompt (system prompt, tools, task), and each
later turn of a rollout extends its own previous prompt. Sending a whole group to one server
lets that server's prefix cache compute the shared first prompt once and each rollout's
previous turns never again; spreading groups over servers balances the load. A router sees only
token ids, so it recognises a group by its first prompt: the first request whose prompt no
known first prompt begins starts a group (pinned to the least-loaded server, with the adapter
version current then); every later request whose prompt begins with that first prompt (the
group's other rollouts, every later turn) goes where the group went, with the same version.

    router = PrefixRouter()
    pin = router.route(prompt_ids, ready={0: "run-v3", 1: "run-v3"}, load={0: 5, 1: 2})
    pin.server, pin.version        # 1, "run-v3"

A group's pin is dropped when its server leaves routing (the group's next request starts over
on another server) or its version is no longer served; the oldest pins are forgotten past
`max_groups`. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Pin:
    """Where a group samples: a server's index, and the adapter version it was pinned to."""

    server: int
    version: str


class PrefixRouter:
    """Pins each group (its first prompt) to one server and one adapter version."""

    def __init__(self, max_groups: int = 4096):
        if max_groups < 1:
            raise ValueError(f"max_groups must be >= 1, got {max_groups}")
        self.max_groups = max_groups
        self._pins: OrderedDict[tuple[int, int], Pin] = OrderedDict()  # (length, hash) -> pin
        self._lengths: Counter[int] = Counter()  # first-prompt lengths of the pins

    def __len__(self) -> int:
        return len(self._pins)

    def route(
        self, prompt: Sequence[int], ready: Mapping[int, str], load: Mapping[int, int]
    ) -> Pin:
        """The pin of `prompt`'s group, pinning a new group if it has none.

        `ready`: the servers in routing and the version each serves now (all the same outside
        a publication); `load`: requests in flight per server. Raises `LookupError` when no
        server is ready."""
        if not ready:
            raise LookupError("no server is ready")
        for length in sorted(self._lengths, reverse=True):  # the longest first prompt first
            if length > len(prompt):
                continue
            key = (length, hash(tuple(prompt[:length])))
            pin = self._pins.get(key)
            if pin is None:
                continue
            if ready.get(pin.server) == pin.version:
                self._pins.move_to_end(key)
                return pin
            self._drop(key)  # its server left, or its version is gone: the group starts over
            break
        server = min(ready, key=lambda index: (load.get(index, 0), index))
        pin = Pin(server, ready[server])
        self._add((len(prompt), hash(tuple(prompt))), pin)
        return pin

    def forget_server(self, server: int) -> None:
        """Drop every pin to `server` (it left routing)."""
        for key in [key for key, pin in self._pins.items() if pin.server == server]:
            self._drop(key)

    def _add(self, key: tuple[int, int], pin: Pin) -> None:
        if key in self._pins:
            self._drop(key)
        self._pins[key] = pin
        self._lengths[key[0]] += 1
        while len(self._pins) > self.max_groups:
            self._drop(next(iter(self._pins)))

    def _drop(self, key: tuple[int, int]) -> None:
        del self._pins[key]
        self._lengths[key[0]] -= 1
        if not self._lengths[key[0]]:
            del self._lengths[key[0]]
