"""Where a run's resident memory goes: sample a command's RSS over time, tagged by its log.

    python benchmarks/bench_memory.py watch --out runs/mem -- python train.py \
        --config configs/quickstart.yaml
    python benchmarks/bench_memory.py parts       # the engine's and the learner's parts
    python benchmarks/bench_memory.py recompute   # model.recompute: kept bytes, step time

`watch` starts the command, samples its process's resident set (and, apart, the sum of its
descendants': the sandboxes' kernels) every `--interval` seconds with psutil, and keeps the
command's output with the second each line came. It prints the peak, the log line the peak
came under, and the peak per stretch of the log (a stretch starts at each line matching
`--mark`); where the kernel's high-water mark (`/usr/bin/time`'s maximum resident set) rose
above every sample, between which two samples it did; with `--kinds SECONDS`, also the
resident pages by kind at each stretch's largest sample (glibc's heap, anonymous maps, the
model file, libraries: `/proc/PID/smaps`, into `kinds.csv`). `parts` builds the quickstart's
policy and generator in this process and measures each part's bytes (see `parts`' docstring).
Both print one table; `--out` keeps the samples (`rss.csv`) and the timestamped log (`log.txt`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as a script: this checkout

GB = 1e9
MIB = 2**20


# What a process's resident pages are, by its mappings (`/proc/PID/smaps`): glibc's main heap,
# the anonymous maps (large allocations, other threads' heaps of 64 MiB, the engine's paged
# slots), mapped files (the model's weights on a CPU, until the engine lets them go) and
# shared libraries.
KINDS = ("heap", "anon >= 64 MiB", "anon < 64 MiB", "model file", "libraries", "other")


def resident_kinds(pid: int) -> dict[str, int]:
    """The resident bytes of `pid`'s mappings by kind (KINDS); empty when it is gone."""
    kinds = dict.fromkeys(KINDS, 0)
    kind = "other"
    try:
        with open(f"/proc/{pid}/smaps") as smaps:
            for line in smaps:
                first = line.split(maxsplit=1)[0]
                if "-" in first and ":" not in first:  # a mapping's header line
                    kind = _kind(line)
                elif first == "Rss:":
                    kinds[kind] += int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return {}
    return kinds


def _kind(header: str) -> str:
    fields = header.split()
    path = fields[5] if len(fields) > 5 else ""
    start, end = (int(x, 16) for x in fields[0].split("-"))
    if path == "[heap]":
        return "heap"
    if not path:
        return "anon >= 64 MiB" if end - start >= 64 * MIB else "anon < 64 MiB"
    if path.endswith((".safetensors", ".bin", ".gguf")):
        return "model file"
    return "libraries" if ".so" in path else "other"


def watch(
    command: list[str], interval: float, out: Path | None, mark: str, kinds_every: float = 0.0
) -> int:
    """Run `command`, sample its RSS (and every `kinds_every` seconds its resident pages by
    kind, when > 0); print the peak and the peak per marked stretch."""
    started = time.monotonic()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    )
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((time.monotonic() - started, line.rstrip("\n")))
            sys.stdout.write(line)
            sys.stdout.flush()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    root = psutil.Process(process.pid)
    samples: list[tuple[float, int, int, int]] = []  # (seconds, own RSS, descendants', own HWM)
    kinds: list[tuple[float, dict[str, int]]] = []  # (seconds, resident bytes by kind)
    while process.poll() is None:
        now = time.monotonic() - started
        due = kinds_every > 0 and (not kinds or now - kinds[-1][0] >= kinds_every)
        if due and (found := resident_kinds(process.pid)):
            kinds.append((now, found))
        try:
            own = root.memory_info().rss
            kids = 0
            for child in root.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    kids += child.memory_info().rss
            samples.append((time.monotonic() - started, own, kids, high_water_mark(process.pid)))
        except psutil.Error:
            break
        time.sleep(interval)
    reader.join(timeout=5)
    _report(samples, lines, re.compile(mark))
    if kinds:
        _report_kinds(kinds, lines, re.compile(mark))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        rows = [",".join(map(str, (f"{s[0]:.2f}", *s[1:]))) for s in samples]
        head = "seconds,rss,descendants_rss,high_water_mark"
        (out / "rss.csv").write_text(head + "\n" + "\n".join(rows) + "\n")
        if kinds:
            table = [f"{t:.1f}," + ",".join(str(k[n]) for n in KINDS) for t, k in kinds]
            head = "seconds," + ",".join(KINDS)
            (out / "kinds.csv").write_text(head + "\n" + "\n".join(table) + "\n")
        (out / "log.txt").write_text("".join(f"{t:8.1f} {line}\n" for t, line in lines))
    return process.returncode or 0


def high_water_mark(pid: int) -> int:
    """`pid`'s peak resident set so far (the kernel's VmHWM, what `/usr/bin/time` reports as the
    maximum resident set), in bytes; 0 when unreadable. Sampled beside the RSS, it says
    between which two samples a peak too brief for the samples came."""
    with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _report(
    samples: list[tuple[float, int, int, int]], lines: list[tuple[float, str]], mark
) -> None:
    if not samples:
        print("no samples")
        return
    peak = max(samples, key=lambda s: s[1])
    under = [line for t, line in lines if t <= peak[0]]
    print(
        f"\npeak RSS {peak[1] / GB:.2f} GB at {peak[0]:.0f} s (descendants then "
        f"{peak[2] / GB:.2f} GB; their peak {max(s[2] for s in samples) / GB:.2f} GB)"
    )
    print(f"  under: {under[-1] if under else '(before any output)'}")
    hwm = max(s[3] for s in samples)
    if hwm > peak[1]:  # the kernel saw a higher peak between two samples: say when
        reached = next(i for i, s in enumerate(samples) if s[3] == hwm)
        since = samples[reached - 1][0] if reached else 0.0
        within = [line for t, line in lines if since - 1 <= t <= samples[reached][0]]
        print(
            f"high-water mark {hwm / GB:.2f} GB (the kernel's), between {since:.1f} and "
            f"{samples[reached][0]:.1f} s: {within[-1] if within else '(no output then)'}"
        )
    bounds = _stretches(lines, mark)
    print("\n| from (s) | stretch | peak RSS GB | RSS at its end GB |\n|---|---|---|---|")
    for i, (t0, line) in enumerate(bounds):
        t1 = bounds[i + 1][0] if i + 1 < len(bounds) else float("inf")
        inside = [s for s in samples if t0 <= s[0] < t1]
        if inside:
            print(
                f"| {t0:.0f} | {line[:70]} | {max(s[1] for s in inside) / GB:.2f} | "
                f"{inside[-1][1] / GB:.2f} |"
            )


def _stretches(lines: list[tuple[float, str]], mark) -> list[tuple[float, str]]:
    """Where each stretch of the log starts: the lines matching `mark`, one per run of lines
    with the same name (the text before the first ':', so a progress bar's updates are one
    stretch), after the start."""
    bounds = [(0.0, "(start)")]
    for t, line in lines:
        if mark.search(line) and line.split(":")[0] != bounds[-1][1].split(":")[0]:
            bounds.append((t, line))
    return bounds


def _report_kinds(kinds: list[tuple[float, dict[str, int]]], lines, mark) -> None:
    """Per marked stretch, the resident pages by kind at its largest sample."""
    bounds = _stretches(lines, mark)
    print("\n| from (s) | stretch | " + " | ".join(KINDS) + " | all (GB) |")
    print("|---" * (len(KINDS) + 3) + "|")
    for i, (t0, line) in enumerate(bounds):
        t1 = bounds[i + 1][0] if i + 1 < len(bounds) else float("inf")
        inside = [k for t, k in kinds if t0 <= t < t1]
        if inside:
            top = max(inside, key=lambda k: sum(k.values()))
            cells = " | ".join(f"{top[n] / GB:.2f}" for n in KINDS)
            print(f"| {t0:.0f} | {line[:50]} | {cells} | {sum(top.values()) / GB:.2f} |")


class PeakSampler:
    """This process's RSS sampled every `interval` seconds in a thread: `peak` since `reset`."""

    def __init__(self, interval: float = 0.005):
        self.process, self.interval, self.peak = psutil.Process(), interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def rss(self) -> int:
        return self.process.memory_info().rss

    def reset(self) -> int:
        self.peak = self.rss()
        return self.peak

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.rss())

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def saved_bytes(run, exclude: set[int]) -> tuple[int, Any]:
    """`run()` under autograd's saved-tensor hooks: the bytes of the distinct storages saved
    for backward, storages in `exclude` (the parameters) left out; and run's result."""
    import torch

    seen: dict[int, int] = {}

    def keep(tensor: Any) -> Any:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        out = run()
    return sum(seen.values()), out


def parts(tokens: int, outputs: int, rows: int, prefix: int, spread: tuple[int, int]) -> None:
    """The quickstart's parts, one at a time in this process (float32, LoRA r16, 2 threads):
    the model; one learner forward and backward over a `tokens`-long rollout whose last
    `outputs` ids are output (the saved activations counted exactly, the rise of RSS sampled,
    what the C heap keeps after it, `trim_heap`); the engine's packed weight copies; its row
    slots holding `rows` rows of own tokens spread evenly over `spread` past a `prefix`-token
    entry (the bytes the rows hold, the slots' capacity, the rise of RSS)."""
    import torch

    from loop.generators.hf.engine import DecoderEngine, Row
    from loop.generators.hf.pages import trim_heap
    from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden
    from loop.model.policy import LoraSettings, load_policy

    torch.set_num_threads(2)
    torch.manual_seed(0)
    sampler, table = PeakSampler(), []
    table.append(("process before the model (torch, transformers imported)", sampler.rss(), ""))
    policy = load_policy("smollm2-135m", lora=LoraSettings(rank=16, alpha=32))
    model = policy.model
    params = {
        p.untyped_storage().data_ptr(): p.numel() * p.element_size() for p in model.parameters()
    }
    lora = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    table.append(("weights (parameters)", sum(params.values()), f"counted; LoRA {lora / MIB:.1f}"))

    ids = torch.randint(0, 49152, (1, tokens))
    is_output = torch.zeros(1, tokens, dtype=torch.bool)
    is_output[:, -outputs:] = True
    model.train()
    for p in model.parameters():  # the weights resident (they are mapped from the file)
        p.detach().sum()
    before = sampler.reset()

    def forward() -> Any:
        hidden = last_hidden_state(model, ids, None)
        return logprobs_from_hidden(
            model, hidden, ids, chunk_size=1024, temperature=1.0, positions=is_output
        )

    activations, logprobs = saved_bytes(forward, set(params))
    after_forward = sampler.peak
    logprobs.sum().backward()
    del logprobs
    model.zero_grad(set_to_none=True)
    what = f"learner, {tokens} ids ({outputs} output)"
    table.append((f"{what}: activations saved for backward", activations, "counted"))
    table.append((f"{what}: RSS rise over the forward", after_forward - before, "sampled"))
    table.append((f"{what}: RSS rise, forward + backward", sampler.peak - before, "sampled"))
    table.append((f"{what}: RSS held after it, freed", sampler.rss() - before, "measured"))
    trim_heap()
    table.append((f"{what}: ... after trim_heap()", sampler.rss() - before, "measured"))

    model.eval()
    engine = DecoderEngine(model, max_rows=rows, max_tokens=2048)
    with torch.no_grad():
        engine.prefill(Row(ids=[]), list(range(5, 12)), store=engine.new_store(7))  # packs
    packed = sum(
        g.packed.numel() * g.packed.element_size()
        for layer in engine.fused or ()
        for g in layer.groups
        if g.packed is not None
    )
    head = engine.head.packed
    packed += 0 if head is None else head.numel() * head.element_size()
    table.append(("engine: packed weight copies (while sampling)", packed, "counted"))
    trim_heap()
    before = sampler.reset()
    low, high = spread
    held = 0
    for i in range(rows):
        n = low + (high - low) * i // max(rows - 1, 1)
        own = torch.randn(len(engine.layers), 2, engine.kv_heads, n, engine.head_dim)
        engine.reserve(n + 168)  # as a joining request reserves its max_new_tokens
        engine.add(Row(ids=list(range(prefix + n)), n_prefix=prefix), own)
        held += own.numel() * own.element_size()
    del own
    trim_heap()
    slots = f"engine: {rows} rows' own tokens, {low}-{high} each"
    table.append((f"{slots} (their keys and values)", held, "counted"))
    table.append((f"{slots}: the slots' capacity", engine.nbytes, "counted"))
    table.append((f"{slots}: RSS rise", sampler.rss() - before, "measured"))
    sampler.close()
    print("\n| part | MiB | how |\n|---|---|---|")
    for name, nbytes, how in table:
        print(f"| {name} | {nbytes / MIB:,.0f} | {how} |")


def recompute_kinds(tokens: int, outputs: int, repeats: int) -> None:
    """`model.recompute` none / mlp / layers on SmolLM2-135M with LoRA r16 (1 thread): the
    bytes one rollout keeps for its backward pass (counted) and the seconds of its forward and
    backward (the kinds alternate, `repeats` rounds; the median)."""
    import statistics

    import torch

    from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden
    from loop.model.policy import LoraSettings, load_policy
    from loop.model.recompute import KINDS, recompute

    torch.set_num_threads(1)
    torch.manual_seed(0)
    models = {}
    for kind in KINDS:  # one model each: the wrapping is per module
        models[kind] = load_policy("smollm2-135m", lora=LoraSettings(rank=16, alpha=32)).model
        recompute(models[kind], kind)
        models[kind].train()
    ids = torch.randint(0, 49152, (1, tokens))
    is_output = torch.zeros(1, tokens, dtype=torch.bool)
    is_output[:, -outputs:] = True

    def step(model: Any) -> Any:
        hidden = last_hidden_state(model, ids, None)
        return logprobs_from_hidden(
            model, hidden, ids, chunk_size=1024, temperature=1.0, positions=is_output
        )

    kept: dict[str, int] = {}
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for kind, model in models.items():
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        kept[kind], logprobs = saved_bytes(lambda model=model: step(model), params)
        logprobs.sum().backward()
        model.zero_grad(set_to_none=True)
    for _ in range(repeats):
        for kind, model in models.items():
            started = time.perf_counter()
            step(model).sum().backward()
            seconds[kind].append(time.perf_counter() - started)
            model.zero_grad(set_to_none=True)
    print(f"\n| model.recompute | kept, MiB ({tokens} ids) | step s (median) | x none |")
    print("|---|---|---|---|")
    base = statistics.median(seconds["none"])
    for kind in KINDS:
        median = statistics.median(seconds[kind])
        print(f"| {kind} | {kept[kind] / MIB:,.0f} | {median:.2f} | {median / base:.2f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("watch", help="run a command and sample its RSS")
    w.add_argument("--interval", type=float, default=0.5)
    w.add_argument("--out", type=Path, default=None)
    w.add_argument("--mark", default=r"^(iter|eval|warm start|learn|rollouts)")
    w.add_argument(
        "--kinds", type=float, default=0.0, metavar="SECONDS",
        help="also sample the resident pages by kind (heap, anonymous maps, the model file, "
        "libraries; /proc/PID/smaps) this often, into kinds.csv (0: not)",
    )  # fmt: skip
    w.add_argument("command", nargs=argparse.REMAINDER)
    p = sub.add_parser("parts", help="measure the quickstart's parts in this process")
    p.add_argument("--tokens", type=int, default=1100, help="the learner's rollout length")
    p.add_argument("--outputs", type=int, default=400, help="its output ids")
    p.add_argument("--rows", type=int, default=36, help="the engine's rows")
    p.add_argument("--prefix", type=int, default=430, help="the prefix entry they view")
    p.add_argument("--spread", type=int, nargs=2, default=(100, 1400), help="own tokens")
    r = sub.add_parser("recompute", help="model.recompute's kinds: kept bytes and step time")
    r.add_argument("--tokens", type=int, default=1100, help="the rollout's length")
    r.add_argument("--outputs", type=int, default=400, help="its output ids")
    r.add_argument("--repeats", type=int, default=5, help="timed rounds")
    args = parser.parse_args(argv)
    if args.mode == "recompute":
        recompute_kinds(args.tokens, args.outputs, args.repeats)
        return 0
    if args.mode == "parts":
        parts(args.tokens, args.outputs, args.rows, args.prefix, tuple(args.spread))
        return 0
    if args.mode == "watch":
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        return watch(command, args.interval, args.out, args.mark, args.kinds)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    raise SystemExit(main())
