"""Where a run's numbers go: `metrics.jsonl`, TensorBoard, optionally Weights & Biases
(the files' names and writers are loop/run/rundir.py's).

One `RunLog` per run, written by the main process only. Every record is one JSON line with the
iteration and namespaced keys (`rollout/reward_mean`, `loss/clipfrac`, `time/learn_s`, ...);
TensorBoard gets the same scalars. `summary_line` is the one-line report printed per
iteration; `progress_bar` the bar of a step under way (rollouts, learner steps), on stderr.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from loop.run.rundir import RunDir, write_rollouts_gz

if TYPE_CHECKING:
    from loop.rollout.trajectory import Trajectory


class RunLog:
    """Appends metrics to the run's `metrics.jsonl` and the configured dashboards."""

    def __init__(
        self, run: RunDir, *, tensorboard: bool, wandb_project: str | None, config: dict[str, Any]
    ):
        self.run = run
        self.path = run.metrics
        run.path.mkdir(parents=True, exist_ok=True)
        self._writer: Any = None
        self._wandb: Any = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._writer = SummaryWriter(log_dir=str(self.run.tensorboard))
        if wandb_project:
            try:
                import wandb
            except ImportError:
                raise RuntimeError(
                    "train.wandb_project is set but wandb is not installed: pip install wandb"
                ) from None
            self._wandb = wandb.init(project=wandb_project, name=run.path.name, config=config)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        """One record for `iteration` (non-finite values are written as null)."""
        record: dict[str, float | None] = {"iteration": iteration, "time": time.time()}
        record.update({k: (v if math.isfinite(v) else None) for k, v in metrics.items()})
        self.run.append_metrics(record)
        if self._writer is not None:
            for key, value in metrics.items():
                if math.isfinite(value):
                    self._writer.add_scalar(key, value, iteration)
            self._writer.flush()
        if self._wandb is not None:
            self._wandb.log(metrics, step=iteration)

    def close(self) -> None:
        """Flush and close the dashboards."""
        if self._writer is not None:
            self._writer.close()
        if self._wandb is not None:
            self._wandb.finish()


def summary_line(iteration: int, total: int, m: dict[str, float]) -> str:
    """`iter 3/10 | reward 0.52 success 0.10 | kept 12/24 ... | rollout 120s learn 30s ...`."""

    def f(key: str, spec: str = ".3f") -> str:
        value = m.get(key, math.nan)
        return "-" if value is None or not math.isfinite(value) else format(value, spec)

    if "search/return_mean" in m:  # DPO-MCTS: its rollouts are the searches', its groups pairs
        sampled = (
            f"search return {f('search/return_mean')} ({f('search/rollouts', '.0f')} rollouts, "
            f"{f('search/new_pairs', '.0f')} new pairs, {f('search/buffer_pairs', '.0f')} kept)"
        )
    else:
        sampled = f"reward {f('rollout/reward_mean')} success {f('rollout/success_rate')}"
    return (
        f"iter {iteration + 1}/{total} | {sampled} | kept {f('rollout/kept', '.0f')}/"
        f"{f('rollout/count', '.0f')} (filtered {f('rollout/filtered_fraction', '.2f')}"
        f"{_no_signal(m)}) | "
        f"clip {f('loss/clipfrac')} kl {f('loss/kl_k1', '.4f')} "
        f"gnorm {f('loss/grad_norm')} | {f('throughput/generated_tokens_per_s', '.1f')} tok/s | "
        f"rollout {f('time/rollout_s', '.0f')}s learn {f('time/learn_s', '.0f')}s "
        f"sync {f('time/sync_s', '.0f')}s"
    )


def _no_signal(m: dict[str, float]) -> str:
    """`; of 4 groups 4 stuck` (`; of 6 groups 1 stuck, 2 solved`) when some groups had one
    reward in every rollout and so taught nothing; empty otherwise."""
    keys = ("rollout/groups_stuck", "rollout/groups_solved", "rollout/tasks")
    stuck, solved, tasks = (m.get(key) or 0 for key in keys)
    if not tasks or not (stuck or solved):
        return ""
    said = ", ".join(f"{n:.0f} {kind}" for kind, n in (("stuck", stuck), ("solved", solved)) if n)
    return f"; of {tasks:.0f} groups {said}"


def write_rollouts(
    path: Path, rollouts: Sequence[Trajectory], iteration: int, split: str,
    turn_advantages: Sequence[list[float]], kept: Sequence[bool],
    learner_logprobs: Mapping[int, list[float | None]],
) -> None:  # fmt: skip
    """Write one iteration's rollouts to `path` (gzipped JSON lines, atomically).

    Each line is `Trajectory.to_json()` plus the iteration, its turns' advantages (and
    `advantage`, their one value when all turns share it), whether it was trained on, and
    `learner_logprobs` (rollout index -> the recomputed old log-probs, parallel to `tokens`,
    null off the loss mask; given for the rollouts this process trained on).
    """

    def record(i: int, traj: Trajectory) -> dict[str, Any]:
        advantages = turn_advantages[i]
        return traj.to_json() | {
            "iteration": iteration, "split": split,
            "advantage": advantages[0] if len(set(advantages)) == 1 else None,
            "turn_advantages": advantages, "kept": kept[i],
            "learner_logprobs": learner_logprobs.get(i),
        }  # fmt: skip

    write_rollouts_gz(path, (record(i, traj) for i, traj in enumerate(rollouts)))


def progress_bar(total: int, desc: str, show: bool, unit: str = "rollout") -> tqdm:
    """A bar on stderr for `total` units of one step (none when not `show`), cleared at close."""
    return tqdm(total=total, desc=desc, unit=unit, disable=not show, file=sys.stderr, leave=False)
