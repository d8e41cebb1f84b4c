"""Finding and reading rollouts: run directories, eval directories, files, broken input.

Run: python -m pytest tests/inspect/test_load.py -q
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from loop.run.records import (
    InspectError,
    find_sources,
    parse_iterations,
    read_rollouts,
    select_sources,
)
from tests.inspect.builders import rollout_a, rollout_b, write_jsonl


def training_record(iteration: int, advantage: float | None = 0.5) -> dict[str, Any]:
    record = rollout_a().to_json()
    record.update(iteration=iteration, split="train", advantage=advantage, kept=True,
                  learner_logprobs=[], turn_advantages=[0.5, 0.5, 0.5], future_key=1)  # fmt: skip
    return record


def make_run(root: Path) -> Path:
    """runs/demo with two training iterations, a final dev eval and one periodic dev eval."""
    run = root / "demo"
    for it in (0, 1):
        path = run / "rollouts" / f"iter-{it}.jsonl.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as sink:
            sink.write(json.dumps(training_record(it)) + "\n")
    (run / "rollouts" / "iter-2.jsonl.tmp").write_text("half written")  # the trainer's temp file
    write_jsonl(run / "eval" / "dev" / "rollouts.jsonl", [rollout_b().to_json()])
    write_jsonl(run / "eval" / "dev" / "iter-1" / "rollouts.jsonl", [rollout_a().to_json()])
    (run / "metrics.jsonl").write_text('{"iteration": 0}\n')  # not rollouts
    (run / "checkpoints" / "iter-1").mkdir(parents=True)
    return run


def test_a_run_directory(tmp_path: Path) -> None:
    sources = find_sources(make_run(tmp_path))
    found = [(s.path.name, s.split, s.iteration, s.training) for s in sources]
    assert found == [
        ("iter-0.jsonl.gz", None, 0, True),
        ("iter-1.jsonl.gz", None, 1, True),
        ("rollouts.jsonl", "dev", None, False),
        ("rollouts.jsonl", "dev", 1, False),
    ]
    first = next(read_rollouts(sources[0]))
    assert (first.split, first.iteration, first.advantage, first.kept) == ("train", 0, 0.5, True)
    assert first.turn_advantages == [0.5, 0.5, 0.5]
    assert first.traj.task_id == "t_1" and len(first.traj.api_calls) == 4
    periodic = next(read_rollouts(sources[3]))
    assert (periodic.split, periodic.iteration, periodic.kept) == ("dev", 1, None)


def test_iteration_selection(tmp_path: Path) -> None:
    sources = find_sources(make_run(tmp_path))
    assert select_sources(sources, "all") == sources
    last = select_sources(sources, "last")  # newest training file and newest dev eval
    assert [(s.training, s.iteration) for s in last] == [(True, 1), (False, 1)]
    assert [s.iteration for s in select_sources(sources, "0")] == [0]
    assert [s.iteration for s in select_sources(sources, "0-1")] == [0, 1, 1]
    with pytest.raises(InspectError, match=r"--iteration 7: .*iterations here: 0, 1"):
        select_sources(sources, "7")
    with pytest.raises(InspectError, match="expected all, last"):
        parse_iterations("latest")
    assert parse_iterations("0,3-4") == ("some", {0, 3, 4})


def test_an_eval_directory_takes_its_split_from_config(tmp_path: Path) -> None:
    folder = tmp_path / "renamed"
    write_jsonl(folder / "rollouts.jsonl", [rollout_a().to_json()])
    (folder / "config.yaml").write_text("eval:\n  split: test_normal\n")
    [source] = find_sources(folder)
    assert source.split == "test_normal"
    assert next(read_rollouts(source)).split == "test_normal"
    [same] = find_sources(folder / "rollouts.jsonl")  # the file itself
    assert same.split == "test_normal"


def test_a_sampled_pass_is_its_own_split_beside_the_greedy_one(tmp_path: Path) -> None:
    for name in ("dev", "dev@T1"):  # evaluate.py writes the real split in both configs
        folder = tmp_path / "eval" / name / "iter-0"
        write_jsonl(folder / "rollouts.jsonl", [rollout_a().to_json()])
        (folder / "config.yaml").write_text("eval:\n  split: dev\n")
    sources = find_sources(tmp_path / "eval")
    assert sorted(source.split or "" for source in sources) == ["dev", "dev@T1"]


def test_a_single_file_of_any_name(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "mine.jsonl", [rollout_a().to_json(), rollout_b().to_json()])
    [source] = find_sources(path)
    rollouts = list(read_rollouts(source, with_tokens=False))
    assert [r.traj.sample_index for r in rollouts] == [0, 1]
    assert rollouts[0].split == "unknown" and rollouts[0].where == f"{path}:1"


def test_old_records_with_repeated_api_calls(tmp_path: Path) -> None:
    record = rollout_a().to_json()
    record["api_calls"] = [c for t in record["turns"] for c in t["api_calls"]]
    path = write_jsonl(tmp_path / "old.jsonl", [record])
    [r] = read_rollouts(find_sources(path)[0])
    assert len(r.traj.api_calls) == 4 and r.traj.own_api_calls is None


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("x.txt", "", "not a rollouts file"),
        ("bad.jsonl", '{"task_id": 1\n{}\n', r"bad.jsonl:1: not valid JSON"),
        ("list.jsonl", "[1, 2]\n", r"list.jsonl:1: expected a JSON object"),
        ("other.jsonl", '{"name": "x"}\n', r"other.jsonl:1: not a rollout record \(no 'task_id'"),
        ("notgz.jsonl.gz", "plain text\n", "not a gzip file"),
        (
            "turns.jsonl",
            '{"task_id": "a_1", "scenario_id": "a", "difficulty": 1, "sample_index": 0, '
            '"turns": [1]}\n',
            r"turns.jsonl:1: malformed rollout",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, name: str, content: str, message: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(InspectError, match=message) as info:
        for source in find_sources(path):
            list(read_rollouts(source))
    assert "\n" not in str(info.value)


def test_missing_and_empty_paths(tmp_path: Path) -> None:
    with pytest.raises(InspectError, match="no such file or directory"):
        find_sources(tmp_path / "nope")
    with pytest.raises(InspectError, match="no rollouts here"):
        find_sources(tmp_path)


def test_an_interrupted_writer_loses_only_its_last_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good = json.dumps(rollout_a().to_json())
    path = tmp_path / "rollouts.jsonl"
    path.write_text(good + "\n" + good[: len(good) // 2])
    with caplog.at_level(logging.WARNING):
        assert len(list(read_rollouts(find_sources(path)[0]))) == 1
    assert "incomplete last line skipped" in caplog.text
    lines = []
    for sample in range(50):
        record = rollout_b().to_json()
        record["sample_index"], record["duration_s"] = sample, sample * 1.2345
        lines.append(json.dumps(record) + "\n")
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(gzip.compress("".join(lines).encode())[:-30])  # the trailer and a bit
    with caplog.at_level(logging.WARNING):
        assert 45 <= len(list(read_rollouts(find_sources(cut)[0]))) < 50
    assert "ends early" in caplog.text
