"""The LOOP trainer: `python train.py --config configs/<name>.yaml [key=value ...]`.

`train()` is the algorithm, one iteration written once as numbered steps; everything else in
this file is a step's helper (one call site each, except the weight sync and the evaluation,
which also run on resume, after the warm start and after the last iteration); steps 4-5 are the
learner's one call (loop/learner/update.py), off the event loop while groups are collected
ahead. The generator is read only through its Protocol (loop/generators/base.py: its work
counters through `stats()`). train.py checks the config once (`loop.checks.check_run`), builds
what the trainer runs on (`loop.build.build_training`, a `loop.parts.TrainParts`) and calls
`train()`; every seed comes from loop/seeds.py and every file of the run directory goes through
loop/run/rundir.py.
What "LOOP" means here, relative to the paper (Chen et al. 2025, arXiv 2502.01600, [P]) and
its reference code (apple/ml-loop, [C]):

- Rollouts: K i.i.d. rollouts per task at temperature 1 with the current weights, token in and
  token out ([P] section 4.1, [C]); tasks drawn without replacement from a seeded sampler,
  reshuffled when exhausted ([C]; [C] leaves its sampler unseeded, we seed it to resume).
- Overlap (our addition, off by default): with `overlap.max_staleness` S >= 1 the next
  iterations' groups are collected while this one learns, each group pinned to one published
  version, and a group more than S versions old is dropped and counted (loop/rollout/ahead.py and
  staleness.py). [C]'s `async_rollouts` (off by default) is one iteration stale.
- Straggler cut-off: collection stops once `rollouts_fraction` of the rollouts are done and
  every task has `min_rollouts_per_task`; the rest are cancelled and discarded ([P] App. D, [C]).
- Reward: the fraction of the task's unit tests passed ([P], [C]); `reward: success` trains on
  the binary outcome, `reward: acted` counts the collateral test only once the agent acted
  (loop/algo/credit.py; logged as `rollout/train_reward_mean`). No other shaping: no penalty for
  missing code or failed execution ([C]'s penalties default to 0).
- Advantage: leave-one-out, A_i = R_i - mean_{j != i} R_j over the group's survivors, not
  normalised ([P] Eq. 3, [C] default). Options: `normalize_advantage` (LOOP RwNorm), `grpo`
  (group mean/std), `turn` (MT-GRPO turn-level credit), `reinforce` (no baseline), `gae` /
  `verlog` (GAE / dual-discount GAE from a value head, loop/learner/critic.py). Rollouts that
  failed for an infrastructure reason are excluded and the group is re-baselined over the
  survivors; a group with fewer than 2 is dropped; both are counted (our addition: [C] has no
  infrastructure statuses).
- Filter: rollouts with |A| < `adv_threshold` (0.01) are not trained on ([P] App. D, [C]). With
  several processes the kept count is rounded up to a multiple of the world size with the next
  largest |A| ([C]).
- Old log-probs: recomputed by the learner in eval mode and used in the ratio; the sampler's
  are kept for the parity statistics `recompute/*` ([P] App. D, [C]) and the `is/*` weights.
  `off_policy.old_logprobs: sampler` (our option, AReaL's `recompute_logprob: false`) takes the
  sampler's instead, for the `hf` engine in float32 only, whose log-probs are the learner's
  weights' (within 1e-4 of the recompute, measured): no pass over every rollout.
  `off_policy.correction: truncate | mask` (our addition, off by default) weighs each token's
  objective by w = min(pi_old/pi_sampler, off_policy.cap) or drops tokens with w outside
  `off_policy.band` (AReaL's decoupled PPO, verl's token TIS, IcePop), for samplers that drift
  from the learner.
- Loss: per-token clipped surrogate, the mean over a rollout's output tokens, summed over the
  minibatch and divided by `minibatch_size` ([P] Eq. 10, [C] `pg_per_token`). Clip band
  [1/(1+eps), 1+eps] with eps 0.1 as in [C]; `clip_lower: symmetric` gives [P]'s [1-eps, 1+eps].
  `ratio_level: turn | trajectory` give [P]'s per-turn and per-trajectory ("bandit") variants;
  `loss: reinforce` drops the clipping (RLOO when on-policy).
- Mask: only tokens the policy sampled are trained, including its stop token; prompts,
  observations and chat-template glue are not ([C] section 1.3).
- Context: the whole episode, or Verlog's window of the last `agent.memory_turns` turns.
- Epochs and minibatches: 2 epochs of minibatches of 32 rollouts shuffled across tasks, one
  rollout per forward pass by default ([C]); `strictly_on_policy` runs one minibatch of
  everything (RLOO/GRPO mode).
- Guards: global grad-norm clip at 0.1 ([C]; [P] says 1.0); the rest of an iteration is
  skipped when |k1| of the minibatch exceeds 20 ([C]); a non-finite loss skips the step and the
  iteration, and the run aborts after 20 of them ([C]).
- N learners: our gradient is the single-process one (global sum / `minibatch_size`), N x [C]'s,
  whose clip sees sqrt(N) x the true norm: `max_grad_norm` 0.1 x sqrt(N) clips like [C]
  (configs/qwen2.5-32b-8gpu.yaml: 0.2 with 4 learners).
- KL: no reference model and no KL penalty; k1 and k3 are logged as diagnostics ([P], [C]);
  `kl.coef` adds GRPO's k3 penalty to the base model (the LoRA adapter disabled), in the loss,
  or with `kl.into: reward` Verlog's k1 on each output token's reward before GAE ([V]).
- Schedule: AdamW, lr 5e-5 constant, stepped once per iteration ([P], [C]).
- Weights: one model copy (LoRA by default, r 16, alpha 32, all linear layers). The `hf`
  generator samples with the training model itself; `vllm_server` gets the new adapter after
  every iteration (published as a new version, as [C] hot-loads it).
- Evaluation: on `eval.split` before every `eval_every`-th iteration, so iteration 0 evaluates
  the base model ([C]), through the same code as evaluate.py.
- Horizon: the turn limit can grow during training (ScalingInter-RL; off by default).
- Checkpoints (our addition to [C], which saves no optimizer state): adapter, optimizer,
  schedule, sampler and RNG state, so a killed run resumes where its last iteration ended.

The preference rows of [P] Table 1 (App. C) reuse the iteration too: `advantage: preference`
pairs rollouts 2j, 2j+1 of a task by their returns (+1 / -1), and `loss: dpo` trains them with
DMPO's loss, the iteration's start (the recomputed old log-probs) as the reference, in one
on-policy step (loop/algo/preference.py; DMPO, configs/table1/dmpo.yaml). With
`preference.search_iterations` > 0 (DPO-MCTS) a tree search per task replaces the K rollouts
and its sibling pairs go to a replay buffer the steps draw from (loop/rollout/search.py).

The learned-critic methods relative to their sources: the LOOP paper's "PPO (learned critic)"
row ([P] App. C: a 3-layer MLP head off the LoRA weights, gamma = lambda = 1, an L2 value loss
with its coefficient decayed 0.1 -> 0.001 over 200 iterations after a 10-iteration warm-up,
values clipped to [0, 1]; configs/table1/ppo-critic.yaml), and Verlog, from its paper (paper
000, [V-P]) and its code ([V]: WentseChen/Verlog at 589eb7e; configs/verlog.yaml):
- Dual-discount GAE: [V-P] Eq. 2, token pair (1, 1) within a turn, step pair (0.99, 0.95)
  across turns, environment tokens skipped (loop/algo/gae.py). With a token-level gamma or
  lambda other than 1, [V]'s recursion also discounts through the value at the position after
  each turn's last token (its first padding position); Eq. 2 has no such term and we follow
  Eq. 2, the paper's statement of the method: the two agree exactly at [V-P]'s (1, 1).
- Value loss: PPO's clipped form around the old value, range 0.5 ([V] `cliprange_value`), the
  first token of each turn weighted 3 ([V] `highlight_ratio`; [V-P] B.3.2 gives no number).
- KL: k1 = log pi_old - log pi_ref folded into each output token's reward, coefficient 0.001
  ([V] `use_kl_in_reward`, `kl_ctrl.kl_coef`; [V-P] B.3.4 gives no coefficient).
- Advantages whitened over the batch before the policy loss, the value targets taken from the
  raw ones ([V] `masked_whiten`, as verl does for GAE; [V-P] does not say).
- Critic warm-up: 5 iterations with the actor frozen ([V-P] B.3.3); [V]'s launch scripts use
  20-40 of theirs (`trainer.critic_warmup`), which count other units, so the paper's is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator

import torch

from loop.algo.advantages import round_to_world_size
from loop.algo.credit import Credit, assign_credit, rollout_reward
from loop.config import RunConfig, TrainConfig
from loop.evaluation import run_evaluations
from loop.generators import sync
from loop.learner.batch import Sample, learner_logprobs, make_samples
from loop.learner.critic import build_critic
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from loop.learner.stress import stress_test
from loop.learner.update import keep_start, update_policy
from loop.model import checkpoint, distributed
from loop.model.policy import Policy
from loop.parts import TrainParts
from loop.rollout.ahead import AheadCollector, Collected
from loop.rollout.collect import VersionPin, by_group, collect_rollouts, iteration_jobs
from loop.rollout.prompt import prompt_example
from loop.rollout.search import PairBuffer, search_pairs
from loop.rollout.staleness import assemble, staleness_metrics
from loop.rollout.task_sampler import TaskSampler, training_tasks
from loop.rollout.trajectory import Trajectory
from loop.run.metrics import group_signals, infra_failure_problem, iteration_metrics, throughput
from loop.run.report import learning_report
from loop.run.rundir import RunDir, write_config
from loop.run.runlog import RunLog, progress_bar, summary_line, write_rollouts
from loop.seeds import shuffle_seed
from loop.warmstart import demo_sample, demonstrations, load_init_adapter, warm_start
from tasks import Task

PUBLISHED_KEPT = 2  # adapter_sync/: the version the generator serves and the one before it


def train(config: RunConfig, parts: TrainParts, *, show_progress: bool = True) -> dict[str, float]:
    """Run LOOP for `config.train.iterations` (resuming if the run has a checkpoint).

    The config is checked for training once, by the caller, before anything is built:
    `loop.checks.check_run(config, world_size)` (train.py does)."""

    async def run() -> dict[str, float]:
        try:
            return await _train(config, parts, show_progress)
        finally:
            await parts.generator.close()  # on the loop it ran on (vLLM binds to one loop)

    return asyncio.run(run())


async def _train(config: RunConfig, parts: TrainParts, show_progress: bool) -> dict[str, float]:
    cfg, run = config.train, RunDir(config.run_dir)  # the run directory, built once
    sampler = TaskSampler(
        training_tasks(parts.suite, cfg), seed=config.seed,
        no_signal_draw_prob=cfg.no_signal_draw_prob, stratify=cfg.stratify,
    )  # fmt: skip
    learner = build_learner(config, parts.policy, run)
    buffer = PairBuffer(cfg.preference.buffer_size, config.seed)  # DPO-MCTS's, kept throughout
    start, saved = resume(run, parts.policy, learner, sampler, buffer)
    if start > 0:
        sync_weights(parts, run, start - 1)
    ahead = collect_ahead(config, parts, start, saved, buffer, show_progress)
    draw = functools.partial(sampler.draw, cfg.tasks_per_iteration)
    runlog = open_run(config, run, start) if distributed.is_main() else None
    if cfg.stress_test and start == 0:
        stress_test(learner.stress_test, cfg.max_seq_len)
    # W. The policy RL starts from: model.init_adapter, then the warm start (cached by its data).
    metrics = await start_policy(config, parts, learner, run, start, show_progress)
    for iteration in range(start, cfg.iterations):
        started, at_start = time.monotonic(), parts.generator.stats()
        max_turns = horizon(iteration, cfg, config.agent.max_turns)  # the turn limit now
        metrics = {"horizon/max_turns": max_turns} | (metrics if iteration == 0 else {})
        # 0. Evaluate before every eval_every-th iteration (iteration 0: the base model).
        if cfg.eval_every and iteration % cfg.eval_every == 0:
            metrics |= await evaluate_during_training(config, parts, run, iteration, show_progress)
        # 1. Sample tasks (seeded, without replacement, reshuffled when exhausted), and
        # 2. K rollouts per task, concurrently, until the straggler cut-off; with S >= 1 both
        #    were started ahead, at step 3b of an earlier iteration, and are awaited here.
        before = parts.generator.stats()
        collection = await ahead.take(iteration, draw)
        metrics |= {"time/rollout_s": collection.rollout_s,
                    "time/wait_rollouts_s": collection.wait_s} | collection.metrics  # fmt: skip
        metrics |= parts.generator.stats().work_since(before, "gen/")  # the hf engine's work
        # 3. Groups older than S versions are dropped (counted); advantages over each task's
        #    group; drop rollouts with |A| below the threshold.
        assembly = assemble(collection.groups, iteration, cfg.overlap.max_staleness)
        groups, discarded = assembly.groups, collection.discarded
        metrics |= staleness_metrics(assembly, ahead.recollected if iteration == start else 0)
        credit = assign_credit(
            groups, method=cfg.advantage, reward=cfg.reward, threshold=cfg.adv_threshold,
            normalize=cfg.normalize_advantage, turn_coef=cfg.turn_coef,
            return_threshold=cfg.return_threshold, margin=cfg.preference.margin,
        )  # fmt: skip
        samples, kept = select_samples(groups, credit, cfg.max_seq_len, iteration, config.seed)
        metrics |= iteration_metrics(groups, credit, discarded, samples, kept)
        if problem := infra_failure_problem(metrics, cfg.max_infra_failure_share, groups):
            raise RuntimeError(problem)
        metrics |= record_signals(sampler, groups, credit)
        # 3b. Overlap (overlap.max_staleness S >= 1): draw and dispatch the next iterations' groups
        #     now, so the servers sample them while steps 4-5 run in a worker thread.
        ahead.dispatch_ahead(iteration, draw)
        # 4. Old log-probs: the learner's recompute, compared with the sampler's (or, with
        #    old_logprobs: sampler, the sampler's: the hf engine runs the same weights); the
        #    mismatch split at pi_v; the critic's advantages (gae / verlog), then
        # 5. epochs of minibatch steps (grad clip, KL early stop, non-finite steps skipped).
        with timed(metrics, "time/learn_s"):
            parts.generator.release_memory()  # the sampler's caches, for the learner's memory
            update = await ahead.off_loop(
                update_policy, learner, samples, groups, credit, config, iteration,
                run.adapter_sync, show_progress,
            )  # fmt: skip
            metrics |= update.metrics
        # 6. Push the new weights to the generator (a LoRA adapter for vLLM; nothing for hf);
        #    groups dispatched from now on sample them.
        with timed(metrics, "time/sync_s"):
            sync_weights(parts, run, iteration, keep=PUBLISHED_KEPT + cfg.overlap.max_staleness)
            ahead.published = iteration + 1
        # 7. Log, save the rollouts, checkpoint.
        elapsed = time.monotonic() - started
        metrics |= throughput(metrics, groups, update.stats.trained_tokens, elapsed)
        metrics |= parts.generator.stats().servers_since(at_start, elapsed)  # vllm_server's
        if runlog is not None:
            record_iteration(
                runlog, config, run, iteration, metrics, groups, update.credit, kept, samples
            )
        if (iteration + 1) % cfg.checkpoint_every == 0 or iteration + 1 == cfg.iterations:
            save(run, iteration + 1, parts.policy, learner, sampler, ahead, buffer, cfg)
    # After the last iteration: the final evaluation, so the run ends with a before/after pair.
    return await finish(config, parts, run, metrics, runlog, show_progress)


@contextlib.contextmanager
def timed(metrics: dict[str, float], key: str) -> Iterator[None]:
    """The block's wall time in seconds, written to `metrics[key]` when it ends."""
    started = time.monotonic()
    yield
    metrics[key] = time.monotonic() - started


async def start_policy(
    config: RunConfig, parts: TrainParts, learner: Learner, run: RunDir, start: int,
    show_progress: bool,
) -> dict[str, float]:  # fmt: skip
    """Step W on a fresh run: load `model.init_adapter`, then run (or load) the configured warm
    start; its metrics. Fresh or resumed: the policy RL starts from kept where later steps read
    it (`keep_start`), and the demonstrations every step replays with `train.replay.coef` set
    (played again on a resume)."""
    cfg = config.train
    metrics: dict[str, float] = {}
    demos: list[Trajectory] = []
    if start == 0 and config.model.init_adapter is not None:
        load_init_adapter(config, parts.policy)
        sync_weights(parts, run, -1)
    if start == 0 and config.warm_start.source != "none":
        metrics, demos = await warm_start(config, parts, show_progress=show_progress)
    keep_start(learner, run.adapter_sync(0) if cfg.off_policy.split_mismatch else None)
    if cfg.replay.coef > 0:
        demos = demos or await demonstrations(config, parts, show_progress)
        learner.replay([demo_sample(d, cfg.max_seq_len) for d in demos], seed=config.seed)
    return metrics


async def finish(
    config: RunConfig, parts: TrainParts, run: RunDir, metrics: dict[str, float],
    runlog: RunLog | None, show_progress: bool,
) -> dict[str, float]:  # fmt: skip
    """After the last iteration: the final evaluation (logged at `train.iterations`), the run
    log closed and the learning report printed; returns the last metrics with it."""
    cfg = config.train
    final: dict[str, float] = {}
    if cfg.eval_every:  # on a rerun, only the rollouts an interrupted one did not finish
        final = await evaluate_during_training(config, parts, run, cfg.iterations, show_progress)
    if cfg.iterations == 0:
        final = metrics | final  # no iteration logged the warm start's numbers
    if runlog is not None and final:
        runlog.log(cfg.iterations, final)
    metrics |= final
    if runlog is not None:
        runlog.close()
        print(learning_report(run.path), file=sys.stderr)
    return metrics


def record_signals(
    sampler: TaskSampler, groups: list[list[Trajectory]], credit: Credit
) -> dict[str, float]:
    """Tell the sampler what each group taught; its skip counts since the last iteration."""
    for group, signal in zip(groups, group_signals(groups, credit), strict=True):
        sampler.record(group[0].task_id, signal)
    return {k: float(v) for k, v in sampler.take_skip_counts().items()}


def build_learner(config: RunConfig, policy: Policy, run: RunDir | None = None) -> Learner:
    """The learner with the run's optimisation settings (`run`: where the KL's starting
    reference is kept, with `train.kl.reference: start`)."""
    settings = LearnerSettings.for_rl(config)
    if config.train.kl.coef > 0 and config.train.kl.reference == "start":
        if run is None:
            raise ValueError("train.kl.reference start needs the run directory")
        settings = dataclasses.replace(settings, reference_adapter=run.kl_reference)
    return Learner(policy, settings, critic=build_critic(config, policy))


def horizon(iteration: int, cfg: TrainConfig, max_turns: int) -> int:
    """The turn limit of `iteration`: horizon.start + step * (iteration // every), capped."""
    if cfg.horizon.start is None:
        return max_turns
    return min(max_turns, cfg.horizon.start + cfg.horizon.step * (iteration // cfg.horizon.every))


def resume(
    run: RunDir, policy: Policy, learner: Learner, sampler: TaskSampler, buffer: PairBuffer
) -> tuple[int, dict[int, list[Task]]]:
    """Load the newest complete checkpoint, if any; returns the iteration to start from and
    the tasks of the iterations it had dispatched ahead (loop/rollout/ahead.py: re-collected).

    Rank 0 chooses it for every process: ranks looking for themselves can see different
    newest checkpoints (one written meanwhile) and then run different iterations."""
    latest = distributed.broadcast_object(checkpoint.latest_checkpoint(run.checkpoints))
    if latest is None:
        return 0, {}
    state = checkpoint.load_state(latest)
    checkpoint.load_weights(policy.model, latest)
    learner.load_state_dict(state["learner"])
    sampler.load_state_dict(state["sampler"])
    if "pairs" in state:  # DPO-MCTS's replay buffer
        buffer.load_state_dict(state["pairs"])
    checkpoint.restore_rng(state["rng"])
    print(f"resuming from {latest} (iteration {state['iteration']})", file=sys.stderr)
    by_id = {task.id: task for task in sampler.tasks}
    ahead = {int(j): [by_id[i] for i in ids] for j, ids in state.get("ahead", {}).items()}
    return int(state["iteration"]), ahead


def collect_ahead(
    config: RunConfig, parts: TrainParts, start: int, saved: dict[int, list[Task]],
    buffer: PairBuffer, show_progress: bool,
) -> AheadCollector:  # fmt: skip
    """Steps 1-2 and 3b: the iterations' collections, each group pinned to the version
    published when it starts (named to the generator only when collecting ahead)."""
    cfg = config.train

    def pin() -> VersionPin:
        pinned = parts.generator.version if cfg.overlap.max_staleness else None
        return VersionPin(ahead.published, pinned)

    async def collect(iteration: int, tasks: list[Task]) -> Collected:
        max_turns = horizon(iteration, cfg, config.agent.max_turns)  # the turn limit then
        if cfg.preference.search_iterations and distributed.is_main():  # DPO-MCTS: tree searches
            score = functools.partial(rollout_reward, kind=cfg.reward)
            return await search_pairs(parts, tasks, iteration, config, max_turns, buffer, score)
        return await roll_out(config, parts, tasks, iteration, max_turns, show_progress, pin)

    ahead = AheadCollector(
        collect, max_staleness=cfg.overlap.max_staleness,
        tasks_per_iteration=cfg.tasks_per_iteration, iterations=cfg.iterations,
        published=start, saved=saved,
    )  # fmt: skip
    return ahead


def open_run(config: RunConfig, run: RunDir, start: int) -> RunLog:
    """Write the resolved config and open the run log (keeping the completed iterations' lines)."""
    write_config(run.path, config.to_dict())
    run.keep_metrics_before(start)
    return RunLog(
        run, tensorboard=config.train.tensorboard,
        wandb_project=config.train.wandb_project, config=config.to_dict(),
    )  # fmt: skip


async def evaluate_during_training(
    config: RunConfig, parts: TrainParts, run: RunDir, iteration: int, show_progress: bool
) -> dict[str, float]:
    """evaluate.py's evaluation of eval.split (`eval/*`) and of each of eval.more_splits
    (`eval/<split>/*`), written under eval/<split>/iter-<iteration>/ (a sampled pass's under
    eval/<split>@T<t>/iter-<iteration>/, metrics `.../sampled/*`). A rerun after a kill keeps
    the rollouts the interrupted one finished: its policy is the same checkpoint's."""
    if not distributed.is_main():
        return {}
    metrics: dict[str, float] = {}
    with timed(metrics, "time/eval_s"):
        before = parts.generator.stats()
        for split in [config.eval.split, *config.eval.more_splits]:
            scores = await run_evaluations(
                config, suite=parts.suite, pool=parts.pool, generator=parts.generator,
                tokenizer=parts.tokenizer, out_dir=lambda label: run.eval_dir(label, iteration),
                show_progress=show_progress, split=split, resume=True,
            )  # fmt: skip
            prefix = "eval/" if split == config.eval.split else f"eval/{split}/"
            metrics |= {prefix + k.removeprefix("eval/"): v for k, v in scores.items()}
        metrics |= parts.generator.stats().work_since(before, "gen/eval_")
    return metrics


async def roll_out(
    config: RunConfig, parts: TrainParts, tasks: list[Task], iteration: int, max_turns: int,
    show_progress: bool, pin: Callable[[], VersionPin],
) -> Collected:  # fmt: skip
    """K rollouts per task of at most `max_turns` turns, with the straggler cut-off, each
    group on the version `pin` gives when it starts; returns the groups and the number
    discarded."""
    cfg = config.train
    if not distributed.is_main():
        return [], 0, {}
    jobs, enough = iteration_jobs(tasks, iteration, config.seed, cfg)
    settings = dataclasses.replace(config.agent, max_turns=max_turns)
    progress = progress_bar(len(jobs), f"iter {iteration} rollouts", show_progress)
    done = await collect_rollouts(
        jobs, suite=parts.suite, pool=parts.pool, generator=parts.generator,
        tokenizer=parts.tokenizer, settings=settings,
        example=prompt_example(parts.suite, config.agent.worked_example),
        max_concurrent=cfg.max_concurrent_rollouts, on_done=lambda _: progress.update(1),
        enough=enough, pin=pin,
    )  # fmt: skip
    progress.close()
    return by_group(done), len(jobs) - len(done), {}


def select_samples(
    groups: list[list[Trajectory]], credit: Credit, max_seq_len: int, iteration: int, seed: int
) -> tuple[list[Sample], list[bool]]:
    """Samples of the kept rollouts, this process's equal shard; and the kept flag per rollout."""
    flat = [traj for group in groups for traj in group]
    world = distributed.world_size()  # the kept count rounded up to a multiple of it, by |A|
    keep = round_to_world_size(credit.keep, credit.magnitude, credit.present, world)
    samples = []
    for i, traj in enumerate(flat):
        if keep[i]:
            advantages, reward = credit.turn_advantages[i], credit.rewards[i]
            samples += make_samples(traj, advantages, max_seq_len, i, reward)
    samples = distributed.wait_for_main(samples)  # rank 0 alone evaluated and collected
    shuffle = torch.Generator().manual_seed(shuffle_seed(seed, iteration))
    order = torch.randperm(len(samples), generator=shuffle)
    shard = [samples[int(i)] for i in order][distributed.rank() :: world]
    return shard, keep


def sync_weights(
    parts: TrainParts, run: RunDir, iteration: int, keep: int = PUBLISHED_KEPT
) -> None:
    """Hand the new weights to the generator (the hf generator already samples from them),
    keeping the newest `keep` published directories (the S older versions groups collected
    ahead may still sample, too)."""
    target = run.adapter_sync(iteration + 1)
    sync.publish_weights(parts.policy, parts.generator, target, keep=keep)


def record_iteration(
    runlog: RunLog, config: RunConfig, run: RunDir, iteration: int, metrics: dict[str, float],
    groups: list[list[Trajectory]], credit: Credit, kept: list[bool], samples: list[Sample],
) -> None:  # fmt: skip
    """metrics.jsonl/TensorBoard, the one-line summary, and rollouts/iter-N.jsonl.gz."""
    runlog.log(iteration, metrics)
    print(summary_line(iteration, config.train.iterations, metrics), file=sys.stderr, flush=True)
    if config.train.save_rollouts:
        path = run.rollouts(iteration)
        flat = [traj for group in groups for traj in group]
        recomputed = (  # none recomputed when the sampler's are the old log-probs
            learner_logprobs(samples, [len(traj.tokens) for traj in flat])
            if config.train.off_policy.old_logprobs == "recompute"
            else {}
        )
        write_rollouts(
            path, flat, iteration, config.train.split, credit.turn_advantages, kept, recomputed
        )


def save(
    run: RunDir, iteration: int, policy: Policy, learner: Learner, sampler: TaskSampler,
    ahead: AheadCollector, buffer: PairBuffer, cfg: TrainConfig,
) -> None:  # fmt: skip
    """An atomic checkpoint after `iteration` completed iterations (collective; rank 0 writes),
    with the tasks of the iterations dispatched ahead (re-collected on resume)."""
    state = {
        "learner": learner.state_dict(), "sampler": sampler.state_dict(),
        "ahead": ahead.pending_tasks(), "pairs": buffer.state_dict(),
    }  # fmt: skip
    keep = cfg.keep_checkpoints, cfg.keep_every  # the last n, and every k-th
    checkpoint.save_checkpoint(run.checkpoints, iteration, policy.model, state, *keep)
