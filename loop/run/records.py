"""Find and read rollouts: run directories, eval directories and single rollouts files.

What PATH may be, and where each rollout's split and iteration come from:

    runs/<name>/                              everything below it (the layouts that follow)
    runs/<name>/rollouts/iter-N.jsonl.gz      training rollouts: split and iteration from each
                                              record ("split", "iteration"), else train and N
    runs/<name>/eval/<split>/rollouts.jsonl   evaluate.py: split from its config.yaml
                                              (eval.split), else the directory name
    runs/<name>/eval/<split>/iter-N/rollouts.jsonl   periodic evaluations at iteration N
    runs/<name>/eval/<split>@T<t>/...         their sampled pass: the split is the folder's name
    any .jsonl or .jsonl.gz file              one rollout per line, `Trajectory.to_json()`

Files are read one line at a time (`read_rollouts`), so a run of any size is never held in
memory at once. A broken last line (a writer that was interrupted) is skipped with a warning;
any other problem is an `InspectError`, one line that names the file and the line.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loop.rollout.trajectory import Trajectory, Turn
from loop.run.rundir import CONFIG, EVAL_ROLLOUTS, ITER_NAME, NOT_ROLLOUTS, ROLLOUTS, read_config

log = logging.getLogger(__name__)

MAX_DEPTH = 5  # how deep below PATH rollouts files are looked for
TRAJECTORY_KEYS = {f.name for f in dataclasses.fields(Trajectory)} | {"api_calls"}
TURN_KEYS = {f.name for f in dataclasses.fields(Turn)}
TOKEN_KEYS = ("tokens", "is_output", "sampler_logprobs")


class InspectError(Exception):
    """A problem with the inspector's input, stated in one line."""


@dataclass(frozen=True)
class Source:
    """One rollouts file, with what its location says about its rollouts."""

    path: Path
    split: str | None  # None: from each record ("split"), else "train" for training files
    iteration: int | None  # None: from each record ("iteration"), if any
    training: bool  # rollouts/iter-N.jsonl.gz of the trainer


@dataclass
class Rollout:
    """A trajectory and where it came from, with the trainer's extra fields when present."""

    traj: Trajectory
    split: str
    iteration: int | None
    where: str  # "file:line", for messages
    advantage: float | None = None  # the trainer's advantage (None: not computed)
    kept: bool | None = None  # trained on after the |A| filter (None: not a training rollout)
    learner_logprobs: list[float | None] | None = None  # parallel to traj.tokens
    turn_advantages: list[float] | None = None  # per turn, when the trainer gives them


def find_sources(path: Path) -> list[Source]:
    """Every rollouts file at or below `path`, in (split, iteration, path) order."""
    if not path.exists():
        raise InspectError(f"{path}: no such file or directory")
    if path.is_file():
        if not path.name.endswith((".jsonl", ".jsonl.gz")):
            raise InspectError(
                f"{path}: not a rollouts file (expected .jsonl or .jsonl.gz, a run directory "
                "or an eval directory)"
            )
        return [_source_of(path)]
    found = [_source_of(p) for p in _rollout_files(path, depth=0)]
    if not found:
        raise InspectError(
            f"{path}: no rollouts here (looked for rollouts/iter-N.jsonl.gz, "
            "eval/<split>/rollouts.jsonl and rollouts.jsonl)"
        )
    return sorted(found, key=lambda s: (s.split or "", _order(s.iteration), str(s.path)))


def _rollout_files(folder: Path, depth: int) -> Iterator[Path]:
    if depth > MAX_DEPTH:
        return
    for child in sorted(folder.iterdir()):
        if child.is_dir() and not (child.name.startswith(".") or child.name in NOT_ROLLOUTS):
            yield from _rollout_files(child, depth + 1)
        elif _is_rollouts_file(child):
            yield child


def _is_rollouts_file(path: Path) -> bool:
    """evaluate.py's rollouts.jsonl, or the trainer's rollouts/iter-N.jsonl.gz."""
    if path.name in (EVAL_ROLLOUTS, EVAL_ROLLOUTS + ".gz"):
        return True
    return path.parent.name == ROLLOUTS and ITER_NAME.match(path.name) is not None


def _source_of(path: Path) -> Source:
    """Split and iteration from the file's location (see the module docstring)."""
    if path.parent.name == ROLLOUTS and (m := ITER_NAME.match(path.name)):
        return Source(path, None, int(m.group(1)), training=True)
    folder, iteration = path.parent, None
    if m := ITER_NAME.match(folder.name):
        folder, iteration = folder.parent, int(m.group(1))
    elif m := ITER_NAME.match(path.name):
        iteration = int(m.group(1))
    split = _configured_split(path.parent) or _configured_split(folder)
    if split is None and path.name.startswith("rollouts."):  # evaluate.py's eval/<split>/
        split = folder.name
    elif split is not None and folder.name.startswith(split + "@"):
        split = folder.name  # a sampled pass of that split (eval/<split>@T<t>/)
    return Source(path, split, iteration, training=False)


def _configured_split(folder: Path) -> str | None:
    """`eval.split` of the config.yaml that evaluate.py writes next to its rollouts."""
    data = read_config(folder)
    if data is None:
        return None
    try:
        split = data["eval"]["split"]
    except (KeyError, TypeError):
        return None
    return split if isinstance(split, str) else None


def configured_model(path: Path) -> str | None:
    """`model.name` from the nearest config.yaml at or above `path` (up to the run directory)."""
    folder = path if path.is_dir() else path.parent
    for candidate in (folder, *folder.parents[:4]):
        if (candidate / CONFIG).is_file():
            try:
                name = (read_config(candidate) or {})["model"]["name"]
            except (KeyError, TypeError):
                return None
            return name if isinstance(name, str) else None
    return None


def read_rollouts(source: Source, *, with_tokens: bool = True) -> Iterator[Rollout]:
    """The rollouts of one file, one line at a time. `with_tokens=False` drops the token arrays
    (most of a rollout's size) when only behaviour metrics are wanted."""
    previous: tuple[int, str] | None = None
    for number, line in _numbered_lines(source.path):
        if previous is not None:
            yield _parse(source, *previous, with_tokens=with_tokens, last=False)
        previous = (number, line)
    if previous is not None:
        try:
            yield _parse(source, *previous, with_tokens=with_tokens, last=True)
        except _TruncatedLineError:
            log.warning("%s:%d: incomplete last line skipped", source.path, previous[0])


def _numbered_lines(path: Path) -> Iterator[tuple[int, str]]:
    lines = _gzip_lines(path) if path.name.endswith(".gz") else _text_lines(path)
    try:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                yield number, line
    except UnicodeDecodeError as exc:
        raise InspectError(f"{path}: not UTF-8 text ({exc.reason})") from None
    except OSError as exc:
        raise InspectError(f"{path}: cannot read ({exc.strerror or exc})") from None


def _text_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8") as stream:
        yield from stream


def _gzip_lines(path: Path, chunk_size: int = 1 << 20) -> Iterator[str]:
    """Lines of a gzip file as they decompress, so that a file cut short (a writer that was
    killed) still gives every complete line before the cut."""
    with path.open("rb") as stream:
        if stream.read(2) != b"\x1f\x8b":
            raise InspectError(f"{path}: not a gzip file")
        stream.seek(0)
        inflate, pending = zlib.decompressobj(16 + zlib.MAX_WBITS), b""
        while chunk := stream.read(chunk_size):
            try:
                pending += inflate.decompress(chunk)
            except zlib.error as exc:
                raise InspectError(f"{path}: corrupt gzip data ({exc})") from None
            while inflate.eof and inflate.unused_data:  # concatenated gzip members
                rest = inflate.unused_data
                inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
                pending += inflate.decompress(rest)
            *lines, pending = pending.split(b"\n")
            yield from (line.decode("utf-8") for line in lines)
    if not inflate.eof:
        log.warning("%s: the compressed file ends early; the rollouts before it are read", path)
    if pending:
        yield pending.decode("utf-8", errors="replace")


class _TruncatedLineError(InspectError):
    """The last line of a file is not valid JSON (its writer was interrupted)."""


def _parse(source: Source, number: int, line: str, *, with_tokens: bool, last: bool) -> Rollout:
    where = f"{source.path}:{number}"
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        error = _TruncatedLineError if last else InspectError
        raise error(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise InspectError(f"{where}: expected a JSON object (one rollout), got {type(record)}")
    return parse_record(record, source, where, with_tokens=with_tokens)


def parse_record(
    record: dict[str, Any], source: Source, where: str, *, with_tokens: bool = True
) -> Rollout:
    """One line of a rollouts file as a `Rollout`; unknown keys (newer writers) are ignored."""
    for key in ("task_id", "scenario_id", "difficulty", "sample_index"):
        if key not in record:
            raise InspectError(f"{where}: not a rollout record (no {key!r} key)")
    data = {k: v for k, v in record.items() if k in TRAJECTORY_KEYS}
    if not with_tokens:
        for key in TOKEN_KEYS:
            data.pop(key, None)
    try:
        turns = data.get("turns") or []
        data["turns"] = [{k: v for k, v in t.items() if k in TURN_KEYS} for t in turns]
        traj = Trajectory.from_json(data)
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise InspectError(f"{where}: malformed rollout ({type(exc).__name__}: {exc})") from None
    split = record.get("split") or source.split or ("train" if source.training else "unknown")
    iteration = record.get("iteration", source.iteration)
    learner = record.get("learner_logprobs") if with_tokens else None
    per_turn = record.get("turn_advantages")
    return Rollout(
        traj=traj,
        split=str(split),
        iteration=iteration if isinstance(iteration, int) else source.iteration,
        where=where,
        advantage=record.get("advantage"),
        kept=record.get("kept"),
        learner_logprobs=learner if isinstance(learner, list) and learner else None,
        turn_advantages=per_turn if isinstance(per_turn, list) else None,
    )


def _order(iteration: int | None) -> int:
    return -1 if iteration is None else iteration


def parse_iterations(spec: str) -> tuple[str, set[int]]:
    """`--iteration`: "all", "last", or numbers and ranges ("3", "0,10,20", "0-5")."""
    spec = spec.strip().lower()
    if spec in ("all", "last"):
        return spec, set()
    chosen: set[int] = set()
    for part in spec.split(","):
        low, dash, high = part.strip().partition("-")
        if not low.isdigit() or (dash and not high.isdigit()):
            raise InspectError(
                f"--iteration {spec!r}: expected all, last, N, N,M,... or N-M (e.g. 0-5)"
            )
        chosen.update(range(int(low), int(high if dash else low) + 1))
    return "some", chosen


def select_sources(sources: list[Source], spec: str) -> list[Source]:
    """The sources `--iteration` keeps. "last" keeps, per split (training files count as one
    split), the highest iteration; eval directories without an iteration only go with "all"."""
    mode, chosen = parse_iterations(spec)
    if mode == "all":
        return sources
    numbered = [s for s in sources if s.iteration is not None]
    if mode == "last":
        newest: dict[tuple[bool, str | None], int] = {}
        for s in numbered:
            key = (s.training, s.split)
            newest[key] = max(newest.get(key, -1), s.iteration or 0)
        kept = [s for s in numbered if s.iteration == newest[(s.training, s.split)]]
    else:
        kept = [s for s in numbered if s.iteration in chosen]
    if not kept:
        have = sorted({s.iteration for s in numbered if s.iteration is not None})
        listing = ", ".join(map(str, have[:20])) + (" ..." if len(have) > 20 else "")
        raise InspectError(
            f"--iteration {spec}: no rollouts files for it (iterations here: {listing or 'none'})"
        )
    return kept
