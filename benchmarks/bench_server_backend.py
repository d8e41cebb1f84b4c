"""The server backend against the in-process hf backend on the quickstart load, and the host
memory of loading the model in two learner processes.

Run: python benchmarks/bench_server_backend.py              (about 15 min on 2 cores)
     python benchmarks/bench_server_backend.py --only load  (the memory part, about 2 min)

Iteration: `train.py --config configs/quickstart.yaml` for one LOOP iteration (6 tasks x 4
rollouts, the warm start from the cache, no evaluation), once with `generator.backend=hf` and
once with `vllm_server` (one vLLM CPU server that the trainer starts), back to back in one run;
the figures are the trainer's own (`time/rollout_s`, `time/learn_s`, `time/sync_s`,
`time/iteration_s` in metrics.jsonl) plus the whole command's wall time, which for the server
includes its start-up. Load: `torchrun --nproc-per-node 2` processes load the policy (LoRA on
SmolLM2) and shard it with FSDP2, two ways, in float32 (the checkpoint's dtype: its
safetensors pages are mapped, not copied) and in bfloat16 (a converted copy): `whole`, each
process loads the whole model and shards it (before); `lean`, as `train.py` does now, each
builds it on the meta device and rank 0 alone reads the weights and sends the shards. Each
process reports its peak RSS (ru_maxrss, which counts mapped file pages), its peak anonymous
memory (RssAnon sampled every 2 ms: what no page cache can give back) and its unique set size
after sharding (USS: memory no other process shares).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import subprocess
import sys
import tempfile
import threading
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
        "generator.gpu_memory_utilization=0.1", "train.off_policy.old_logprobs=recompute",
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


class AnonPeak:
    """The peak of this process's anonymous resident memory, sampled in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self.running = True
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while self.running:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    self.peak = max(self.peak, int(line.split()[1]) * 1024)
            time.sleep(0.002)

    def stop(self) -> int:
        self.running = False
        self.thread.join()
        return self.peak


def load_worker(way: str, dtype: str) -> None:
    """Under torchrun: load and shard the policy `way` (whole | lean); print this rank's memory."""
    import peft  # noqa: F401  (the runtime before any weights: its memory is the baseline)
    import psutil

    from loop.model import distributed
    from loop.model.policy import LoraSettings, load_policy

    distributed.init_from_env(collective_timeout_s=600, wait_timeout_s=600)
    anon = AnonPeak()
    time.sleep(0.05)
    base = anon.peak
    lora = LoraSettings(16, 32)
    if way == "lean":
        policy = load_policy("smollm2-135m", dtype=dtype, lora=lora, empty=True)
        weights = None
        if distributed.is_main():  # rank 0 alone reads the weights
            weights = load_policy("smollm2-135m", dtype=dtype, lora=lora).model.state_dict()
        distributed.shard_model(policy.model, weights)
        del weights
    else:
        policy = load_policy("smollm2-135m", dtype=dtype, lora=lora)
        distributed.shard_model(policy.model)
    gc.collect()
    uss = psutil.Process().memory_full_info().uss
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    record = {"rank": distributed.rank(), "peak_rss": peak, "peak_anon": anon.stop(), "uss": uss,
              "base_anon": base}  # fmt: skip
    print(json.dumps(record))
    distributed.shutdown()


def measure_load(way: str, dtype: str) -> list[dict[str, float]]:
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, "--load-worker", way, dtype,
    ]  # fmt: skip
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise SystemExit(f"load: torchrun failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["iteration", "load"])
    parser.add_argument("--load-worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load_worker:
        load_worker(*args.load_worker)
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
        print("| dtype | load | rank | peak RSS MiB | peak anonymous MiB (above the runtime's) "
              "| unique after MiB |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for dtype in ("float32", "bfloat16"):
            totals = {}
            for way in ("whole", "lean"):
                ranks = sorted(measure_load(way, dtype), key=lambda r: r["rank"])
                for r in ranks:
                    print(
                        f"| {dtype} | {way} | {r['rank']} | {r['peak_rss'] / 2**20:.0f} | "
                        f"{r['peak_anon'] / 2**20:.0f} "
                        f"({(r['peak_anon'] - r['base_anon']) / 2**20:.0f}) | "
                        f"{r['uss'] / 2**20:.0f} |"
                    )
                totals[way] = [
                    sum(r["peak_rss"] for r in ranks),
                    sum(r["peak_anon"] for r in ranks),
                    sum(r["peak_anon"] - r["base_anon"] for r in ranks),
                ]
            rss, anon, above = (totals["lean"][i] / totals["whole"][i] for i in range(3))
            print(f"{dtype}: lean / whole, both ranks' sum: peak RSS {rss:.2f}x, "
                  f"peak anonymous {anon:.2f}x ({above:.2f}x above the runtime's)")  # fmt: skip


if __name__ == "__main__":
    main()
