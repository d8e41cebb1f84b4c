"""An evaluation a kill interrupted keeps what it finished: the trainer's rerun rolls out only
the rest (its policy is the checkpoint's the interrupted one had), and a run killed in its final
evaluation finishes it when launched again; a change to what the rollouts depend on (model,
agent, eval, suite, seed), or evaluate.py without `--resume` (it may load another checkpoint into
the same folder), rolls everything out anew.

Run: python -m pytest tests/loop/test_evaluation_resume.py -q   (fast; no model, no sandbox)
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from loop.config import RunConfig, load_config
from loop.evaluation import run_evaluation
from loop.generators.base import Generation, SamplingParams
from tests.loop.synthetic import NoSandboxPool, WordSuite, code_word_tokenizer, run_synthetic

SETTINGS = [
    "eval.split=dev", "eval.rollouts_per_task=4", "agent.max_turns=1", "agent.max_new_tokens=6",
    "agent.max_context_tokens=4000",
]  # fmt: skip


class Calls:
    """A generator stand-in answering two words and a stop; it counts its calls (one a rollout:
    one turn each)."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, **_: Any
    ) -> Generation:
        self.calls += 1
        return Generation([10, 20, params.stop_token_ids[0]], [-0.5, -0.5, -0.5], "stop")


def evaluate(config: RunConfig, out: Path, resume: bool) -> tuple[int, dict[str, float]]:
    """One pass into `out`: the rollouts it rolled out and its metrics."""
    generator = Calls()
    evaluation = run_evaluation(
        config, suite=WordSuite(), pool=NoSandboxPool(),
        generator=generator, tokenizer=code_word_tokenizer(),  # type: ignore[arg-type]
        out_dir=out, show_progress=False, resume=resume,
    )  # fmt: skip
    metrics = asyncio.run(evaluation)
    return generator.calls, metrics


def kill_after(out: Path, finished: int) -> list[str]:
    """The pass in `out` as a kill leaves it: `finished` rollouts written, the next one cut short,
    no metrics; the finished lines."""
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    (out / "rollouts.jsonl").write_text("\n".join(lines[:finished]) + "\n" + lines[finished][:40])
    (out / "metrics.json").unlink()
    return lines[:finished]


def test_a_rerun_keeps_the_interrupted_passs_finished_rollouts_and_rolls_out_the_rest(
    tmp_path: Path,
) -> None:
    config = load_config(None, SETTINGS)
    out = tmp_path / "dev"
    rolled, whole = evaluate(config, out, resume=True)
    total = int(whole["eval/rollouts"])
    assert rolled == total > 3
    kept = kill_after(out, 3)
    rolled, metrics = evaluate(config, out, resume=True)
    assert rolled == total - 3
    assert metrics == whole
    lines = (out / "rollouts.jsonl").read_text().splitlines()
    assert lines[:3] == kept  # kept as they were, the cut line gone
    pairs = [(r["task_id"], r["sample_index"]) for r in map(json.loads, lines)]
    assert len(pairs) == len(set(pairs)) == total
    assert json.loads((out / "metrics.json").read_text()) == whole


def test_other_rollout_settings_or_no_resume_roll_everything_out_anew(tmp_path: Path) -> None:
    config = load_config(None, SETTINGS)
    out = tmp_path / "dev"
    total, _ = evaluate(config, out, resume=True)
    kill_after(out, 3)
    assert evaluate(config, out, resume=False)[0] == total  # evaluate.py's without --resume
    kill_after(out, 3)
    other = load_config(None, [*SETTINGS, "agent.temperature=0.5"])
    assert evaluate(other, out, resume=True)[0] == total
    assert len((out / "rollouts.jsonl").read_text().splitlines()) == total
    kill_after(out, 3)  # a section the rollouts do not depend on (or a key added to it since)
    learning = load_config(None, [*SETTINGS, "agent.temperature=0.5", "train.lr=0.5"])
    assert evaluate(learning, out, resume=True)[0] == total - 3


def test_a_run_killed_in_its_final_evaluation_finishes_it_when_launched_again(
    tmp_path: Path,
) -> None:
    extra = ["train.eval_every=1", "eval.split=dev", "eval.rollouts_per_task=2"]
    first = run_synthetic(tmp_path, 1, *extra)
    final = tmp_path / "synth" / "eval" / "dev" / "iter-1"
    kept = kill_after(final, 2)
    log = tmp_path / "synth" / "metrics.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in first[:-1]))  # the final line unwritten
    again = run_synthetic(tmp_path, 1, *extra)
    assert again[-1]["iteration"] == 1
    assert again[-1]["eval/rollouts"] == first[-1]["eval/rollouts"]
    assert (final / "metrics.json").is_file()
    assert (final / "rollouts.jsonl").read_text().splitlines()[:2] == kept
    rollouts = (final / "rollouts.jsonl").read_text()
    once_more = run_synthetic(tmp_path, 1, *extra)  # a finished run: its evaluation read again
    assert len(once_more) == len(again)
    assert {k: v for k, v in once_more[-1].items() if k.startswith("eval/")} == {
        k: v for k, v in again[-1].items() if k.startswith("eval/")
    }
    assert (final / "rollouts.jsonl").read_text() == rollouts
