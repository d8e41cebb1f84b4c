"""train.py end to end, as a user runs it: the real SmolLM2, real sandboxes, real files.

Run: python -m pytest tests/test_train_cli.py       (slow: a few minutes on 2 cores)

One short iteration of the quickstart config (hf samples with the training model), then
evaluate.py with the checkpoint's adapter, which is how users evaluate what they trained: its
rollouts, metrics and summary table, greedy and sampled, in one run. The vLLM server backend's
train.py run (the new LoRA adapter published after each iteration) is the rehearsal of the
32B node, tests/test_rehearsal.py.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
SHORT = [
    "train.iterations=1", "train.tasks_per_iteration=2", "train.rollouts_per_task=2",
    "train.min_rollouts_per_task=2", "train.rollouts_fraction=1.0", "train.eval_every=0",
    "train.max_seq_len=2048", "train.minibatch_size=2", "agent.max_turns=1",
    "agent.max_new_tokens=32", "agent.max_context_tokens=2048", "train.tensorboard=true",
    # SmolLM2 scores the same 0.5 on every rollout, so every advantage is 0; a zero threshold
    # keeps them anyway, so the recompute, the learner step and the weight sync all run.
    "train.adv_threshold=0",
    # The quickstart's warm start and learner settings (tests/loop/test_finetune.py covers the
    # warm start): none here, two epochs, so two minibatches of two make four steps.
    "warm_start.source=none", "train.epochs=2",
    # nothing to replay without a warm start; no evaluation pass (train.eval_every=0)
    "train.replay.coef=0", "eval.sampled_rollouts_per_task=0",
    "train.stress_test=true",  # the quickstart skips it; this run checks it still works
    # the learner's recompute, compared with the sampler's (the quickstart takes the hf
    # engine's own; tests/loop/test_trainer.py checks that way)
    "train.off_policy.old_logprobs=recompute",
]  # fmt: skip


def run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, script, *args], capture_output=True, text=True, cwd=ROOT, timeout=1200
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_train_one_iteration_then_evaluate_the_checkpoint(tmp_path: Path) -> None:
    done = run("train.py", "--config", str(QUICKSTART), f"output_dir={tmp_path}", *SHORT)
    assert done.returncode == 0, done.stderr[-3000:]
    run_dir = tmp_path / "quickstart"
    (record,) = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert record["rollout/count"] == 4 and record["rollout/infra_failures"] == 0, record
    assert record["rollout/kept"] == 4 and record["learn/optimizer_steps"] == 4, record
    assert record["recompute/tokens"] > 0  # the sampler's log-probs were compared
    # hf samples with the very model the learner recomputes with: the same numbers up to
    # float noise of batching (padding) and of the eval-mode forward.
    assert record["recompute/abs_logprob_diff_max"] < 1e-3, record
    assert "stress test: 2048 tokens" in done.stderr
    assert "iter 1/1 | reward" in done.stderr  # the one-line summary
    adapter = run_dir / "checkpoints" / "iter-1" / "adapter"
    assert (adapter / "adapter_model.safetensors").is_file()
    assert (adapter / "adapter_config.json").is_file()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    with gzip.open(run_dir / "rollouts" / "iter-0.jsonl.gz", "rt") as lines:
        rollouts = [json.loads(line) for line in lines]
    assert len(rollouts) == 4 and all("kept" in r and "advantage" in r for r in rollouts)

    # the checkpoint evaluated as users do (its directory: the adapter in it is meant), greedy
    # and sampled passes in one run
    evaluated = run(
        "evaluate.py", "--config", str(QUICKSTART), "--split", "dev", "--limit", "2",
        "--rollouts-per-task", "1", "--checkpoint", str(adapter.parent), f"output_dir={tmp_path}",
        "agent.max_turns=2", "agent.max_new_tokens=48", "eval.sampled_rollouts_per_task=1",
    )  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert_evaluated(run_dir / "eval", evaluated.stdout)


def assert_evaluated(eval_dir: Path, stdout: str) -> None:
    """evaluate.py's files and summary: 2 dev tasks, greedy (dev) and sampled (dev@T1)."""
    out = eval_dir / "dev"
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert rollout["status"] in {"ok", "max_turns", "context_exhausted"}, rollout["error"]
        assert rollout["reward"] is not None and rollout["num_output_tokens"] > 0
        assert rollout["tests"] and rollout["turns"]
    metrics = json.loads((out / "metrics.json").read_text())
    for key in (
        "eval/tgc",
        "eval/sgc",
        "eval/pass@1",
        "eval/reward_mean",
        "eval/difficulty_1/success_rate",
        "eval/api_calls_mean",
        "eval/infra_failures",
    ):
        assert key in metrics, key
    assert metrics["eval/infra_failures"] == 0
    assert "eval/tgc" in stdout  # the summary table
    assert (out / "config.yaml").is_file()
    # the sampled pass, in the same run: its own folder, its rollouts at temperature 1
    sampled = eval_dir / "dev@T1"
    assert len((sampled / "rollouts.jsonl").read_text().splitlines()) == 2
    assert json.loads((sampled / "metrics.json").read_text())["eval/infra_failures"] == 0
    assert "eval/sampled/tgc" in stdout
