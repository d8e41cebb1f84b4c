"""The server backend against the in-process hf backend on the quickstart load, and the host
memory of loading the model in two learner processes.

Run: python benchmarks/bench_server_backend.py              (about 15 min on 2 cores)
     python benchmarks/bench_server_backend.py --only load  (the memory part, about 1 min)

Iteration: `train.py --config configs/quickstart.yaml` for one LOOP iteration (6 tasks x 4
rollouts, the warm start from the cache, no evaluation), once with `generator.backend=hf` and
once with `vllm_server` (one vLLM CPU server that the trainer starts), back to back in one run;
the figures are the trainer's own (`time/rollout_s`, `time/learn_s`, `time/sync_s`,
`time/iteration_s` in metrics.jsonl) plus the whole command's wall time, which for the server
includes its start-up. Load: `torchrun --nproc-per-node 2` processes that each load the policy
(LoRA on SmolLM2) and shard it with FSDP2, as `train.py` does; each reports its peak RSS
(ru_maxrss) and its unique set size after sharding (USS: memory no other process shares; the
safetensors weights are memory-mapped, so their pages are shared through the page cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ITERATION = [
    "train.iterations=1", "train.eval_every=0", "train.checkpoint_every=1",
    "train.save_rollouts=false", "train.tensorboard=false",
]  # fmt: skip
BACKENDS = {
    "hf": ["generator.backend=hf"],
    "vllm_server": [
        "generator.backend=vllm_server", "generator.max_model_len=2048",
        "generator.gpu_memory_utilization=0.1",
    ],
}  # fmt: skip


def warm_start(out: Path) -> None:
    """The quickstart's warm start into the cache (a no-op when it is there already), so that
    neither timed run pays for it."""
    command = [
        sys.executable, "train.py", "--config", "configs/quickstart.yaml", f"output_dir={out}",
        "train.iterations=0", "train.eval_every=0",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"warm start failed:\n{done.stderr[-3000:]}")


def time_iteration(backend: str, out: Path) -> dict[str, float]:
    """One quickstart iteration with `backend`: the trainer's timings and the wall time."""
    command = [
        sys.executable, "train.py", "--config", "configs/quickstart.yaml",
        f"output_dir={out}", *ITERATION, *BACKENDS[backend],
    ]  # fmt: skip
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{backend}: train.py failed:\n{done.stderr[-3000:]}")
    record = json.loads((out / "quickstart" / "metrics.jsonl").read_text().splitlines()[0])
    keys = ("time/rollout_s", "time/learn_s", "time/sync_s", "time/iteration_s")
    generated = record["throughput/generated_tokens_per_s"]
    return {key: record[key] for key in keys} | {"wall_s": wall, "tokens_per_s": generated}


def load_worker() -> None:
    """Under torchrun: load and shard the policy as train.py does; print this rank's memory."""
    import psutil

    from loop.model import distributed
    from loop.model.policy import LoraSettings, load_policy

    distributed.init_from_env(collective_timeout_s=600, wait_timeout_s=600)
    policy = load_policy("smollm2-135m", dtype="float32", device="cpu", lora=LoraSettings(16, 32))
    distributed.shard_model(policy.model)
    uss = psutil.Process().memory_full_info().uss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"rank": int(os.environ["RANK"]), "peak_rss": peak, "uss": uss}))
    distributed.shutdown()


def measure_load() -> list[dict[str, float]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, "--load-worker",
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"load: torchrun failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["iteration", "load"])
    parser.add_argument("--load-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_worker:
        load_worker()
        return
    if args.only != "load":
        with tempfile.TemporaryDirectory() as tmp:
            warm_start(Path(tmp) / "warm")
            timings = {b: time_iteration(b, Path(tmp) / b) for b in BACKENDS}
        print("| backend | rollout s | learn s | publish s | iteration s | command s | tok/s |")
        print("|---|---|---|---|---|---|---|")
        for backend, t in timings.items():
            print(
                f"| {backend} | {t['time/rollout_s']:.0f} | {t['time/learn_s']:.0f} | "
                f"{t['time/sync_s']:.1f} | {t['time/iteration_s']:.0f} | {t['wall_s']:.0f} | "
                f"{t['tokens_per_s']:.0f} |"
            )
        hf, server = timings["hf"], timings["vllm_server"]
        print(
            f"server / hf: iteration {server['time/iteration_s'] / hf['time/iteration_s']:.2f}x, "
            f"rollout {server['time/rollout_s'] / hf['time/rollout_s']:.2f}x, "
            f"command {server['wall_s'] / hf['wall_s']:.2f}x"
        )
    if args.only != "iteration":
        for rank in sorted(measure_load(), key=lambda r: r["rank"]):
            print(
                f"load, rank {rank['rank']} of 2: peak RSS {rank['peak_rss'] / 2**20:.0f} MiB, "
                f"unique after sharding {rank['uss'] / 2**20:.0f} MiB"
            )


if __name__ == "__main__":
    main()
