"""The HTML report: one self-contained file (inline CSS and JS, no network).

Layout of the data inside the page, built so that 1,000+ rollouts open without a freeze:

    <script id="index" type="application/json">   small: per-rollout metrics, API-call
                                                   sequences, tasks, API colours, token vocab
    <script id="t-<n>" type="application/gzip-base64">  rollout n's transcript (thought, code,
                                                   observation, calls, tests, token view),
                                                   gzip + base64, decoded only when opened

The summary tables and the before/after charts are plain HTML written here
(`loop.inspect.html_summary`); the task cards, heat maps and transcripts are drawn by the
page's script (`loop.inspect.assets`; styles in `loop.inspect.style`) from the index, a page of
tasks at a time.
"""

from __future__ import annotations

import base64
import colorsys
import gzip
import html
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from loop.inspect.assets import SCRIPT
from loop.inspect.metrics import endpoint, is_execution_error
from loop.inspect.style import CSS
from loop.inspect.summary import Row
from loop.rollout.codeblocks import segments as message_segments
from loop.run.records import Rollout

MAX_ARGUMENT_CHARS = 2000  # a call's arguments, as JSON, in the transcript
ROLLOUT_COLUMNS = (  # per-rollout numbers in the index (and the task cards' tables)
    ("turns", "turns", "assistant turns"),
    ("api_calls", "calls", "API calls that reached the apps"),
    ("failed_api_calls", "failed", "API calls that returned an error"),
    ("show_api_doc", "docs", "apis.api_docs.show_api_doc in the code"),
    ("multi_cell_turns", "multi", "turns with more than one code cell"),
    ("execution_errors", "errors", "turns whose cell failed"),
    ("give_up_failed", "failed eps", "endpoints that failed in a failing turn (give-up rate)"),
    ("give_up_recovered", "recovered", "of those, endpoints later called without an error"),
    ("assume", "assume", "assume/assumed/assuming in the agent's text"),
    ("dummy", "dummy", "'dummy' in the agent's text"),
    ("code_chars", "code", "characters in the agent's code cells"),
)
PLACEHOLDER = re.compile(r"@@(\w+)@@")
Decoder = Callable[[list[int]], list[str]]  # token ids -> their text, one piece per id


@dataclass
class ReportBuilder:
    """Collects rollouts one at a time (so a run never sits in memory) and writes the page."""

    token_budget: int = 500_000  # output tokens with a per-token view, over the whole report
    entries: list[dict[str, Any]] = field(default_factory=list)
    blobs: list[str] = field(default_factory=list)
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    api_names: dict[str, int] = field(default_factory=dict)
    token_ids: set[int] = field(default_factory=set)
    tokens_shown: int = 0
    tokens_left_out: int = 0  # rollouts whose token view did not fit the budget

    def add(self, rollout: Rollout, row: Row, run: int) -> None:
        """Index one rollout and pack its transcript."""
        traj, m = rollout.traj, row.metrics
        calls = traj.api_calls
        context = task_context(rollout)
        self.tasks.setdefault(traj.task_id, {"difficulty": traj.difficulty, "instruction": ""})
        if not self.tasks[traj.task_id]["instruction"]:
            self.tasks[traj.task_id]["instruction"] = instruction_of(context)
        tokens = self._token_view_fits(rollout)
        self.entries.append({
            "id": len(self.entries), "run": run, "task": traj.task_id, "split": rollout.split,
            "it": rollout.iteration, "k": traj.sample_index, "d": traj.difficulty,
            "st": traj.status, "ok": traj.success, "r": _finite(traj.reward),
            "seq": [self._api(endpoint(c)) for c in calls],
            "bad": [i for i, c in enumerate(calls) if not c.get("ok", False)],
            "m": [getattr(m, key) for key, _, _ in ROLLOUT_COLUMNS],
            "adv": _finite(rollout.advantage), "kept": rollout.kept, "tok": tokens,
        })  # fmt: skip
        self.blobs.append(pack(transcript(rollout, context, with_tokens=tokens)))
        if tokens:
            for turn in traj.turns:
                self.token_ids.update(traj.tokens[turn.output_start : turn.output_end])

    def _token_view_fits(self, rollout: Rollout) -> bool:
        traj = rollout.traj
        if not traj.tokens:
            return False
        count = sum(turn.output_end - turn.output_start for turn in traj.turns)
        if self.tokens_shown + count > self.token_budget:
            self.tokens_left_out += 1
            return False
        self.tokens_shown += count
        return True

    def _api(self, name: str) -> int:
        return self.api_names.setdefault(name, len(self.api_names))

    def render(
        self, *, title: str, runs: list[dict[str, str]], summary: str, decode: Decoder | None
    ) -> str:
        """The whole page. `decode` turns token ids into text for the token view (None: ids)."""
        vocab: dict[str, str] = {}
        if decode is not None and self.token_ids:
            ids = sorted(self.token_ids)
            vocab = {str(i): piece for i, piece in zip(ids, decode(ids), strict=True)}
        names = sorted(self.api_names, key=self.api_names.__getitem__)
        index = {
            "title": title,
            "runs": runs,
            "apis": [[name, color] for name, color in zip(names, api_colors(names), strict=True)],
            "tasks": self.tasks,
            "columns": [label for _, label, _ in ROLLOUT_COLUMNS],
            "columnDocs": {label: doc for _, label, doc in ROLLOUT_COLUMNS},
            "rollouts": self.entries,
            "vocab": vocab,
            "tokenNote": self._token_note(decode is not None),
        }
        blobs = "\n".join(
            f'<script id="t-{i}" type="application/gzip-base64">{blob}</script>'
            for i, blob in enumerate(self.blobs)
        )
        parts = {
            "title": html.escape(title),
            "css": CSS,
            "summary": summary,
            "index": embed_json(index),
            "blobs": blobs,
            "script": SCRIPT,
        }
        return PLACEHOLDER.sub(lambda m: parts[m.group(1)], PAGE)  # one pass: no re-scanning

    def _token_note(self, decoded: bool) -> str:
        notes = []
        if not decoded:
            notes.append("token ids are shown as numbers (no tokenizer; see --tokenizer)")
        if self.tokens_left_out:
            notes.append(
                f"{self.tokens_left_out} rollouts have no token view: the report's budget of "
                f"{self.token_budget:,} output tokens was spent (see --token-budget)"
            )
        return "; ".join(notes)


def transcript(rollout: Rollout, context: str, *, with_tokens: bool) -> dict[str, Any]:
    """Everything the transcript viewer shows of one rollout (packed per rollout)."""
    traj = rollout.traj
    turns = []
    for turn in traj.turns:
        item: dict[str, Any] = {
            "segs": segments(turn.text),
            "finish": turn.finish_reason,
            "obs": turn.observation,
            "failed": is_execution_error(turn),
            "error": turn.error,
            "calls": [_call(c) for c in turn.api_calls],
        }
        if with_tokens:
            item["tok"] = token_view(rollout, turn.output_start, turn.output_end)
        turns.append(item)
    in_turns = sum(len(t.api_calls) for t in traj.turns)
    return {
        "context": context,
        "turns": turns,
        "tests": traj.tests,
        "error": traj.error,
        "outside": [_call(c) for c in traj.api_calls[in_turns:]],  # calls no turn recorded
        "where": rollout.where,
        "turnAdvantages": [_finite(x) for x in rollout.turn_advantages or []] or None,
        "tokens": len(traj.tokens),
        "outputTokens": sum(traj.is_output),
    }


def segments(text: str) -> list[list[str]]:
    """An agent message cut into ["t", prose] and ["c", code] pieces, in order."""
    return [[kind, body] for kind, body in message_segments(text)]


def token_view(rollout: Rollout, start: int, end: int) -> dict[str, Any]:
    """One turn's sampled tokens: ids, sampler and learner log-probs, and which were trained.

    Trained = in the loss mask (`is_output`) and, for a training rollout, kept by the |A|
    filter; an evaluation rollout shows its loss mask. Log-probs are rounded to 1e-4.
    """
    traj = rollout.traj
    learner = rollout.learner_logprobs
    mask = [bool(x) and rollout.kept is not False for x in traj.is_output[start:end]]
    return {
        "ids": traj.tokens[start:end],
        "lp": [_round(x) for x in traj.sampler_logprobs[start:end]],
        "ll": None if learner is None else [_round(x) for x in learner[start:end]],
        "mask": None if all(mask) else "".join("1" if x else "0" for x in mask),
    }


def task_context(rollout: Rollout) -> str:
    """The last opening message (the task as the agent saw it), or "" if none was kept."""
    traj = rollout.traj
    in_turns = len(traj.turns) + sum(t.observation is not None for t in traj.turns)
    opening = traj.messages[: max(0, len(traj.messages) - in_turns)]
    return str(opening[-1].get("content", "")) if opening else ""


def instruction_of(context: str) -> str:
    """The line after the last "Task: " of the task context (the instruction)."""
    _, found, rest = context.rpartition("Task: ")
    return rest.strip().splitlines()[0] if found and rest.strip() else ""


def api_colors(names: Sequence[str]) -> list[str]:
    """A colour per "app.api": a hue per app, spread evenly; lightness varies within an app."""
    apps = sorted({name.split(".", 1)[0] for name in names})
    hue = {app: i / max(1, len(apps)) for i, app in enumerate(apps)}
    siblings = {app: sorted(n for n in names if n.split(".", 1)[0] == app) for app in apps}
    colors = []
    for name in names:
        app = name.split(".", 1)[0]
        rank, count = siblings[app].index(name), len(siblings[app])
        light = 0.35 + 0.35 * (rank / (count - 1) if count > 1 else 0.5)
        saturation = 0.85 if rank % 2 == 0 else 0.6
        r, g, b = colorsys.hls_to_rgb(hue[app], light, saturation)
        colors.append(f"#{round(r * 255):02x}{round(g * 255):02x}{round(b * 255):02x}")
    return colors


def pack(data: Any) -> str:
    """JSON, gzip, base64: what the page's `unpack` reverses (DecompressionStream)."""
    raw = json.dumps(data, separators=(",", ":"), allow_nan=False).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def embed_json(data: Any) -> str:
    """JSON that is safe inside a <script> element (no "</script>", no "<!--")."""
    return json.dumps(data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _call(call: dict[str, Any]) -> dict[str, Any]:
    args = json.dumps(call.get("arguments", {}), default=str, ensure_ascii=False)
    if len(args) > MAX_ARGUMENT_CHARS:
        args = args[:MAX_ARGUMENT_CHARS] + f" ... ({len(args) - MAX_ARGUMENT_CHARS} more chars)"
    latency = call.get("latency_s")
    return {
        "ep": endpoint(call),
        "args": args,
        "ok": bool(call.get("ok", False)),
        "error": call.get("error"),
        "ms": None if not isinstance(latency, int | float) else round(latency * 1000, 2),
    }


def _round(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else round(float(x), 4)


def _finite(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(x) else None


PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@@title@@</title>
<style>@@css@@</style>
</head>
<body>
<header><h1>@@title@@</h1></header>
<main>
<section id="summary">@@summary@@</section>
<section id="explore">
<h2>Tasks: API-call heat maps and transcripts</h2>
<div id="filters"></div>
<div id="status" class="note"></div>
<div id="cards"></div>
<button id="more" type="button" hidden>show more tasks</button>
</section>
</main>
<script id="index" type="application/json">@@index@@</script>
@@blobs@@
<script>@@script@@</script>
</body>
</html>
"""
