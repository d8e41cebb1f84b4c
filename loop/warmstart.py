"""Warm start: supervised fine-tuning of the policy before RL, on demonstrations, cached.

LOOP learns only from groups whose rollouts differ, so a policy that never succeeds gives it
nothing. The warm start trains the one policy (its LoRA adapter) with cross-entropy on the
output tokens of demonstrations, through the same learner, chunked log-probs and minibatches
as RL (`loss: cross_entropy`). It is also how the LOOP paper's fine-tuning baselines run
(its App. C): SFT-GT is `source: gold` with `style: paper`; RFT is `source: rft`.

1. Demonstrations (`warm_start.source`):
   - `gold`: the suite's gold solutions played through the real episode loop (loop/demos.py);
   - `rollouts`: successful rollouts of any run or model, replayed with this tokenizer;
   - `rft`: rejection sampling: the starting policy rolls out every task once per temperature
     of `rft_temperatures` (each rung's rollouts written to `warm_start/rft/`: a stopped warm
     start resumes at the next rung); every rollout reaching `min_reward` is kept; tasks still
     unsolved get another pass, up to `rft_passes` ([P] App. C: 0.05 to 1.0 in steps of
     0.05); when none succeeds the policy is left as it is (fine-tuning on nothing), in a line.
2. The cache key: the model, the LoRA and warm-start settings, the agent settings (the prompt)
   and the data (the demonstrations' token ids; for `rft`, the tasks, since its data is what
   the policy samples). A cached adapter is loaded instead of training.
3. `epochs` passes of cross-entropy minibatch steps (`lr`, `minibatch_size`), a checkpoint
   after each epoch under `runs/<name>/warm_start/checkpoints/` (a killed warm start resumes
   at its last epoch). `select: dev` evaluates on `eval.split` after each epoch and keeps the
   best epoch (the paper picks its RFT epoch on dev); `last` keeps the last.
4. The adapter is written to `runs/<name>/warm_start/adapter/` (PEFT format: `evaluate.py
   --checkpoint` scores it) and to the cache (`$LOOP_CACHE_DIR/warm-start/<key>/`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from loop.config import ConfigError, RunConfig
from loop.demos import (
    DemonstrationError,
    assistant_messages,
    demo_settings,
    gold_scripts,
    play,
    read_successful_rollouts,
)
from loop.evaluation import run_evaluation
from loop.generators import sync
from loop.generators.scripted import Message
from loop.learner.batch import Sample, make_sample
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from loop.model import checkpoint, distributed
from loop.model.aliases import default_cache_dir
from loop.model.policy import Policy
from loop.parts import TrainParts
from loop.rollout.collect import RolloutJob, collect_rollouts
from loop.rollout.prompt import prompt_example
from loop.rollout.task_sampler import split_tasks
from loop.rollout.trajectory import Trajectory
from loop.run.records import find_sources, read_rollouts
from loop.run.rundir import ADAPTER, RunDir, WarmStartDir, iter_name, write_rollouts_gz
from loop.run.runlog import progress_bar
from loop.seeds import minibatch_seed, rft_seed

INFO = "info.json"


async def warm_start(
    config: RunConfig, parts: TrainParts, *, show_progress: bool = True
) -> tuple[dict[str, float], list[Trajectory]]:
    """Fine-tune `parts.policy` as configured, or load the cached result: `warm_start/*`
    metrics, and the demonstrations played on the way (their ids are the cache key; none when
    an `rft` warm start came from the cache), which `train.replay.coef` then replays."""
    started = time.monotonic()
    warm = config.warm_start
    out = RunDir(config.run_dir).warm_start
    key = cache_key(config, None) if warm.source == "rft" else None
    cached = _cached(key) if key and warm.cache else None
    demos: list[Trajectory] = []
    if distributed.broadcast_object(cached) is None:  # rank 0's look at the cache decides
        demos = await demonstrations(config, parts, show_progress)
        key = key or cache_key(config, demos)
        cached = _cached(key) if warm.cache else None
    cached = distributed.broadcast_object(cached)
    if warm.source == "rft" and not demos and cached is None:  # an empty set: nothing to learn
        if distributed.is_main():
            why = "rft kept no rollout (no task solved at any temperature)"
            print(f"warm start: {why}; the policy is left as it is", file=sys.stderr)
        elapsed = time.monotonic() - started
        empty = {"warm_start/demonstrations": 0.0, "warm_start/cached": 0.0}
        return empty | {"time/warm_start_s": elapsed}, demos
    if cached is not None:
        checkpoint.load_weights(parts.policy.model, cached)
        if distributed.is_main():
            _publish(cached / ADAPTER, out.adapter)
        sync.serve_adapter(parts.generator, out.adapter)
        info = json.loads((cached / INFO).read_text())
        if distributed.is_main():
            print(f"warm start: cached adapter {cached} ({info['summary']})", file=sys.stderr)
        metrics = {f"warm_start/{k}": v for k, v in info["metrics"].items()}
        elapsed = time.monotonic() - started
        return metrics | {"warm_start/cached": 1.0, "time/warm_start_s": elapsed}, demos
    assert key is not None
    metrics = await fine_tune(config, parts, demos, out, show_progress)
    checkpoint.save_weights(parts.policy.model, out.adapter)
    sync.serve_adapter(parts.generator, out.adapter)
    summary = (
        f"{len(demos)} demonstrations ({warm.source}), {warm.epochs} epochs: loss "
        f"{metrics['loss_first_epoch']:.3f} -> {metrics['loss_last_epoch']:.3f}, "
        f"epoch {int(metrics['selected_epoch'])} kept"
    )
    if warm.cache and distributed.is_main():
        _store(
            key,
            out.adapter,
            {"summary": summary, "metrics": metrics, "config": _settings(config)},
        )
    elapsed = time.monotonic() - started
    if distributed.is_main():
        print(
            f"warm start: {summary}, {elapsed / 60:.1f} min; adapter in {out.adapter}",
            file=sys.stderr,
        )
    return {f"warm_start/{k}": v for k, v in metrics.items()} | {
        "warm_start/cached": 0.0,
        "time/warm_start_s": elapsed,
    }, demos


async def demonstrations(
    config: RunConfig, parts: TrainParts, show_progress: bool
) -> list[Trajectory]:
    """The configured demonstrations, each a graded trajectory that reached `min_reward`.

    Rank 0 alone plays them (it holds the sandboxes and the generator) and hands them, or the
    one-line error that stopped it, to every learner process."""
    found: list[Trajectory] | str = []
    if distributed.is_main():
        try:
            found = await _demonstrations(config, parts, show_progress)
        except ConfigError as exc:
            found = str(exc)
    found = distributed.wait_for_main(found)
    if isinstance(found, str):
        raise ConfigError(found)
    return found


async def _demonstrations(
    config: RunConfig, parts: TrainParts, show_progress: bool
) -> list[Trajectory]:
    warm = config.warm_start
    example = prompt_example(parts.suite, config.agent.worked_example)
    concurrency = config.train.max_concurrent_rollouts
    try:
        if warm.source == "rft":
            found = await rejection_sample(config, parts, example, show_progress)
        else:
            if warm.source == "gold":
                scripts: list[tuple[Any, Sequence[Message]]] = [
                    (t, gold_scripts(parts.suite, t, warm.style, warm.read_fraction))
                    for t in _tasks(config, parts)
                ]
            else:
                replayed = read_successful_rollouts(warm.rollouts, warm.min_reward)
                scripts = [(parts.suite.task(t.task_id), assistant_messages(t)) for t in replayed]
            found = await play(
                scripts, suite=parts.suite, pool=parts.pool, tokenizer=parts.tokenizer,
                settings=demo_settings(config.agent, scripts), example=example,
                max_concurrent=concurrency, paper_observations=warm.style == "paper",
            )  # fmt: skip
    except (DemonstrationError, KeyError) as exc:
        raise ConfigError(f"warm_start: {exc}") from None
    # Authored turns must fit what the policy may write; replayed rollouts are graded again below.
    cut = sorted({t.task_id for t in found if any(u.finish_reason == "length" for u in t.turns)})
    if cut and warm.source == "gold":
        raise ConfigError(
            f"warm_start: demonstrations with a turn longer than agent.max_new_tokens="
            f"{config.agent.max_new_tokens} (the policy could never write them): {cut[:5]}"
        )
    kept = [t for t in found if t.reward is not None and t.reward >= warm.min_reward]
    if warm.source == "gold" and len(kept) < len(found):
        bad = sorted({t.task_id for t in found if t not in kept})
        raise ConfigError(f"warm_start: gold demonstrations that do not solve their task: {bad}")
    if not kept and warm.source != "rft":  # rejection sampling may find none: the policy stays
        raise ConfigError(f"warm_start: no demonstration reaches min_reward {warm.min_reward}")
    return kept


async def rejection_sample(
    config: RunConfig, parts: TrainParts, example: list[dict[str, str]], show_progress: bool
) -> list[Trajectory]:
    """RFT's data: the starting policy over the temperature ladder, the successes kept."""
    warm = config.warm_start
    tasks = _tasks(config, parts)
    unsolved = {t.id for t in tasks}
    kept: list[Trajectory] = []
    folder = RunDir(config.run_dir).warm_start
    for pass_index in range(warm.rft_passes):
        for t_index, temperature in enumerate(warm.rft_temperatures):
            rung = folder.rft_rung(pass_index, temperature)
            jobs = [
                RolloutJob(task, t_index, seed=rft_seed(config.seed, pass_index, t_index, i))
                for i, task in enumerate(tasks)
                if task.id in unsolved or pass_index == 0
            ]
            settings = dataclasses.replace(config.agent, temperature=temperature)
            rung_name = f"rft pass {pass_index} T={temperature:g}"
            if rung.is_file():  # sampled before a stop
                done = _read_rung(rung)
            else:
                with progress_bar(len(jobs), rung_name, show_progress) as progress:
                    done = await collect_rollouts(
                        jobs, suite=parts.suite, pool=parts.pool, generator=parts.generator,
                        tokenizer=parts.tokenizer, settings=settings, example=example,
                        max_concurrent=config.train.max_concurrent_rollouts,
                        on_done=functools.partial(_advance, progress),
                    )  # fmt: skip
                write_rollouts_gz(rung, (t.to_json() for t in done))
            good = [t for t in done if t.reward is not None and t.reward >= warm.min_reward]
            kept += good
            unsolved -= {t.task_id for t in good}
            if show_progress:
                solved = f"{len(tasks) - len(unsolved)}/{len(tasks)} tasks solved"
                print(f"{rung_name}: {len(good)}/{len(done)} kept, {solved}", file=sys.stderr)
        if not unsolved:
            break
    return kept


def _advance(progress: tqdm, _: Trajectory) -> None:
    progress.update(1)


def _read_rung(path: Path) -> list[Trajectory]:
    """One rung's rollouts as `rejection_sample` wrote them (the rollouts files' reader)."""
    return [rollout.traj for rollout in read_rollouts(find_sources(path)[0])]


async def fine_tune(
    config: RunConfig,
    parts: TrainParts,
    demos: list[Trajectory],
    out: WarmStartDir,
    show_progress: bool,
) -> dict[str, float]:
    """Epochs of cross-entropy steps on `demos` (resuming from the last epoch's checkpoint)."""
    warm = config.warm_start
    learner = Learner(parts.policy, LearnerSettings.for_warm_start(config))
    samples = [demo_sample(d, config.train.max_seq_len) for d in demos]
    root = out.checkpoints
    history: dict[str, list[float]] = {"loss": [], "dev_tgc": []}
    first = 0
    latest = checkpoint.latest_checkpoint(root)
    if latest is not None:
        state = checkpoint.load_state(latest)
        checkpoint.load_weights(parts.policy.model, latest)
        learner.load_state_dict(state["learner"])
        history, first = state["history"], int(state["iteration"])
        print(f"warm start: resuming after epoch {first}", file=sys.stderr)
    for epoch in range(first, warm.epochs):
        steps = math.ceil(len(samples) / learner.local_minibatch_size())
        desc = f"warm start epoch {epoch + 1}/{warm.epochs}"
        progress = progress_bar(steps, desc, show_progress, unit="step")
        try:
            stats = learner.learn(
                samples, seed=minibatch_seed(config.seed, epoch),
                on_step=functools.partial(progress.update, 1),
            )  # fmt: skip
        finally:
            progress.close()
        history["loss"].append(stats.metrics()["loss/policy"])
        if warm.select == "dev":
            sync.publish_weights(parts.policy, parts.generator, out.adapter_sync)
            tgc = None
            if distributed.is_main():  # rank 0 holds the generator and the sandboxes
                scores = await run_evaluation(
                    config, suite=parts.suite, pool=parts.pool, generator=parts.generator,
                    tokenizer=parts.tokenizer, out_dir=out.eval_dir(epoch + 1),
                    show_progress=show_progress,
                )  # fmt: skip
                tgc = scores["eval/tgc"]
            history["dev_tgc"].append(distributed.wait_for_main(tgc))
        state = {"learner": learner.state_dict(), "history": history}
        checkpoint.save_checkpoint(root, epoch + 1, parts.policy.model, state, keep=warm.epochs)
        if show_progress:
            dev = f", dev TGC {history['dev_tgc'][-1]:.3f}" if history["dev_tgc"] else ""
            loss = history["loss"][-1]
            print(f"warm start: epoch {epoch + 1}/{warm.epochs} loss {loss:.4f}{dev}",
                  file=sys.stderr)  # fmt: skip
    selected = warm.epochs
    if warm.select == "dev":
        selected = 1 + max(range(warm.epochs), key=lambda e: (history["dev_tgc"][e], e))
        checkpoint.load_weights(parts.policy.model, root / iter_name(selected))
    metrics = {
        "demonstrations": float(len(demos)),
        "demo_tokens": float(sum(len(d.tokens) for d in demos)),
        "trained_tokens_per_epoch": float(sum(s.num_output_tokens for s in samples)),
        "epochs": float(warm.epochs),
        "loss_first_epoch": history["loss"][0],
        "loss_last_epoch": history["loss"][-1],
        "selected_epoch": float(selected),
    }
    if history["dev_tgc"]:
        metrics["selected_dev_tgc"] = history["dev_tgc"][selected - 1]
    return metrics


def cache_key(config: RunConfig, demos: list[Trajectory] | None) -> str:
    """What the warm-started adapter depends on, hashed (see the module docstring, step 2)."""
    digest = hashlib.sha256(json.dumps(_settings(config), sort_keys=True).encode())
    for demo in demos or []:
        digest.update(json.dumps([demo.task_id, demo.tokens, demo.is_output]).encode())
    return digest.hexdigest()[:20]


def load_init_adapter(config: RunConfig, policy: Policy) -> None:
    """`model.init_adapter`: start from a PEFT adapter directory (or a checkpoint holding one)."""
    path = Path(str(config.model.init_adapter)).expanduser()
    adapter = path if (path / checkpoint.ADAPTER_FILE).is_file() else path / ADAPTER
    try:
        checkpoint.load_adapter(policy.model, adapter)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(f"model.init_adapter: {exc}") from None


def _settings(config: RunConfig) -> dict[str, Any]:
    model = dataclasses.asdict(config.model)
    for irrelevant in ("device", "torch_threads", "attn_implementation"):
        model.pop(irrelevant)
    warm = dataclasses.asdict(config.warm_start)
    warm.pop("cache")
    for option, default in (("limit", None), ("read_fraction", 1.0)):
        if warm[option] == default:  # keys from before the option existed stay valid
            warm.pop(option)
    return {
        "model": model, "warm_start": warm, "agent": dataclasses.asdict(config.agent),
        "suite": config.suite, "seed": config.seed,
        "micro_batch_size": config.train.micro_batch_size,
        "max_seq_len": config.train.max_seq_len, "weight_decay": config.train.weight_decay,
        "max_grad_norm": config.train.max_grad_norm,
        "eval": dataclasses.asdict(config.eval) if config.warm_start.select == "dev" else None,
    }  # fmt: skip


def _tasks(config: RunConfig, parts: TrainParts) -> list[Any]:
    warm = config.warm_start
    tasks = split_tasks(parts.suite, warm.split, warm.max_difficulty, "warm_start.split")
    return tasks[: warm.limit]


def demo_sample(demo: Trajectory, max_seq_len: int) -> Sample:
    """A demonstration as the learner's cross-entropy trains it (every output token, A = 1)."""
    return make_sample(demo, [1.0] * max(len(demo.turns), 1), max_seq_len)


def _cache_root() -> Path:
    return default_cache_dir() / "warm-start"


def _cached(key: str | None) -> Path | None:
    if key is None:
        return None
    folder = _cache_root() / key
    complete = (folder / INFO).is_file() and (folder / ADAPTER).is_dir()
    return folder if complete else None


def _store(key: str, adapter: Path, info: dict[str, Any]) -> None:
    """Copy the adapter into the cache atomically (a temporary sibling, then a rename)."""
    final = _cache_root() / key
    tmp = final.with_name(f".tmp-{key}-{time.monotonic_ns()}")
    shutil.copytree(adapter, tmp / ADAPTER)
    (tmp / INFO).write_text(json.dumps(info, indent=2, sort_keys=True))
    if final.exists():
        shutil.rmtree(tmp)
        return
    tmp.rename(final)


def _publish(adapter: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(adapter, target)
