"""The LOOP paper's Table 1 training rows and Verlog: one resumable comparison, held out.

    python benchmarks/compare_methods.py --out runs/table1 [--rows loop-token grpo ...]
        [--seeds 0 1] [--iterations N] [--max-minutes 30] [--plot]
    python benchmarks/compare_methods.py --synthetic --out /tmp/table1-word   # seconds per row

Each row is a config file: its own `train`, `critic`, `agent.memory_turns` and warm-start
method keys (those of configs/table1/<row>.yaml, or configs/verlog.yaml, following `base` only
inside those files) applied on top of the scale's settings, so a row runs the same algorithm
as its config at the paper's scale. Scale keys (iterations, tasks and rollouts per iteration,
minibatch size, learning rates, epochs, ...) come from the scale, never from the row.

Same start, same budget:
- every RL and preference row starts from the quickstart's warm start (one epoch on the gold
  solutions of `easy`). loop/warmstart.py caches it under `$LOOP_CACHE_DIR/warm-start/<key>/`,
  the key hashing the model, LoRA, warm-start, agent and seed settings, so the first row of a
  seed trains it and every later row of that seed loads it (`warm_start/cached` in the JSONL).
  Verlog's memory window (agent.memory_turns 2) changes the prompts the demonstrations are
  played with, so its key differs and it warm-starts once on its own.
- the SFT rows as the paper did them: SFT-GT fine-tunes the base on the gold programs in the
  paper's style and RFT on the base's own successful rollouts (their `warm_start.source` and
  `style`; `train.iterations: 0`, as in their configs: no RL), one epoch at this scale, from
  the base, not from the shared warm start. RFT's temperature ladder is thinned to every 4th
  of the paper's 20 temperatures and one pass (`RFT_LADDER_STRIDE`). EI is an RL-loop row
  (filtered cross-entropy) and starts from the warm start like the others.
- every RL row samples the same N x K = 6 x 4 rollouts an iteration for the scale's
  iterations (quickstart: 4, so 96 rollouts a row; 4 keeps a row's run, evaluations included,
  under 45 minutes, one piece), the same tasks (`train.stratify`) and seeds. DPO-MCTS spends
  the same budget on tree searches: K search iterations a task (its config's 30 are [P]'s
  budget at the paper's scale), each rolling one episode out to the end, so K rollouts a task
  too (plus the unrolled second candidate turn of each expansion). The critic rows' warm-up
  is shortened to 1 iteration (the paper's 10 would be the whole run): their policy then
  learns in 3 of the 4 iterations, every other row's in 4;
  `--iterations 8` makes that 7 of 8, at twice the time.
- a KL penalty (GRPO's, Verlog's) is to the policy the row's RL starts from, the warm start
  (`train.kl.reference=start`): in [P] RL starts from the base, so its reference, the base, is
  that start; here the base is the model before the warm start, and a penalty toward it pulls
  every row back past its own start (measured: GRPO with the base as its reference, 17 -> 15
  of 36 greedy, its k3 KL 1.4 to 2.0 a token, against 17 -> 26 without the penalty).

Recorded per row and seed, one JSON line appended to `<out>/results.jsonl` as each finishes:
held-out success on `eval.split` (easy_heldout, 36 tasks) greedy and sampled at T=1 (2 a task)
before the first iteration and after the last, as successes/rollouts with Wilson 95% intervals
(read from the trainer's evaluations, `<run>/eval/<split>[@T1]/iter-N/rollouts.jsonl`; an SFT
row evaluates once, after its fine-tuning, so it has only an "after"), the first and last
iteration's training reward, wall time, the checkout's commit (`+` when it had changes), and
the peak resident memory of the row's train.py process (`os.wait4`'s rusage of that child: its
own maximum RSS, not its sandbox workers').

Resumable: a rerun with the same `--out` skips every row x seed already in results.jsonl; a row
killed midway resumes from its run directory's last checkpoint (train.py resumes a run
directory holding checkpoints, every iteration at the quickstart); `--max-minutes M` starts no
row after M minutes (the first always starts), so a piece lasts M plus one row: `--max-minutes
30` keeps a quickstart piece under an hour, two rows a piece, 7 pieces for the 14 rows.
`--results FILE` reads and appends another file than `<out>/results.jsonl`: the rows measured
so far are kept in the repository's docs/table1.jsonl (each line names its `cpu`: wall times
compare only between rows of one machine), so pieces run on different machines make one table:
    python benchmarks/compare_methods.py --out runs/table1 --results docs/table1.jsonl \
        --max-minutes 30 --plot
`--plot` draws `<out>/table1.png`: held-out success after training per row with its interval,
greedy and sampled, beside the paper's Test-N TGC rank of that row (the scales differ: a 135M
model against Qwen2.5-32B, so only orderings compare).

Scales:
- quickstart: `configs/quickstart.yaml` (SmolLM2-135M, LoRA, the built-in app world), each row
  a `train.py` run in its own process: 25-40 minutes per RL row and seed on 2 cores (4
  iterations and two evaluations of 108 rollouts), the first of a seed ~8 minutes more for the
  warm start; SFT-GT ~10 minutes (one epoch and one evaluation), RFT ~30 (360 rollouts of the
  base first): about 7 hours for the 14 rows and one seed. A 135M model hardly solves a task,
  so expect close numbers and wide intervals. `--set KEY=VALUE ...` adds quickstart overrides
  to every row (a smoke test's `eval.limit=2`; the comparison itself takes none).
- --synthetic: the word task of tests/loop/synthetic.py (reward = share of emitted words in a
  target set, which a policy can learn in a few iterations) with the tiny random Llama under a
  LoRA adapter (rank 16) and the learning settings of tests/loop/test_trainer.py, in process;
  seconds per row. No held-out split, no demonstrations: the SFT rows sft-gt and rft are left
  out, and the held-out columns are empty.

DPO-MCTS trains on pairs from its tree searches, not on K rollouts: its reward is the mean
return of its searches' rollouts (`search/return_mean`, the policy's samples).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's loop/ and tests/

from loop.config import load_config  # noqa: E402
from loop.run.report import eval_points  # noqa: E402
from loop.run.significance import wilson_interval  # noqa: E402

ROWS = {  # Table 1's order, then Verlog
    "sft-gt": "configs/table1/sft-gt.yaml",
    "rft": "configs/table1/rft.yaml",
    "ei": "configs/table1/ei.yaml",
    "dpo-mcts": "configs/table1/dpo-mcts.yaml",
    "dmpo": "configs/table1/dmpo.yaml",
    "ppo-critic": "configs/table1/ppo-critic.yaml",
    "rloo": "configs/table1/rloo.yaml",
    "grpo": "configs/table1/grpo.yaml",
    "grpo-no-kl": "configs/table1/grpo-no-kl.yaml",
    "loop-bandit": "configs/table1/loop-bandit.yaml",
    "loop-turn": "configs/table1/loop-turn.yaml",
    "loop-token": "configs/table1/loop-token.yaml",
    "loop-rwnorm": "configs/table1/loop-rwnorm.yaml",
    "verlog": "configs/verlog.yaml",
}
SFT_ROWS = ("sft-gt", "rft")  # fine-tuning from the base only: no RL iterations
# [P] Table 1 of the LOOP paper, Test-N TGC (%) with Qwen2.5-32B (shared/reference/loop_spec.md
# section 4.1). Verlog is not in the table: None.
PAPER_TEST_N_TGC: dict[str, float | None] = {
    "sft-gt": 6.2, "rft": 47.9, "ei": 58.3, "dpo-mcts": 57.0, "dmpo": 59.0, "ppo-critic": 50.8,
    "rloo": 57.2, "grpo": 58.0, "grpo-no-kl": 59.0, "loop-bandit": 53.3, "loop-turn": 64.1,
    "loop-token": 71.3, "loop-rwnorm": 61.9, "verlog": None,
}  # fmt: skip
# Keys that set the scale of a run, not its algorithm: taken from the scale, never from a row.
SCALE_KEYS = {
    "iterations", "split", "max_difficulty", "tasks_per_iteration", "rollouts_per_task",
    "max_concurrent_rollouts", "rollouts_fraction", "min_rollouts_per_task", "minibatch_size",
    "micro_batch_size", "lr", "max_grad_norm", "max_seq_len", "logprob_chunk_size",
    "stress_test", "eval_every", "checkpoint_every", "keep_checkpoints", "keep_every",
    "tensorboard",
}  # fmt: skip
# The warm start's method (what it trains on and how), not its scale (epochs, lr, split, select
# on dev, which needs several epochs to choose among).
WARM_START_KEYS = ("source", "style", "rft_temperatures", "rft_passes", "min_reward")
SHORT_WARMUP = 1  # critic warm-up iterations at these scales
# RFT's ladder at the quickstart: every 4th of the paper's 20 temperatures (0.2, 0.4, ..., 1.0)
# and one pass: 5 x 72 = 360 rollouts of the base, 7 to 12 minutes a rung on 2 cores (the base
# runs every rollout out of turns), where the full ladder's 4,320 would take most of a day.
RFT_LADDER_STRIDE = 4
RFT_PASSES = 1
QUICKSTART = ROOT / "configs/quickstart.yaml"
RESULTS = "results.jsonl"
PLOT = "table1.png"
KIB = 1024  # ru_maxrss is in KiB on Linux


def row_overrides(
    row: str, rollouts_per_task: int | None = None, rl_start_reference: bool = False
) -> list[str]:
    """The row's algorithm as `key=value` overrides (its train, critic, memory and warm-start
    method keys; `train.iterations=0` where the row fine-tunes only). With the scale's
    `rollouts_per_task` (K), a tree-search row searches K iterations a task: the rollouts every
    other row samples. With `rl_start_reference`, a row's KL penalty is to the policy its RL
    started from (`train.kl.reference=start`) instead of the base."""
    data: dict[str, Any] = {}
    for loaded in _row_chain(row):  # the base first, the row's own keys on top
        for section in ("train", "critic"):
            for key, value in (loaded.get(section) or {}).items():
                if section == "critic" or key not in SCALE_KEYS:
                    data[f"{section}.{key}"] = value
        for key, value in (loaded.get("warm_start") or {}).items():
            if key in WARM_START_KEYS:
                data[f"warm_start.{key}"] = value
        memory = (loaded.get("agent") or {}).get("memory_turns")
        if memory is not None:
            data["agent.memory_turns"] = memory
    if row in SFT_ROWS:  # fine-tuning only: no RL step to replay demonstrations in
        data["train.iterations"], data["train.replay.coef"] = 0, 0
    if "warm_start.rft_temperatures" in data:
        ladder = data["warm_start.rft_temperatures"]
        data["warm_start.rft_temperatures"] = ladder[RFT_LADDER_STRIDE - 1 :: RFT_LADDER_STRIDE]
        data["warm_start.rft_passes"] = RFT_PASSES
    if "critic.warmup_iterations" in data:
        data["critic.warmup_iterations"] = SHORT_WARMUP
    kl = data.get("train.kl", {})
    if kl.get("coef") and rl_start_reference:
        data["train.kl"] = {**kl, "reference": "start"}
    preference = data.get("train.preference", {})
    if preference.get("search_iterations") and rollouts_per_task:
        data["train.preference"] = {**preference, "search_iterations": rollouts_per_task}
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in data.items()]


def _row_chain(row: str) -> list[dict[str, Any]]:
    """The row's file and its bases while they are other rows' files, the deepest first."""
    row_files = {(ROOT / f).resolve() for f in ROWS.values()}
    path, chain = (ROOT / ROWS[row]).resolve(), []
    while True:
        loaded = yaml.safe_load(path.read_text()) or {}
        chain.append(loaded)
        base = loaded.get("base")
        if base is None or (path.parent / base).resolve() not in row_files:
            break
        path = (path.parent / base).resolve()
    return chain[::-1]


def quickstart_command(
    row: str, seed: int, iterations: int | None, out: Path, extra_overrides: Sequence[str] = ()
) -> list[str]:
    """The row's `train.py` command line on the quickstart config (`extra_overrides` last)."""
    extra = [f"train.iterations={iterations}"] if iterations and row not in SFT_ROWS else []
    k = load_config(QUICKSTART, []).train.rollouts_per_task
    return [
        sys.executable, str(ROOT / "train.py"), "--config", str(QUICKSTART),
        f"output_dir={out}", f"name={run_name(row, seed)}", f"seed={seed}",
        # every row the paper's way (a critic needs the pass)
        "train.off_policy.old_logprobs=recompute",
        *row_overrides(row, k, rl_start_reference=True), *extra, *extra_overrides,
    ]  # fmt: skip


def run_name(row: str, seed: int) -> str:
    return f"{row}-seed{seed}"


def run_quickstart(
    row: str, seed: int, iterations: int | None, out: Path, extra_overrides: Sequence[str] = ()
) -> dict[str, Any]:
    """One `train.py` run of the row (resuming its run directory's checkpoint if one is there):
    its wall time and the peak RSS of that process."""
    log = out / f"{run_name(row, seed)}.log"
    started = time.monotonic()
    command = quickstart_command(row, seed, iterations, out, extra_overrides)
    with log.open("a") as stream:
        child = subprocess.Popen(command, cwd=ROOT, stdout=stream, stderr=subprocess.STDOUT)
        try:
            _, status, usage = os.wait4(child.pid, 0)  # this child's own rusage
        except BaseException:  # stopped (Ctrl-C, SIGTERM): the row's run stops too, resumable
            child.terminate()
            child.wait()
            raise
        child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        tail = log.read_text()[-800:].strip()
        raise RuntimeError(f"{row}: train.py exited {child.returncode} (log {log}): {tail}")
    return {"wall_s": time.monotonic() - started, "peak_rss_mib": usage.ru_maxrss / KIB,
            "cpu": cpu_model(), "commit": checkout_commit()}  # fmt: skip


def checkout_commit() -> str | None:
    """The checkout's commit the row ran (`+` when its tracked files outside docs/ had
    changes: the results file itself, docs/table1.jsonl, is not the row's code), or None
    outside a git checkout."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    if not head:
        return None
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs")
    return head + ("+" if changed else "")


def cpu_model() -> str:
    """The machine's CPU model (rows of one table may be measured on different machines: wall
    times compare only within one)."""
    for line in (
        Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []
    ):
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    return f"unknown x{os.cpu_count()}"


def run_synthetic(row: str, seed: int, iterations: int | None, out: Path) -> dict[str, Any]:
    """The row on the synthetic word task with a LoRA adapter on the tiny Llama, in process (no
    process of its own: no peak RSS)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from loop.generators.hf.generator import HFGenerator
    from loop.parts import TrainParts
    from loop.trainer import train
    from tests.loop.synthetic import NoSandboxPool, WordSuite, synthetic_policy
    from tests.loop.test_trainer import SYNTHETIC

    if row in SFT_ROWS:
        raise ValueError(f"{row}: fine-tunes on demonstrations, which the word task has none of")
    started = time.monotonic()
    scale = [a for a in SYNTHETIC if not a.startswith("model.lora_rank")]
    config = load_config(None, [
        f"output_dir={out}", f"name={run_name(row, seed)}", f"seed={seed}", *scale,
        "model.lora_rank=16", "train.lr=0.01", "critic.lr=0.01",
        f"train.iterations={iterations or 6}", *row_overrides(row),
    ])  # fmt: skip
    torch.manual_seed(seed)
    policy = synthetic_policy(seed=seed)
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear")
    policy.model = get_peft_model(policy.model, lora)
    parts = TrainParts(policy, HFGenerator(policy, max_batch_size=16), policy.tokenizer,
                       WordSuite(), NoSandboxPool())  # fmt: skip
    train(config, parts, show_progress=False)
    return {"wall_s": time.monotonic() - started, "peak_rss_mib": None}


Runner = Callable[[str, int, "int | None", Path], dict[str, Any]]


def reward(record: dict) -> float:
    """The iteration's mean reward of the policy's samples (DPO-MCTS: its searches')."""
    return record.get("search/return_mean", record["rollout/reward_mean"])


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return _jsonl(run_dir / "metrics.jsonl")


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The file's JSON lines; none when it is missing, skipping a line cut short by a kill."""
    if not path.is_file():
        return []
    lines = []
    for line in path.read_text().splitlines():
        try:
            lines.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return lines


def score(successes: int, n: int) -> dict[str, Any]:
    """successes/n with its Wilson 95% interval."""
    low, high = wilson_interval(successes, n)
    return {"successes": successes, "n": n, "rate": successes / n if n else math.nan,
            "low": low, "high": high}  # fmt: skip


def held_out(run_dir: Path) -> dict[str, Any]:
    """Greedy and sampled held-out success before the first iteration and after the last (an
    evaluation run once is the "after"), from the trainer's evaluations."""
    result: dict[str, Any] = {}
    for split, by_iteration in eval_points(run_dir).items():
        kind = "sampled" if "@T" in split else "greedy"
        counts = {
            i: (sum(map(sum, tasks.values())), sum(map(len, tasks.values())))
            for i, tasks in by_iteration.items()
        }
        first, last = min(counts), max(counts)
        result[f"{kind}_before"] = score(*counts[first]) if first != last else None
        result[f"{kind}_after"] = score(*counts[last])
        result[f"{kind}_split"] = split
    return result


def row_result(row: str, seed: int, run_dir: Path, measured: dict[str, Any]) -> dict[str, Any]:
    """The JSON line of one finished row x seed."""
    records = _metrics(run_dir)
    train = [r for r in records if "rollout/reward_mean" in r or "search/return_mean" in r]
    cached = [r["warm_start/cached"] for r in records if "warm_start/cached" in r]
    return {
        "row": row, "seed": seed, "paper_test_n_tgc": PAPER_TEST_N_TGC[row],
        "iterations": len(train),
        "reward_first": reward(train[0]) if train else None,
        "reward_last": reward(train[-1]) if train else None,
        "warm_start_cached": bool(cached[-1]) if cached else None,
        **held_out(run_dir), **measured,
    }  # fmt: skip


def finished(results: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """(row, seed) -> its line, for every row x seed already in the results file."""
    return {(r["row"], r["seed"]): r for r in _jsonl(results)}


def run_all(rows: Sequence[str], seeds: Sequence[int], iterations: int | None, out: Path,
            runner: Runner, max_minutes: float | None = None,
            results: Path | None = None) -> list[str]:  # fmt: skip
    """Run every row x seed not yet in results.jsonl, appending each line as it finishes; stop
    starting rows once max_minutes have passed (after the first). The rows x seeds left undone."""
    out.mkdir(parents=True, exist_ok=True)
    results = results or out / RESULTS
    done, started, left, ran = finished(results), time.monotonic(), [], False
    for row in rows:
        for seed in seeds:
            if (row, seed) in done:
                continue
            spent = max_minutes is not None and time.monotonic() - started > max_minutes * 60
            if spent and ran:  # the first row always runs, so every rerun makes progress
                left.append(run_name(row, seed))
                continue
            measured, ran = runner(row, seed, iterations, out), True
            line = row_result(row, seed, out / run_name(row, seed), measured)
            with results.open("a") as stream:
                stream.write(json.dumps(line) + "\n")
            print(f"{run_name(row, seed)}: {_cell(line.get('greedy_after'))} greedy, "
                  f"{_cell(line.get('sampled_after'))} sampled, {line['wall_s']:.0f} s",
                  flush=True)  # fmt: skip
    return left


def _cell(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    return f"{s['successes']}/{s['n']} [{s['low']:.2f}, {s['high']:.2f}]"


def _pooled(lines: list[dict[str, Any]], key: str) -> dict[str, Any] | None:
    """The seeds' successes and rollouts summed, with the pooled Wilson interval."""
    found = [line[key] for line in lines if line.get(key)]
    if not found:
        return None
    return score(sum(s["successes"] for s in found), sum(s["n"] for s in found))


def _mean(values: list[Any]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.mean(values) if values else None


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_rows(results: Path, rows: Sequence[str]) -> list[dict[str, Any]]:
    """Per row with results: its seeds pooled (held out) or averaged (reward, time, memory)."""
    by_row: dict[str, list[dict[str, Any]]] = {}
    for line in _jsonl(results):
        by_row.setdefault(line["row"], []).append(line)
    table = []
    for row in [r for r in rows if r in by_row]:
        lines = by_row[row]
        entry: dict[str, Any] = {"row": row, "seeds": [line["seed"] for line in lines]}
        for key in ("greedy_before", "greedy_after", "sampled_before", "sampled_after"):
            entry[key] = _pooled(lines, key)
        for key in ("reward_first", "reward_last", "wall_s", "peak_rss_mib"):
            entry[key] = _mean([line.get(key) for line in lines])
        entry["paper_test_n_tgc"] = PAPER_TEST_N_TGC[row]
        entry["cpu"] = ", ".join(sorted({line.get("cpu") or "not recorded" for line in lines}))
        table.append(entry)
    return table


def paper_ranks(rows: Sequence[str]) -> dict[str, int]:
    """1 = the best Test-N TGC in Table 1 among these rows (Verlog, not in it, unranked)."""
    ranked = sorted((r for r in rows if PAPER_TEST_N_TGC[r] is not None),
                    key=lambda r: -(PAPER_TEST_N_TGC[r] or 0.0))  # fmt: skip
    return {row: i + 1 for i, row in enumerate(ranked)}


def summary_table(table: list[dict[str, Any]]) -> str:
    """Markdown: held out before -> after, greedy and sampled, and the paper's number."""
    ranks = paper_ranks([e["row"] for e in table])
    lines = [
        "| row | greedy before | greedy after | sampled before | sampled after | reward first"
        " -> last | paper Test-N TGC [P] (rank) | time | peak RSS | machine |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for e in table:
        paper = e["paper_test_n_tgc"]
        paper_cell = "not in Table 1" if paper is None else f"{paper} ({ranks[e['row']]})"
        rss = "-" if e["peak_rss_mib"] is None else f"{e['peak_rss_mib']:.0f} MiB"
        lines.append(
            f"| {e['row']} | {_cell(e['greedy_before'])} | {_cell(e['greedy_after'])} | "
            f"{_cell(e['sampled_before'])} | {_cell(e['sampled_after'])} | "
            f"{_fmt(e['reward_first'], '.3f')} -> {_fmt(e['reward_last'], '.3f')} | "
            f"{paper_cell} | {_fmt(e['wall_s'], '.0f')} s | {rss} | {e['cpu']} |"
        )
    return "\n".join(lines)


def plot_table(table: list[dict[str, Any]], path: Path) -> Path:
    """Held-out success per row with its interval (greedy, sampled) after training, a hollow
    marker joined to it where the row was evaluated before, and beside it the row's rank by the
    paper's Test-N TGC; rows in the paper's order (its best at the top), so an ordering that
    holds here reads as points falling down the picture."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = sorted(table, key=lambda e: -(PAPER_TEST_N_TGC[e["row"]] or -1.0))
    names = [e["row"] for e in table]
    ranks = paper_ranks(names)
    ys = list(range(len(names)))[::-1]  # the first row at the top
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.45 * len(names) + 2.4), sharey=True,
                                      gridspec_kw={"width_ratios": [3, 1]})  # fmt: skip
    kinds = ((0.15, "greedy", "greedy", "C0"), (-0.15, "sampled", "T=1", "C1"))
    for offset, kind, label, color in kinds:
        points = [(y + offset, e) for y, e in zip(ys, table, strict=True) if e[f"{kind}_after"]]
        if not points:
            continue
        after = [e[f"{kind}_after"] for _, e in points]
        rates = [s["rate"] for s in after]
        errors = [[s["rate"] - s["low"] for s in after], [s["high"] - s["rate"] for s in after]]
        left.errorbar(rates, [y for y, _ in points], xerr=errors, fmt="o", capsize=3,
                      color=color, label=f"held out after, {label}")  # fmt: skip
        before = [(y, e[f"{kind}_before"]["rate"], e) for y, e in points if e[f"{kind}_before"]]
        for y, rate, e in before:
            left.plot([rate, e[f"{kind}_after"]["rate"]], [y, y], color=color, lw=0.8, alpha=0.6)
        if before:
            left.scatter([r for _, r, _ in before], [y for y, _, _ in before], s=30,
                         facecolors="none", edgecolors=color, label=f"before, {label}")  # fmt: skip
    if left.get_legend_handles_labels()[1]:
        left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=4, fontsize=8)
    else:
        left.text(0.5, ys[0], "no held-out evaluation at this scale", ha="center", va="center")
    left.set_xlim(0, 1)
    left.set_xlabel("held-out success (95% Wilson interval)")
    left.set_yticks(ys, names)
    left.grid(axis="x", alpha=0.3)
    for y, name in zip(ys, names, strict=True):
        paper = PAPER_TEST_N_TGC[name]
        if paper is None:
            right.text(0.5, y, "not in Table 1", va="center", ha="center", fontsize=8)
            continue
        right.barh(y, paper, color="0.7")
        right.text(paper + 1, y, f"#{ranks[name]}", va="center", fontsize=8)
    right.set_xlim(0, 100)
    right.set_xlabel("paper: Test-N TGC % (rank)")
    fig.suptitle("LOOP Table 1 rows at this scale against the paper's Qwen2.5-32B")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _stop(signum: int, _frame: object) -> None:
    """SIGTERM as Ctrl-C: unwind, so the running row's train.py is stopped too."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None, runner: Runner | None = None) -> int:
    """Run the rows x seeds not yet done, then print and write the table (and the picture)."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), help="default: every row")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--iterations", type=int, help="iterations per run (default: the scale's)")
    parser.add_argument("--synthetic", action="store_true", help="the tests' word task")
    parser.add_argument("--out", type=Path, help="results.jsonl, the runs, summary.md, "
                        "table1.png (default: runs/table1, runs/table1-synthetic)")  # fmt: skip
    parser.add_argument("--results", type=Path, help="the JSON lines read (rows in it are done) "
                        "and appended to (default: <out>/results.jsonl)")  # fmt: skip
    parser.add_argument("--max-minutes", type=float, help="start no row after this many minutes")
    parser.add_argument("--plot", action="store_true", help="draw <out>/table1.png")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="quickstart overrides for every row, last (a smoke test's "
                        "eval.limit=2; the comparison itself takes none)")  # fmt: skip
    args = parser.parse_args(argv)
    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        return _compare(args, runner)
    except KeyboardInterrupt as stopped:  # the row's train.py is stopped; its checkpoint stays
        reason = str(stopped) or "Ctrl-C"
        print(f"compare_methods: stopped ({reason}); rerun to resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _compare(args: argparse.Namespace, runner: Runner | None) -> int:
    """main's work, once its arguments are read."""
    args.out = args.out or ROOT / "runs" / ("table1-synthetic" if args.synthetic else "table1")
    results = args.results or args.out / RESULTS
    default_rows = [r for r in ROWS if not (args.synthetic and r in SFT_ROWS)]
    rows = args.rows or default_rows
    run = runner or (run_synthetic if args.synthetic else functools.partial(
        run_quickstart, extra_overrides=args.set))  # fmt: skip
    scale = "synthetic word task, tiny Llama + LoRA r16" if args.synthetic else "quickstart"
    print(f"# {scale}; seeds {args.seeds}; critic warm-up {SHORT_WARMUP} iteration; "
          f"results in {results}", flush=True)  # fmt: skip
    left = run_all(rows, args.seeds, args.iterations, args.out, run, args.max_minutes, results)
    table = summary_rows(results, rows)
    text = summary_table(table)
    (args.out / "summary.md").write_text(text + "\n")
    print()
    print(text)
    if args.plot and table:
        print(f"picture: {plot_table(table, args.out / PLOT)}")
    if left:
        print(f"not started (--max-minutes spent; rerun to go on): {' '.join(left)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
