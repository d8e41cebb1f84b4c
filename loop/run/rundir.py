"""The run directory: its layout, and the one writer and reader of each of its files.

    runs/<name>/config.yaml                  the resolved config (`write_config`, `read_config`)
    runs/<name>/metrics.jsonl                one line per iteration and per eval (`RunLog`)
    runs/<name>/tb/                          TensorBoard events
    runs/<name>/rollouts/iter-N.jsonl.gz     every training rollout of iteration N
    runs/<name>/checkpoints/iter-N/          complete checkpoints (loop/model/checkpoint.py)
    runs/<name>/adapter-sync/iter-N/         the adapter handed to the vLLM generator
    runs/<name>/eval/<split>/                evaluate.py: config.yaml, rollouts.jsonl, metrics.json
    runs/<name>/eval/<split>/iter-N/         the trainer's evaluation before iteration N
    runs/<name>/warm_start/                  the warm start (`WarmStartDir`): adapter/, its
                                             checkpoints/iter-E/, adapter-sync/, eval/epoch-E/,
                                             rft/pass-P-T<t>.jsonl.gz (RFT's ladder, by rung)
    runs/<name>/learning_curve.png           the learning curve (loop/run/report.py)
    runs/<name>/kl_reference/                the adapter RL started from (train.kl.reference start)
    runs/<name>/adapter-nonce                the run's adapter names' nonce (`adapter_nonce`)
    runs/<name>/train.lock                   held by the training run's rank 0 (`lock_run`)

The trainer, the warm start, evaluation, checkpoints, the report, the inspector's demo run and
its reader (loop/run/records.py) all go through these names; nothing else spells a file name
of the run directory. No torch here.
"""

from __future__ import annotations

import fcntl
import gzip
import json
import math
import os
import re
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
TENSORBOARD = "tb"
ROLLOUTS = "rollouts"  # the trainer's folder of iter-N.jsonl.gz
CHECKPOINTS = "checkpoints"
ADAPTER_SYNC = "adapter-sync"
EVAL = "eval"
EVAL_ROLLOUTS = "rollouts.jsonl"  # evaluate.py's rollouts, one trajectory per line
EVAL_METRICS = "metrics.json"
WARM_START = "warm_start"
RFT = "rft"  # the warm start's rejection-sampled rollouts, a file a rung
ADAPTER = "adapter"  # a LoRA adapter in PEFT format (also a checkpoint's, loop/model/checkpoint.py)
LEARNING_CURVE = "learning_curve.png"
KL_REFERENCE = "kl_reference"
ADAPTER_NONCE = "adapter-nonce"
LOCK = "train.lock"
ITER_NAME = re.compile(r"iter-(\d+)(?:\.jsonl(?:\.gz)?)?$")  # iter-N, iter-N.jsonl[.gz]
NOT_ROLLOUTS = frozenset({CHECKPOINTS, TENSORBOARD, ADAPTER_SYNC})  # never hold rollouts


def iter_name(iteration: int) -> str:
    """`iter-N`: the name of iteration N's folder (checkpoints, evaluations, adapter syncs)."""
    return f"iter-{iteration}"


def iteration_of(name: str) -> int | None:
    """N of `iter-N`, `iter-N.jsonl` or `iter-N.jsonl.gz`; None for any other name."""
    match = ITER_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory (`config.run_dir`)."""

    path: Path

    @property
    def config(self) -> Path:
        return self.path / CONFIG

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def warm_start(self) -> WarmStartDir:
        return WarmStartDir(self.path / WARM_START)

    @property
    def learning_curve(self) -> Path:
        return self.path / LEARNING_CURVE

    @property
    def kl_reference(self) -> Path:
        """The LoRA adapter RL started from, the KL's reference with `train.kl.reference: start`."""
        return self.path / KL_REFERENCE

    def rollouts(self, iteration: int) -> Path:
        """The training rollouts of `iteration`."""
        return self.path / ROLLOUTS / f"{iter_name(iteration)}.jsonl.gz"

    def adapter_sync(self, iteration: int) -> Path:
        """Where the adapter trained by `iteration` iterations is handed to the generator."""
        return self.path / ADAPTER_SYNC / iter_name(iteration)

    @property
    def eval_root(self) -> Path:
        return self.path / EVAL

    def eval_dir(self, split: str, iteration: int | None = None) -> Path:
        """evaluate.py's folder for `split`, or the trainer's evaluation before `iteration`."""
        folder = self.eval_root / split
        return folder if iteration is None else folder / iter_name(iteration)

    def eval_rollout_files(self) -> list[Path]:
        """The trainer's periodic evaluations' rollouts files, `eval/<split>/iter-N/`."""
        return sorted(self.eval_root.glob(f"*/iter-*/{EVAL_ROLLOUTS}"))

    def keep_metrics_before(self, start: int) -> None:
        """Drop the metrics.jsonl records of iterations >= `start` (a resumed run logs them
        again) and a last line cut short by a kill."""
        if self.metrics.exists():
            lines = self.metrics.read_text().splitlines(keepends=True)
            self.metrics.write_text("".join(ln for ln in lines if _logged_iteration(ln) < start))

    def read_metrics(self) -> list[dict[str, Any]]:
        """The metrics.jsonl records (a line cut short by a kill is skipped)."""
        if not self.metrics.is_file():
            return []
        records = []
        for line in self.metrics.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records

    def adapter_nonce(self) -> str:
        """The run's adapter nonce (drawn on first use, kept here so a resume keeps it): a
        server's adapter names are `<name>-<nonce>-v<k>`, so two runs named alike never share
        one, and a resumed run knows the names its earlier life left."""
        path = self.path / ADAPTER_NONCE
        if not path.exists():
            self.path.mkdir(parents=True, exist_ok=True)
            drawn = path.with_name(f"{ADAPTER_NONCE}.{os.getpid()}")
            drawn.write_text(secrets.token_hex(4) + "\n")
            try:
                os.link(drawn, path)  # the first writer wins; another reads its nonce
            except FileExistsError:
                pass
            finally:
                drawn.unlink()
        return path.read_text().strip()

    def append_metrics(self, record: dict[str, Any]) -> None:
        """One metrics.jsonl line."""
        with self.metrics.open("a") as sink:
            sink.write(json.dumps(record) + "\n")


@dataclass(frozen=True)
class WarmStartDir:
    """The warm start's folder of a run (loop/warmstart.py)."""

    path: Path

    @property
    def adapter(self) -> Path:
        """The adapter RL starts from."""
        return self.path / ADAPTER

    @property
    def checkpoints(self) -> Path:
        """One checkpoint per epoch, `iter-E` (E epochs done)."""
        return self.path / CHECKPOINTS

    @property
    def adapter_sync(self) -> Path:
        """The adapter handed to the generator for a dev evaluation between epochs."""
        return self.path / ADAPTER_SYNC

    def rft_rung(self, pass_index: int, temperature: float) -> Path:
        """RFT's rollouts of one rung of its ladder (`warm_start.source: rft`): a stopped warm
        start samples only the rungs it has not written."""
        return self.path / RFT / f"pass-{pass_index}-T{temperature:g}.jsonl.gz"

    def eval_dir(self, epoch: int) -> Path:
        """The dev evaluation after `epoch` epochs (`warm_start.select: dev`)."""
        return self.path / EVAL / f"epoch-{epoch}"


class RunInUseError(RuntimeError):
    """Another live process trains in this run directory."""


@contextmanager
def lock_run(path: Path) -> Iterator[None]:
    """Hold the run directory `path` for one training run: an exclusive `flock` on its
    `train.lock` (with the holder's pid), released when the block ends or the process dies (the
    OS drops it, so a killed run's directory is free at once). `RunInUseError` in one line,
    naming the holder's pid, while another process holds it; reading a run needs no lock."""
    path.mkdir(parents=True, exist_ok=True)
    with open(path / LOCK, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "unknown"
            raise RunInUseError(
                f"{path} is in use by another training run (pid {holder}); "
                "wait for it to end, or pick another name"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _logged_iteration(line: str) -> float:
    """The iteration of a metrics.jsonl line (a line cut short by a kill counts as unfinished)."""
    try:
        return float(json.loads(line)["iteration"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def write_config(folder: Path, config: dict[str, Any]) -> None:
    """`folder/config.yaml`: a resolved config (`RunConfig.to_dict()`)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(yaml.safe_dump(config, sort_keys=False))


def read_config(folder: Path) -> dict[str, Any] | None:
    """`folder/config.yaml` as a dict; None when it is missing or unreadable."""
    path = folder / CONFIG
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError):
        return None
    return data if isinstance(data, dict) else None


def same_settings(folder: Path, config: dict[str, Any], sections: Iterable[str]) -> bool:
    """Whether `folder/config.yaml` holds `config`'s `sections` (as YAML reads them back)."""
    written, ours = read_config(folder), yaml.safe_load(yaml.safe_dump(config))
    return written is not None and all(written.get(key) == ours.get(key) for key in sections)


def eval_rollouts_lines(folder: Path) -> list[str]:
    """The lines of `folder/rollouts.jsonl` (none when it is missing)."""
    path = folder / EVAL_ROLLOUTS
    return path.read_text().splitlines() if path.is_file() else []


@contextmanager
def eval_rollouts_sink(folder: Path, kept: Iterable[str] = ()) -> Iterator[IO[str]]:
    """`folder/rollouts.jsonl` open for writing, one JSON line per rollout (flush each one, so
    an interrupted evaluation keeps what it finished), starting with the `kept` lines (an
    interrupted pass's finished rollouts, written anew at once, so a line cut short by the kill
    goes and a second kill loses none of them)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / EVAL_ROLLOUTS
    partial = path.with_name(path.name + ".partial")
    partial.write_text("".join(line + "\n" for line in kept))
    os.replace(partial, path)
    with path.open("a") as sink:
        yield sink


def write_eval_metrics(folder: Path, metrics: dict[str, float]) -> None:
    """`folder/metrics.json`."""
    (folder / EVAL_METRICS).write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")


def write_rollouts_gz(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Gzipped JSON lines at `path`, written atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with gzip.open(tmp, "wt") as sink:
        for record in records:
            sink.write(json.dumps(record) + "\n")
    tmp.replace(path)
