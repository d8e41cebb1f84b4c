"""`loop.generators.vllm.routing.PrefixRouter`: groups pinned by their first prompt, worked by hand.

Run: python -m pytest tests/loop/test_routing.py -q
"""

from __future__ import annotations

import pytest

from loop.generators.vllm.routing import Pin, PrefixRouter

SYSTEM = [1, 50, 51, 52]  # every task's first prompt starts alike
TASK_A = [*SYSTEM, 7, 7, 2]
TASK_B = [*SYSTEM, 8, 2]


def test_a_groups_rollouts_and_later_turns_follow_its_first_request() -> None:
    router = PrefixRouter()
    ready = {0: "v1", 1: "v1"}
    first = router.route(TASK_A, ready, load={0: 3, 1: 0})
    assert first == Pin(1, "v1")  # a new group goes where load is least
    # its other rollouts (same first prompt) and a later turn (first prompt + turn + observation)
    assert router.route(TASK_A, ready, load={0: 0, 1: 9}) == first
    assert router.route([*TASK_A, 30, 31, 2, 40, 41], ready, load={0: 0, 1: 9}) == first
    # another task shares only the system prompt: a group of its own, on the idle server
    assert router.route(TASK_B, ready, load={0: 0, 1: 9}) == Pin(0, "v1")
    assert len(router) == 2


def test_the_longest_known_first_prompt_wins() -> None:
    router = PrefixRouter()
    short = router.route(SYSTEM, {0: "v1", 1: "v1"}, load={0: 0, 1: 1})
    longer = router.route(TASK_A, {0: "v1", 1: "v1"}, load={0: 1, 1: 0})
    assert (short.server, longer.server) == (0, 0)  # TASK_A begins with SYSTEM: that group
    router = PrefixRouter()
    router.route(TASK_A, {0: "v1", 1: "v1"}, load={0: 0, 1: 1})  # pinned to 0
    router.route([*SYSTEM, 9], {0: "v1", 1: "v1"}, load={0: 5, 1: 0})  # another group, on 1
    assert router.route([*TASK_A, 3], {0: "v1", 1: "v1"}, load={}).server == 0


def test_a_group_starts_over_when_its_server_leaves_or_its_version_is_gone() -> None:
    router = PrefixRouter()
    assert router.route(TASK_A, {0: "v1", 1: "v1"}, load={0: 0, 1: 1}).server == 0
    # server 0 is down: the group's next request goes to a ready server and stays there
    assert router.route([*TASK_A, 5], {1: "v1"}, load={}) == Pin(1, "v1")
    assert router.route([*TASK_A, 5, 6], {0: "v1", 1: "v1"}, load={0: 0, 1: 9}) == Pin(1, "v1")
    # a new version published: the same task in the next iteration is a new group on v2
    assert router.route(TASK_A, {0: "v2", 1: "v2"}, load={0: 0, 1: 1}) == Pin(0, "v2")
    router.forget_server(0)
    assert router.route(TASK_A, {0: "v2", 1: "v2"}, load={0: 4, 1: 1}) == Pin(1, "v2")


def test_pins_are_bounded_and_no_ready_server_is_a_lookup_error() -> None:
    router = PrefixRouter(max_groups=2)
    for task in range(5):
        router.route([*SYSTEM, task], {0: "v1"}, load={})
    assert len(router) == 2
    with pytest.raises(LookupError, match="no server is ready"):
        router.route(TASK_A, {}, load={})
    with pytest.raises(ValueError, match="max_groups"):
        PrefixRouter(max_groups=0)
