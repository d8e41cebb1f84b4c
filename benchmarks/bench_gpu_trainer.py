"""The whole trainer on one GPU: rollouts, learning, evaluation, a checkpoint, killed and resumed.

    python benchmarks/bench_gpu_trainer.py --out DIR [--tokenizer PATH] [--budget S] [--tiny]

No checkpoint is downloaded: the model is Qwen2.5-0.5B's published shape with random weights
and SmolLM2's tokenizer (the vocabulary resized to it; `--tokenizer`, default the converted
SmolLM2 under ~/.cache/loop-trainer), written once to DIR/model in bfloat16. The run is
configs/qwen2.5-7b-1gpu.yaml (the paper's one-GPU run: the hf backend, so the training model
samples its own rollouts) at toy counts (`OVERRIDES`), on the built-in world, its sandboxes as
isolated as the machine allows. The first launch is SIGKILLed, its whole process group with
its sandboxes, once the first iteration's checkpoint is written; the same command resumes it
and finishes. DIR/results.jsonl gets one row per launch (seconds, exit status, the GPU's peak
memory as nvidia-smi samples it) and one per record of the run (rollouts, optimizer steps,
the sampler-learner gap, the evaluation). Random weights score nothing: `train.adv_threshold=0`
keeps the zero advantages so that the learner steps.

`--tiny` runs the same on the CPU with a 2-layer model (float32), the check that the script
works before a GPU is spent on it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from loop.preflight.shapes import SHAPES  # noqa: E402  (after the path insert)

NAME = "gpu-trainer"
OVERRIDES = [  # toy counts on the paper's one-GPU config
    "train.iterations=2", "train.split=easy", "train.max_difficulty=null",
    "train.tasks_per_iteration=4", "train.rollouts_per_task=4", "train.min_rollouts_per_task=2",
    "train.rollouts_fraction=1.0", "train.max_concurrent_rollouts=16", "train.minibatch_size=8",
    "train.adv_threshold=0", "train.eval_every=2", "train.checkpoint_every=1",
    "train.max_seq_len=24000", "train.stress_test=true",
    "agent.max_turns=2", "agent.max_new_tokens=96", "agent.max_context_tokens=4096",
    "agent.max_observation_tokens=600",
    "eval.split=easy_heldout", "eval.limit=4", "eval.rollouts_per_task=1",
    "eval.max_concurrent_rollouts=8", "eval.max_turns=2",
    "generator.max_batch_size=16", "sandbox.pool_size=8", "sandbox.cell_timeout_s=10",
]  # fmt: skip
KEYS = (  # what each record row keeps
    "iteration", "rollout/count", "rollout/infra_failures", "rollout/status",
    "learn/optimizer_steps", "learn/trained_tokens", "recompute/abs_logprob_diff_mean",
    "recompute/abs_logprob_diff_max", "eval/tasks", "eval/pass", "eval/infra_failures",
    "eval/status", "time/rollout_s", "time/learn_s", "time/eval_s", "time/iteration_s",
)  # fmt: skip


def rows_to(path: Path, **fields: Any) -> None:
    print(json.dumps(fields), flush=True)
    with path.open("a") as f:
        f.write(json.dumps(fields) + "\n")


def write_model(directory: Path, tokenizer_dir: Path, tiny: bool) -> None:
    """Qwen2.5-0.5B's shape (tiny: 2 layers of 64), random weights, the given tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    shape = SHAPES["tiny" if tiny else "Qwen/Qwen2.5-0.5B-Instruct"]
    dims = {**shape, "vocab_size": len(tokenizer), "tie_word_embeddings": True}
    config = Qwen2Config(
        **dims, max_position_embeddings=32768, rope_theta=1e6, rms_norm_eps=1e-6,
        use_sliding_window=False,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
    )  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.float32 if tiny else torch.bfloat16
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)


class GpuPeak(threading.Thread):
    """The GPU's used memory, sampled by nvidia-smi every half second (the trainer is another
    process: its own allocator counters are out of reach), the peak in GiB."""

    def __init__(self, *, sampled: bool) -> None:
        super().__init__(daemon=True)
        self.peak_mib, self.stopped = 0, threading.Event()
        if sampled:  # started at once; not on a CPU (`--tiny`)
            self.start()

    def run(self) -> None:
        query = ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"]
        while not self.stopped.wait(0.5):
            try:
                used = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                self.peak_mib = max(self.peak_mib, int(used.split()[0]))
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                return

    def stop(self) -> float | None:
        self.stopped.set()
        return round(self.peak_mib / 1024, 1) if self.peak_mib else None


def launch(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip


def wait_for(done: Any, process: subprocess.Popen[bytes], deadline: float) -> bool:
    while time.monotonic() < deadline:
        if done():
            return True
        if process.poll() is not None:
            return bool(done())
        time.sleep(0.5)
    return False


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--tokenizer", type=Path,
        default=Path.home() / ".cache" / "loop-trainer" / "models" / "smollm2-135m-instruct",
    )  # fmt: skip
    parser.add_argument("--budget", type=float, default=600, help="seconds for both launches")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model on the CPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    deadline = time.monotonic() + args.budget
    model_dir, runs = args.out / "model", args.out / "runs"
    shutil.rmtree(runs, ignore_errors=True)
    start = time.perf_counter()
    write_model(model_dir, args.tokenizer, args.tiny)
    rows_to(results, step="model", seconds=round(time.perf_counter() - start, 1))
    device = ["model.device=cpu", "model.dtype=float32"] if args.tiny else ["model.device=cuda"]
    command = [
        sys.executable, "train.py", "--config", str(ROOT / "configs" / "qwen2.5-7b-1gpu.yaml"),
        f"name={NAME}", f"output_dir={runs}", f"model.name={model_dir}", *device, *OVERRIDES,
    ]  # fmt: skip
    run_dir = runs / NAME

    # 1. the first launch, SIGKILLed once iteration 0's checkpoint is written
    peak = GpuPeak(sampled=not args.tiny)
    log = args.out / "first.log"
    start = time.perf_counter()
    first = launch(command, log)
    checkpoint = run_dir / "checkpoints" / "iter-1"
    written = wait_for(checkpoint.is_dir, first, deadline)
    killed = first.poll() is None
    if killed:
        os.killpg(first.pid, signal.SIGKILL)
    first.wait(60)
    rows_to(
        results, step="first launch", seconds=round(time.perf_counter() - start, 1),
        checkpoint_written=written, killed=killed, returncode=first.returncode,
        gpu_peak_gib=peak.stop(), iter2_absent=not (run_dir / "checkpoints" / "iter-2").exists(),
        log_tail=None if written else tail(log),
    )  # fmt: skip
    if not written:
        return

    # 2. the same command resumes from the checkpoint and finishes
    peak = GpuPeak(sampled=not args.tiny)
    log = args.out / "resumed.log"
    start = time.perf_counter()
    second = launch(command, log)
    finished = wait_for(lambda: second.poll() is not None, second, deadline)
    if not finished:
        os.killpg(second.pid, signal.SIGKILL)
        second.wait(60)
    text = log.read_text(errors="replace")
    rows_to(
        results, step="resumed launch", seconds=round(time.perf_counter() - start, 1),
        returncode=second.returncode, resumed="resuming from" in text,
        gpu_peak_gib=peak.stop(), log_tail=tail(log) if second.returncode else None,
    )  # fmt: skip
    metrics = run_dir / "metrics.jsonl"
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        record = json.loads(line)
        rows_to(results, step="record", **{k: record[k] for k in KEYS if k in record})


if __name__ == "__main__":
    main()
