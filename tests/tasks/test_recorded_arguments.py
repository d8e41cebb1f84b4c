"""What the host keeps of a call's arguments is bounded however large they were (hand-computed).

Run: python -m pytest tests/tasks/test_recorded_arguments.py
"""

from __future__ import annotations

import json

from tasks.core import MAX_RECORDED_DEPTH, recorded_arguments


def test_small_arguments_are_kept_as_they_are() -> None:
    kwargs = {"song_id": 7, "query": "jazz", "ids": [1, 2], "extra": {"a": None, "b": 1.5}}
    assert recorded_arguments(kwargs) == kwargs


def test_a_long_string_keeps_its_head_and_says_how_much_was_cut() -> None:
    recorded = recorded_arguments({"body": "x" * 1_000_000})
    assert recorded == {"body": "x" * 500 + "...[999500 more characters]"}


def test_long_lists_and_objects_keep_their_first_members() -> None:
    recorded = recorded_arguments({"ids": list(range(53)), "map": {str(i): i for i in range(52)}})
    assert recorded["ids"] == [*range(50), "...[3 more items]"]
    assert list(recorded["map"].items())[-2:] == [("49", 49), ("...", "[2 more entries]")]


def test_deep_nesting_becomes_a_marker_without_recursing_through_it() -> None:
    deep: list[object] = []
    for _ in range(5000):  # far past Python's recursion limit
        deep = [deep]
    recorded = recorded_arguments({"extra": deep})
    text = json.dumps(recorded)
    assert (
        text
        == '{"extra": '
        + "[" * (MAX_RECORDED_DEPTH - 1)
        + '"<list of 1>"'
        + "]" * (MAX_RECORDED_DEPTH - 1)
        + "}"
    )
