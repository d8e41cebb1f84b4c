"""`python -m loop.inspect PATH [--compare OTHER] [--task ID] [--html OUT] ...`

Reads the rollouts under PATH (a run directory, an eval directory or a rollouts file, see
`loop.run.records`), prints the behaviour metrics as tables, and with `--html` writes the
report. Every input problem is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from difflib import get_close_matches
from pathlib import Path

from loop.inspect import terminal
from loop.inspect.html import Decoder, ReportBuilder
from loop.inspect.html_summary import summary_html
from loop.inspect.picture import plot_changes
from loop.inspect.summary import (
    Aggregate,
    Intervals,
    Run,
    by_iteration,
    by_task,
    change_intervals_of,
    iterations,
    overview,
    to_row,
)
from loop.run.records import (
    InspectError,
    configured_model,
    find_sources,
    read_rollouts,
    select_sources,
)
from loop.run.rundir import iteration_of

log = logging.getLogger("loop.inspect")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (see docs/inspect.md)."""
    p = argparse.ArgumentParser(
        prog="python -m loop.inspect",
        description="Per-rollout API-call behaviour of a run: tables, and an HTML report.",
    )
    p.add_argument("path", type=Path, help="run directory, eval directory or rollouts file")
    p.add_argument("--compare", type=Path, metavar="OTHER", help="a second PATH: before/after")
    p.add_argument("--task", help="only this task id, scenario id or glob (e.g. 'music_*')")
    p.add_argument("--split", help="only rollouts of this split (train, dev, ...)")
    p.add_argument(
        "--iteration", default="all",
        help="training iterations to read: all (default), last, N, N,M or N-M",
    )  # fmt: skip
    p.add_argument("--compare-iteration", help="--iteration for OTHER (default: the same)")
    p.add_argument("--html", type=Path, metavar="OUT", help="write the HTML report here")
    p.add_argument("--json", type=Path, metavar="OUT", help="write the metrics as JSON here")
    plot = "with --compare: draw each change with its interval beside the paper's (PNG)"
    p.add_argument("--plot", type=Path, metavar="OUT", help=plot)
    p.add_argument("--per-task", action="store_true", help="also print a table per task")
    p.add_argument(
        "--tokenizer", metavar="NAME",
        help="tokenizer for the token view (default: model.name of the run's config.yaml; "
        "'none' shows token ids)",
    )  # fmt: skip
    p.add_argument(
        "--token-budget", type=int, default=500_000, metavar="N",
        help="output tokens with a per-token view in the report (default 500000; 0: none)",
    )  # fmt: skip
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the inspector; returns the exit status."""
    logging.basicConfig(level=logging.WARNING, format="loop.inspect: warning: %(message)s")
    args = parse_args(argv)
    try:
        return run(args)
    except InspectError as exc:
        print(f"loop.inspect: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def run(args: argparse.Namespace) -> int:
    """Read, summarise, print, write."""
    started = time.monotonic()
    for out in (args.html, args.json, args.plot):
        if out is not None and not out.parent.is_dir():
            raise InspectError(f"cannot write {out}: directory {out.parent} does not exist")
    if args.plot is not None and args.compare is None:
        raise InspectError("--plot draws a before/after comparison: give --compare OTHER too")
    builder = ReportBuilder(token_budget=max(0, args.token_budget)) if args.html else None
    specs = [(args.path, args.iteration)]
    if args.compare is not None:
        specs.append((args.compare, args.compare_iteration or args.iteration))
    runs = [_read(path, spec, args, builder, index) for index, (path, spec) in enumerate(specs)]
    if len(runs) == 2 and runs[0].label == runs[1].label:
        runs[0].label, runs[1].label = f"{runs[0].label} [1]", f"{runs[1].label} [2]"
    compared = comparison(runs) if len(runs) == 2 else None
    print(report_text(runs, compared, per_task=args.per_task or args.task is not None))
    if args.plot is not None and compared is not None:
        print(f"picture in {plot_changes(*compared, args.plot)}")
    if args.json is not None:
        _write(args.json, json.dumps(metrics_json(runs), indent=2) + "\n")
        print(f"metrics in {args.json}")
    if builder is not None:
        decode = _decoder(args) if builder.token_ids else None
        title = "Rollouts: " + " vs ".join(run.label for run in runs)
        page = builder.render(
            title=title,
            runs=[{"label": run.label, "path": run.path} for run in runs],
            summary=summary_html(runs),
            decode=decode,
        )
        _write(args.html, page)
        size = len(page.encode()) / 1e6
        print(f"report in {args.html} ({size:.1f} MB, {time.monotonic() - started:.1f} s)")
    return 0


def _read(
    path: Path, spec: str, args: argparse.Namespace, builder: ReportBuilder | None, index: int
) -> Run:
    """One PATH's rollouts as rows (and into the report), filtered by split and task."""
    sources = select_sources(find_sources(path), spec)
    run = Run(label=label_of(path, spec), path=str(path))
    seen_tasks: set[str] = set()
    for source in sources:
        if args.split and source.split not in (None, args.split):
            continue
        tokens = builder is not None and builder.token_budget > 0  # else skip the big arrays
        for rollout in read_rollouts(source, with_tokens=tokens):
            if args.split and rollout.split != args.split:
                continue
            seen_tasks.add(rollout.traj.task_id)
            if args.task and not task_matches(
                args.task, rollout.traj.task_id, rollout.traj.scenario_id
            ):
                continue
            row = to_row(rollout)
            run.rows.append(row)
            if builder is not None:
                builder.add(rollout, row, index)
    if not run.rows:
        raise InspectError(_nothing_found(path, args, seen_tasks))
    return run


def task_matches(pattern: str, task_id: str, scenario_id: str) -> bool:
    """`--task`: a task id, a scenario id (all its variants) or a glob over task ids."""
    return pattern in (task_id, scenario_id) or fnmatch.fnmatchcase(task_id, pattern)


def _nothing_found(path: Path, args: argparse.Namespace, seen_tasks: set[str]) -> str:
    if args.task and seen_tasks:
        close = get_close_matches(args.task, sorted(seen_tasks), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        return f"{path}: no rollouts of task {args.task!r}{hint}"
    if args.split:
        return f"{path}: no rollouts of split {args.split!r}"
    return f"{path}: the rollouts files are empty"


def label_of(path: Path, spec: str) -> str:
    """A short name for PATH: the run's name, plus the split for an eval directory."""
    p = path.resolve()
    if p.is_file():
        name = p.name.removesuffix(".gz").removesuffix(".jsonl")
        label = _folder_label(p.parent) if name == "rollouts" else name
        if p.parent.name == "rollouts":
            label = f"{p.parent.parent.name}/{name}"
    else:
        label = _folder_label(p)
    return label if spec == "all" else f"{label} ({spec})"


def _folder_label(folder: Path) -> str:
    if folder.parent.name == "eval":  # runs/<name>/eval/<split>
        return f"{folder.parent.parent.name}/{folder.name}"
    if iteration_of(folder.name) is not None and folder.parent.parent.name == "eval":
        return f"{folder.parent.parent.parent.name}/{folder.parent.name}/{folder.name}"
    if folder.name in ("eval", "rollouts"):
        return f"{folder.parent.name}/{folder.name}"
    return folder.name


Comparison = tuple[tuple[str, str], Aggregate, Aggregate, Intervals]


def comparison(runs: Sequence[Run]) -> Comparison:
    """Two runs' labels, their overall metrics and each change's interval (None: no task in
    both), for the table and the picture."""
    before, after = (overview(run.rows)[0][1] for run in runs)
    labels = (runs[0].label, runs[1].label)
    return labels, before, after, change_intervals_of(runs[0].rows, runs[1].rows)


def report_text(runs: Sequence[Run], compared: Comparison | None, *, per_task: bool) -> str:
    """What the terminal shows (`compared`: the two runs' `comparison`)."""
    out = []
    for run in runs:
        tasks = len({row.task_id for row in run.rows})
        counts = f"{terminal.plural(len(run.rows), 'rollout')} of {terminal.plural(tasks, 'task')}"
        out.append(f"{run.label}: {counts} from {run.path}")
    if compared is not None:
        out += ["", terminal.compare_table(*compared)]
        if compared[3] is None:
            out.append("(no task in both: no intervals)")
        return "\n".join(out)
    run = runs[0]
    out += ["", terminal.metrics_table(overview(run.rows))]
    if len(iterations(run.rows)) > 1:
        out += ["", terminal.groups_table(by_iteration(run.rows), "iteration")]
    if per_task:
        out += ["", terminal.groups_table(by_task(run.rows), "task")]
    if per_task and len(run.rows) <= 200:
        out += ["", terminal.rollouts_table(run.rows)]
    return "\n".join(out)


def metrics_json(runs: Sequence[Run]) -> dict[str, object]:
    """`--json`: every table of every run, keyed by group."""
    return {
        "runs": [
            {
                "label": run.label,
                "path": run.path,
                "overview": dict(overview(run.rows)),
                "per_iteration": dict(by_iteration(run.rows)),
                "per_task": dict(by_task(run.rows)),
            }
            for run in runs
        ]
    }


def _decoder(args: argparse.Namespace) -> Decoder | None:
    """Token ids -> text with the run's tokenizer, from local files only (never the network).

    The `tokenizers` library reads a model's tokenizer.json in well under a second; importing
    transformers (the fallback, for tokenizers without that file) can take many seconds.
    """
    name = args.tokenizer or configured_model(args.path)
    if name is None or name.lower() == "none":
        return None
    try:
        from loop.model.aliases import resolve_model

        location = resolve_model(name)
        file = _tokenizer_json(location)
        if file is not None:
            from tokenizers import Tokenizer

            fast = Tokenizer.from_file(str(file))
            return lambda ids: [fast.decode([i], skip_special_tokens=False) for i in ids]
        from transformers import AutoTokenizer

        slow = AutoTokenizer.from_pretrained(location, local_files_only=True)
        return lambda ids: [str(slow.decode([i], clean_up_tokenization_spaces=False)) for i in ids]
    except Exception as exc:  # any failure only costs the token text, never the report
        log.warning("token view shows ids: cannot load tokenizer %r (%s)", name, exc)
        return None


def _tokenizer_json(location: str) -> Path | None:
    """tokenizer.json of a local model directory or of a hub model in the local cache."""
    if Path(location).is_dir():
        file = Path(location) / "tokenizer.json"
        return file if file.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(location, "tokenizer.json")
    return Path(cached) if isinstance(cached, str) else None


def _write(path: Path, text: str) -> None:
    """Write atomically (a reader never sees half a report)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
