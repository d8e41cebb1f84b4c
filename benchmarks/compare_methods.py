"""The LOOP paper's Table 1 RL and preference rows and Verlog on the same tasks and seeds.

    python benchmarks/compare_methods.py                       # quickstart scale (the app world)
    python benchmarks/compare_methods.py --synthetic           # the trainer tests' word task
        [--rows loop-token grpo ...] [--seeds 0 1] [--iterations N]

Each row is a config file: its own `train`, `critic` and `agent.memory_turns` keys (those of
configs/table1/<row>.yaml, or configs/verlog.yaml, following `base` only inside those files)
applied on top of the scale's settings, so a row here runs the same algorithm as its config at
the paper's scale. Scale keys (iterations, tasks and rollouts per iteration, minibatch size,
learning rate, ...) come from the scale, never from the row. The critic warm-up is shortened to
1 iteration (the paper's 10 would be the whole run).

Scales:
- quickstart: `configs/quickstart.yaml` (SmolLM2-135M, LoRA, the built-in app world), each row
  a `train.py` run in its own process; about 15 minutes per row and seed on 2 cores. A 135M
  model hardly solves a task, so expect close rewards.
- --synthetic: the word task of tests/loop/synthetic.py (reward = share of emitted words in a
  target set, which a policy can learn in a few iterations) with the tiny random Llama under a
  LoRA adapter (rank 16) and the learning settings of tests/loop/test_trainer.py, in process;
  seconds per row.

Printed per row: the mean rollout reward of the first and the last iteration and the success
rate of the last, averaged over the seeds, and the wall time. DPO-MCTS trains on pairs from its
tree searches, not on K rollouts: its reward is the mean return of its searches' rollouts
(`search/return_mean`, the policy's samples), and its success rate is not recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's loop/ and tests/

ROWS = {
    "loop-token": "configs/table1/loop-token.yaml",
    "loop-turn": "configs/table1/loop-turn.yaml",
    "loop-bandit": "configs/table1/loop-bandit.yaml",
    "loop-rwnorm": "configs/table1/loop-rwnorm.yaml",
    "rloo": "configs/table1/rloo.yaml",
    "grpo": "configs/table1/grpo.yaml",
    "grpo-no-kl": "configs/table1/grpo-no-kl.yaml",
    "ppo-critic": "configs/table1/ppo-critic.yaml",
    "dmpo": "configs/table1/dmpo.yaml",
    "dpo-mcts": "configs/table1/dpo-mcts.yaml",
    "verlog": "configs/verlog.yaml",
}
# Keys that set the scale of a run, not its algorithm: taken from the scale, never from a row.
SCALE_KEYS = {
    "iterations", "split", "max_difficulty", "tasks_per_iteration", "rollouts_per_task",
    "max_concurrent_rollouts", "rollouts_fraction", "min_rollouts_per_task", "minibatch_size",
    "micro_batch_size", "lr", "max_grad_norm", "max_seq_len", "logprob_chunk_size",
    "stress_test", "eval_every", "checkpoint_every", "keep_checkpoints", "keep_every",
    "tensorboard",
}  # fmt: skip
SHORT_WARMUP = 1  # critic warm-up iterations at these scales


def row_overrides(row: str) -> list[str]:
    """The row's algorithm as `key=value` overrides (its train, critic and memory keys)."""
    row_files = {(ROOT / f).resolve() for f in ROWS.values()}
    path, chain = (ROOT / ROWS[row]).resolve(), []
    while True:  # the row's file, then its base while that is another row's file
        loaded = yaml.safe_load(path.read_text()) or {}
        chain.append(loaded)
        base = loaded.get("base")
        if base is None or (path.parent / base).resolve() not in row_files:
            break
        path = (path.parent / base).resolve()
    data: dict[str, Any] = {}
    for loaded in reversed(chain):  # the base first, the row's own keys on top
        for section in ("train", "critic"):
            for key, value in (loaded.get(section) or {}).items():
                if section == "critic" or key not in SCALE_KEYS:
                    data[f"{section}.{key}"] = value
        memory = (loaded.get("agent") or {}).get("memory_turns")
        if memory is not None:
            data["agent.memory_turns"] = memory
    if "critic.warmup_iterations" in data:
        data["critic.warmup_iterations"] = SHORT_WARMUP
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in data.items()]


def run_quickstart(row: str, seed: int, iterations: int | None, out: Path) -> list[dict]:
    """One `train.py` run of the row on the quickstart config; its metrics records."""
    name = f"{row}-seed{seed}"
    extra = [f"train.iterations={iterations}"] if iterations else []
    command = [
        sys.executable, str(ROOT / "train.py"), "--config", str(ROOT / "configs/quickstart.yaml"),
        f"output_dir={out}", f"name={name}", f"seed={seed}", "train.eval_every=0",
        # every row the paper's way (a critic needs the pass)
        "train.off_policy.old_logprobs=recompute",
        *row_overrides(row), *extra,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{row}: train.py failed: {done.stderr.strip()[-800:]}")
    return _records(out / name)


def run_synthetic(row: str, seed: int, iterations: int | None, out: Path) -> list[dict]:
    """The row on the synthetic word task with a LoRA adapter on the tiny Llama, in process."""
    import torch
    from peft import LoraConfig, get_peft_model

    from loop.config import load_config
    from loop.generators.hf.generator import HFGenerator
    from loop.parts import TrainParts
    from loop.trainer import train
    from tests.loop.synthetic import NoSandboxPool, WordSuite, synthetic_policy
    from tests.loop.test_trainer import SYNTHETIC

    name = f"{row}-seed{seed}"
    scale = [a for a in SYNTHETIC if not a.startswith("model.lora_rank")]
    config = load_config(None, [
        f"output_dir={out}", f"name={name}", f"seed={seed}", *scale, "model.lora_rank=16",
        "train.lr=0.01", "critic.lr=0.01", f"train.iterations={iterations or 6}",
        *row_overrides(row),
    ])  # fmt: skip
    torch.manual_seed(seed)
    policy = synthetic_policy(seed=seed)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    policy.model = get_peft_model(policy.model, lora)
    parts = TrainParts(policy, HFGenerator(policy, max_batch_size=16), policy.tokenizer,
                       WordSuite(), NoSandboxPool())  # fmt: skip
    train(config, parts, show_progress=False)
    return _records(out / name)


def reward(record: dict) -> float:
    """The iteration's mean reward of the policy's samples (DPO-MCTS: its searches')."""
    return record.get("search/return_mean", record["rollout/reward_mean"])


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "rollout/reward_mean" in r]


def main() -> int:
    """Run every row for every seed, then print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--iterations", type=int, help="iterations per run (default: the scale's)")
    parser.add_argument("--synthetic", action="store_true", help="the tests' word task")
    parser.add_argument("--out", type=Path, help="keep the runs here (default: a temp dir)")
    args = parser.parse_args()
    run = run_synthetic if args.synthetic else run_quickstart
    scale = "synthetic word task, tiny Llama + LoRA r16" if args.synthetic else "quickstart"
    print(f"# {scale}; seeds {args.seeds}; critic warm-up 1 iteration", flush=True)
    header = "| row | overrides | reward first | reward last | success last | time |"
    lines = [header, "|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out or Path(tmp)
        for row in args.rows:
            started = time.monotonic()
            runs = [run(row, seed, args.iterations, out) for seed in args.seeds]
            first = statistics.mean(reward(r[0]) for r in runs)
            last = statistics.mean(reward(r[-1]) for r in runs)
            success = statistics.mean(
                math.nan
                if "search/return_mean" in r[-1]
                else r[-1].get("rollout/success_rate", math.nan)
                for r in runs
            )
            keys = " ".join(row_overrides(row)) or "(the defaults)"
            lines.append(f"| {row} | `{keys}` | {first:.3f} | {last:.3f} | {success:.3f} | "
                         f"{time.monotonic() - started:.0f} s |")  # fmt: skip
            print(lines[-1], flush=True)
    print()
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
