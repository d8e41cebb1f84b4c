"""Every rule a config must meet, each in one place and run once: `check_values` when a config
is loaded (ranges and fields that must agree), `check_run` before a training run is built
(what the learner processes, the sampler and the suite need to agree on), `check_splits` once
the suite is built (every split the run names exists). Each raises a one-line `ConfigError`;
the components built from the config (the learner, the value head) do not check again.

What a generation backend can do is declared once, in `BACKENDS` (a `Backend` of capabilities
each); the rules ask a capability, never a backend's name, and a refusal names the backends
that have it (`having`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from loop.config_types import CRITIC_ADVANTAGES, ConfigError, RunConfig, TrainConfig
from sandbox.limits import Limits
from tasks import GoldSolutions, TaskSuite, suite_class


@dataclass(frozen=True)
class Backend:
    """What one generation backend can do: the checks here and the builder (loop/build.py)
    ask these, never a backend's name. A capability not given is one it lacks."""

    name: str
    # Samples weights a run trains and loads adapters into (an endpoint's weights are not ours)
    trains: bool = False
    # Samples with the learner's own model object: nothing to publish, one copy of the policy,
    # and log-probs that are the learner's own numbers where the dtype is float32
    shares_weights: bool = False
    # Runs beside several learner processes (its own engine, not the learner's model)
    several_learners: bool = False
    # Keeps several published adapter versions and samples the one a request names: what
    # collecting ahead (`train.overlap.max_staleness`) and `train.off_policy.split_mismatch` need
    keeps_versions: bool = False
    # Runs as servers: `generator.num_servers` started (an engine each) or `servers` attached
    runs_servers: bool = False
    # An endpoint run elsewhere: needs `generator.base_url` and `generator.served_model`
    needs_endpoint: bool = False


# Every `generator.backend` a config may name (the choices of `GeneratorConfig.backend`).
BACKENDS: dict[str, Backend] = {b.name: b for b in (
    Backend("hf", trains=True, shares_weights=True),
    Backend("vllm_server", trains=True, several_learners=True, keeps_versions=True,
            runs_servers=True),
    Backend("openai", needs_endpoint=True),
)}  # fmt: skip


def backend(config: RunConfig) -> Backend:
    """The capabilities of the config's `generator.backend`."""
    return BACKENDS[config.generator.backend]


def having(capability: Callable[[Backend], bool]) -> str:
    """The backends with `capability`, as a refusal names them: "hf or vllm_server"."""
    names = [b.name for b in BACKENDS.values() if capability(b)]
    return " or ".join([", ".join(names[:-1]), names[-1]] if len(names) > 1 else names)


def check_devices(config: RunConfig, local_world_size: int) -> None:
    """The inference GPUs (`generator.devices`): tensor_parallel_size per engine (one engine,
    or `num_servers` for a backend that runs servers), distinct, and none of the learners' on
    this node (a process per GPU 0..n-1 under a launcher, n = `local_world_size`: the
    servers start on rank 0's node). On CPU the servers' cores: distinct, at least one each."""
    settings = config.generator
    devices = settings.devices
    if not devices:
        return
    servers = backend(config).runs_servers
    engines = settings.num_servers if servers else 1
    if len(set(devices)) != len(devices) or min(devices) < 0:
        raise ConfigError(f"generator.devices {devices}: give distinct indices >= 0")
    if servers and config.model.device == "cpu":
        if len(devices) < engines:
            raise ConfigError(
                f"generator.devices {devices}: at least one CPU core for each of the "
                f"{engines} servers (generator.num_servers)"
            )
        return
    tp = settings.tensor_parallel_size
    if len(devices) != tp * engines:
        raise ConfigError(
            f"generator.devices {devices}: give {tp * engines} GPU indices, "
            f"generator.tensor_parallel_size ({tp}) for each of {engines} engine(s)"
        )
    local = local_world_size
    shared = sorted(set(devices) & set(range(local))) if local > 1 else []
    if shared:
        raise ConfigError(
            f"generator.devices {devices} overlap the GPUs 0..{local - 1} of this node's "
            f"{local} learners (GPU {shared[0]}): give the engine other GPUs"
        )


def local_learners(world_size: int) -> int:
    """The learner processes on this node: the launcher's `LOCAL_WORLD_SIZE` (torchrun's
    `--nproc-per-node`), or `world_size` without one (one node)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world_size))


def check_servers(config: RunConfig) -> None:
    """A backend that runs servers: servers to start or URLs to attach, never both; URLs that
    are URLs."""
    settings = config.generator
    if settings.num_servers < 1 or not 0 <= settings.server_port < 65536:
        raise ConfigError(
            f"generator.num_servers must be >= 1 and server_port in 0..65535, got "
            f"{settings.num_servers}, {settings.server_port}"
        )
    for key in ("server_start", "request", "publish", "health"):
        if not getattr(settings, f"{key}_timeout_s") > 0:  # NaN too
            raise ConfigError(f"generator.{key}_timeout_s must be > 0")
    for url in settings.servers:
        if not url.startswith(("http://", "https://")) or not url.rstrip("/").endswith("/v1"):
            raise ConfigError(f"generator.servers: {url!r} is not an http(s)://host:port/v1 URL")
    if settings.servers and settings.devices:
        raise ConfigError(
            "generator.devices names the started servers' devices: attached generator.servers "
            "run where they were started"
        )


def check_run(config: RunConfig, world_size: int, local_world_size: int | None = None) -> None:
    """What training with `world_size` learner processes (`local_world_size` of them on this
    node; None: the launcher's, `local_learners`) needs: weights to train, the learner's and
    the sampler's distributions equal, minibatches that shard equally, and one process for the
    value head and the memory window (not sharded yet)."""
    name, can = config.generator.backend, backend(config)
    if not can.trains:
        raise ConfigError(
            f"generator.backend {name} cannot train (no weights): use {having(lambda b: b.trains)}"
        )
    if config.agent.temperature <= 0 or config.agent.top_p != 1.0:
        raise ConfigError(
            "training samples at agent.temperature > 0 with agent.top_p = 1 (the learner's "
            f"log-probs would not match the sampler's), got {config.agent.temperature}, "
            f"{config.agent.top_p}"
        )
    if not can.several_learners and world_size > 1:
        fit = having(lambda b: b.several_learners)
        raise ConfigError(f"several learner processes need generator.backend {fit}, not {name}")
    if config.train.overlap.max_staleness and not can.keeps_versions:
        raise ConfigError(
            f"train.overlap.max_staleness {config.train.overlap.max_staleness} collects while "
            f"the learner trains, which generator.backend {name} cannot (it keeps one version "
            f"of the weights): use generator.backend: {having(lambda b: b.keeps_versions)}"
        )
    if config.train.off_policy.split_mismatch and (
        not can.keeps_versions or not config.model.lora_rank or world_size > 1
    ):
        fit = having(lambda b: b.keeps_versions)
        raise ConfigError(
            "train.off_policy.split_mismatch loads the LoRA adapter a group sampled into the "
            f"learner: it needs generator.backend {fit} (published adapters), model.lora_rank "
            f"> 0 and one learner process, got {name}, lora_rank {config.model.lora_rank}, "
            f"{world_size} processes"
        )
    if config.train.kl.coef > 0 and config.train.kl.reference == "start" and world_size > 1:
        raise ConfigError(
            "train.kl.reference start loads the starting adapter into the learner for the "
            f"reference pass, which needs one learner process, got {world_size}"
        )
    _check_demo_replay(config, world_size)
    _check_old_logprobs(config)
    check_devices(
        config, local_learners(world_size) if local_world_size is None else local_world_size
    )
    sandbox_limits(config)
    if config.train.collective_timeout_s <= 0 or config.train.rollout_wait_timeout_s <= 0:
        raise ConfigError(
            "train.collective_timeout_s and train.rollout_wait_timeout_s must be > 0, got "
            f"{config.train.collective_timeout_s}, {config.train.rollout_wait_timeout_s}"
        )
    start_s, started = config.generator.server_start_timeout_s, not config.generator.servers
    if (
        world_size > 1
        and can.runs_servers
        and started
        and start_s >= config.train.collective_timeout_s
    ):
        raise ConfigError(  # the other learners wait in a collective while rank 0 starts servers
            f"generator.server_start_timeout_s {start_s:g} must be below train.collective_timeout_s"
            f" {config.train.collective_timeout_s:g} (rank 0 starts the servers, the others wait)"
        )
    if config.train.minibatch_size % world_size:
        raise ConfigError(
            f"train.minibatch_size={config.train.minibatch_size} must be a multiple of the "
            f"{world_size} learner processes"
        )
    if config.warm_start.source != "none" and config.warm_start.minibatch_size % world_size:
        raise ConfigError(
            f"warm_start.minibatch_size={config.warm_start.minibatch_size} must be a multiple "
            f"of the {world_size} learner processes"
        )
    if config.train.loss == "reinforce" and config.train.ratio_level == "turn":
        raise ConfigError("train.loss reinforce supports ratio_level token or trajectory")
    if world_size > 1 and config.train.advantage in CRITIC_ADVANTAGES:
        raise ConfigError(f"train.advantage {config.train.advantage}: one learner process only")
    if world_size > 1 and config.model.load_in_4bit:
        raise ConfigError(
            "model.load_in_4bit: one learner process only (FSDP2 shards floating-point "
            "weights; several processes shard a bfloat16 base instead)"
        )
    if world_size > 1 and config.agent.memory_turns is not None:
        raise ConfigError("agent.memory_turns: one learner process only")
    suite = suite_class(config.suite)
    if config.warm_start.source == "gold" and not issubclass(suite, GoldSolutions):
        raise ConfigError(
            f"warm_start.source gold needs a suite with gold solutions; suite {config.suite} "
            "has none (use warm_start.source rollouts)"
        )
    if config.train.preference.search_iterations and not suite.replays_exactly:
        raise ConfigError(f"DPO-MCTS restores states by replay, which suite {config.suite} cannot")
    if config.train.preference.search_iterations and config.train.reward == "success":
        raise ConfigError("DPO-MCTS's pairs carry Q values: train.reward fraction or acted")
    if config.train.reward == "acted" and not suite.marks_collateral:
        raise ConfigError(
            f"train.reward acted needs a suite that marks its collateral test and whether the "
            f"state changed; suite {config.suite} marks none (use fraction or success)"
        )


def check_values(config: RunConfig) -> None:
    """Each field's range and the fields that must agree (run by `load_config`)."""
    positive = {
        "agent.max_turns": config.agent.max_turns,
        "agent.max_new_tokens": config.agent.max_new_tokens,
        "agent.max_context_tokens": config.agent.max_context_tokens,
        "agent.max_observation_tokens": config.agent.max_observation_tokens,
        "eval.rollouts_per_task": config.eval.rollouts_per_task,
        "eval.max_concurrent_rollouts": config.eval.max_concurrent_rollouts,
        "sandbox.cell_timeout_s": config.sandbox.cell_timeout_s,
        "generator.max_batch_size": config.generator.max_batch_size,
        "generator.kv_rows_mb": 1 if (bound := config.generator.kv_rows_mb) is None else bound,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
    if config.generator.torch_threads is not None and config.generator.torch_threads < 1:
        raise ConfigError(
            f"generator.torch_threads: must be >= 1, got {config.generator.torch_threads}"
        )
    if (kv_cache_mb := config.generator.kv_cache_mb) is not None and kv_cache_mb < 0:
        raise ConfigError(f"generator.kv_cache_mb: must be >= 0, got {kv_cache_mb}")
    if config.train.keep_every < 0:
        raise ConfigError(f"train.keep_every: must be >= 0, got {config.train.keep_every}")
    if config.sandbox.pool_size < 0:
        raise ConfigError(f"sandbox.pool_size: must be >= 0, got {config.sandbox.pool_size}")
    if config.eval.limit is not None and config.eval.limit <= 0:
        raise ConfigError(f"eval.limit: must be > 0, got {config.eval.limit}")
    if (sampled := config.eval.sampled_rollouts_per_task) < 0:
        raise ConfigError(f"eval.sampled_rollouts_per_task: must be >= 0, got {sampled}")
    if sampled and not config.eval.sampled_temperature > 0:  # NaN too
        raise ConfigError(
            f"eval.sampled_temperature: must be > 0 for a sampled pass, got "
            f"{config.eval.sampled_temperature} (greedy is the first pass's eval.temperature)"
        )
    if config.agent.temperature < 0 or not 0 < config.agent.top_p <= 1:
        raise ConfigError("agent.temperature must be >= 0 and agent.top_p in (0, 1]")
    if backend(config).needs_endpoint and not (
        config.generator.base_url and config.generator.served_model
    ):
        raise ConfigError(
            f"generator.backend {config.generator.backend} needs generator.base_url and "
            "served_model"
        )
    if backend(config).runs_servers:
        check_servers(config)
    if config.agent.memory_turns is not None and config.agent.memory_turns < 1:
        raise ConfigError(f"agent.memory_turns: must be >= 1, got {config.agent.memory_turns}")
    if not config.agent.token_time_z >= 0:  # NaN too
        raise ConfigError(f"agent.token_time_z: must be >= 0, got {config.agent.token_time_z}")
    if config.agent.max_new_tokens >= config.agent.max_context_tokens:
        raise ConfigError("agent.max_new_tokens must be smaller than agent.max_context_tokens")
    _check_train(config.train, warm_start=config.warm_start.source != "none")
    _check_warm_start(config)
    _check_critic_and_kl(config)


def _check_train(train: TrainConfig, *, warm_start: bool = False) -> None:
    if train.iterations < 0 or (train.iterations == 0 and not warm_start):
        raise ConfigError(
            f"train.iterations: must be > 0 (0 only with a warm_start), got {train.iterations}"
        )
    positive = {
        "train.tasks_per_iteration": train.tasks_per_iteration,
        "train.rollouts_per_task": train.rollouts_per_task,
        "train.max_concurrent_rollouts": train.max_concurrent_rollouts,
        "train.epochs": train.epochs,
        "train.minibatch_size": train.minibatch_size,
        "train.micro_batch_size": train.micro_batch_size,
        "train.lr": train.lr,
        "train.max_grad_norm": train.max_grad_norm,
        "train.kl_threshold": train.kl_threshold,
        "train.max_seq_len": train.max_seq_len,
        "train.logprob_chunk_size": train.logprob_chunk_size,
        "train.clip_eps": train.clip_eps,
        "train.horizon.every": train.horizon.every,
        "train.checkpoint_every": train.checkpoint_every,
        "train.keep_checkpoints": train.keep_checkpoints,
        "train.preference.buffer_size": train.preference.buffer_size,
        "train.preference.pairs_per_iteration": train.preference.pairs_per_iteration,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
    if not 0 < train.rollouts_fraction <= 1:
        raise ConfigError(
            f"train.rollouts_fraction: must be in (0, 1], got {train.rollouts_fraction}"
        )
    if not 1 <= train.min_rollouts_per_task <= train.rollouts_per_task:
        raise ConfigError(
            f"train.min_rollouts_per_task: must be in [1, rollouts_per_task="
            f"{train.rollouts_per_task}], got {train.min_rollouts_per_task}"
        )
    if train.advantage not in ("reinforce", "gae", "verlog") and train.rollouts_per_task < 2:
        raise ConfigError(f"train.rollouts_per_task: advantage {train.advantage} needs K >= 2")
    if train.micro_batch_size > train.minibatch_size:
        raise ConfigError("train.micro_batch_size must not exceed train.minibatch_size")
    if train.adv_threshold < 0 or train.eval_every < 0 or train.horizon.step < 0:
        raise ConfigError("train.adv_threshold, eval_every and horizon.step must be >= 0")
    if train.overlap.max_staleness < 0:
        raise ConfigError(
            f"train.overlap.max_staleness: must be >= 0, got {train.overlap.max_staleness}"
        )
    if train.shared_prefix_min < 0:
        raise ConfigError(f"train.shared_prefix_min: must be >= 0, got {train.shared_prefix_min}")
    if train.strictly_on_policy and train.epochs != 1:
        raise ConfigError("train.strictly_on_policy needs train.epochs=1 (one on-policy pass)")
    if train.horizon.start is not None and train.horizon.start < 1:
        raise ConfigError(f"train.horizon.start: must be >= 1, got {train.horizon.start}")
    if not 0 < train.no_signal_draw_prob <= 1:
        raise ConfigError(
            f"train.no_signal_draw_prob: must be in (0, 1], got {train.no_signal_draw_prob}"
        )
    _check_correction(train)
    p = train.preference
    if not (p.beta > 0 and 0 < p.gamma <= 1 and p.margin >= 0 and p.search_iterations >= 0):
        raise ConfigError(f"train.preference: beta > 0, gamma in (0, 1], margin >= 0, got {p}")
    dpo = train.loss == "dpo"  # one step at the reference (loop/learner/objective.py)
    if dpo != (train.advantage == "preference") or (dpo and not train.strictly_on_policy):
        raise ConfigError("train.advantage preference goes with loss dpo and strictly_on_policy")
    if train.loss == "cross_entropy" and train.advantage != "filter":
        raise ConfigError(
            "train.loss cross_entropy trains on the rollouts that advantage filter keeps: "
            f"set train.advantage=filter (got {train.advantage})"
        )


def _check_correction(train: TrainConfig) -> None:
    """The decoupled loss's cap and band; the weights are per token, in the clipped loss."""
    # NaN too; below 1 even a matching sampler's tokens lose weight
    if not train.off_policy.cap >= 1:
        raise ConfigError(f"train.off_policy.cap: must be >= 1, got {train.off_policy.cap}")
    band = train.off_policy.band
    if len(band) != 2 or not 0 <= band[0] <= 1 <= band[1] or band[0] == band[1]:
        raise ConfigError(
            f"train.off_policy.band: [low, high] with 0 <= low <= 1 <= high, got {band}"
        )
    correction = train.off_policy.correction
    if correction != "none" and (train.loss, train.ratio_level) != ("ppo", "token"):
        raise ConfigError(
            f"train.off_policy.correction {correction} weighs tokens of the clipped loss: it "
            f"needs train.loss ppo and ratio_level token, got {train.loss}, {train.ratio_level}"
        )


def _check_old_logprobs(config: RunConfig) -> None:
    """train.off_policy.old_logprobs sampler: where the sampler's log-probs are the learner's."""
    train = config.train
    if train.off_policy.old_logprobs != "sampler":
        return
    if not backend(config).shares_weights or config.model.dtype != "float32":
        fit = having(lambda b: b.shares_weights)
        raise ConfigError(
            "train.off_policy.old_logprobs sampler takes the sampler's log-probs as the "
            f"learner's: it needs generator.backend {fit} and model.dtype float32 (the learner's "
            f"own weights and numbers), got {config.generator.backend}, {config.model.dtype}"
        )
    if train.preference.search_iterations:  # the buffer's pairs were sampled by older weights
        raise ConfigError("train.off_policy.old_logprobs: DPO-MCTS needs recompute (older pairs)")
    if train.advantage in CRITIC_ADVANTAGES or train.kl.coef > 0:
        raise ConfigError(
            "train.off_policy.old_logprobs sampler skips the recompute pass, which also records "
            f"the critic's old values and the KL reference: it needs no critic (advantage "
            f"{train.advantage}) and kl.coef 0 (got {train.kl.coef})"
        )


def _check_demo_replay(config: RunConfig, world_size: int) -> None:
    """train.replay.coef: the demonstrations must exist, and shard evenly over the learners."""
    cfg = config.train
    if not cfg.replay.coef >= 0:
        raise ConfigError(f"train.replay.coef: must be >= 0, got {cfg.replay.coef}")
    if not cfg.replay.coef:
        return
    if config.warm_start.source not in ("gold", "rollouts"):
        raise ConfigError(
            "train.replay.coef replays the warm start's demonstrations: it needs "
            f"warm_start.source gold or rollouts, got {config.warm_start.source}"
        )
    if cfg.replay.demos_per_step < 1 or cfg.replay.demos_per_step % world_size:
        raise ConfigError(
            f"train.replay.demos_per_step: must be a positive multiple of the {world_size} learner "
            f"processes, got {cfg.replay.demos_per_step}"
        )


def _check_warm_start(config: RunConfig) -> None:
    warm = config.warm_start
    limit = ["limit"] if warm.limit is not None else []
    for name in ["epochs", "lr", "minibatch_size", "rft_passes", *limit]:
        if (value := getattr(warm, name)) <= 0:
            raise ConfigError(f"warm_start.{name}: must be > 0, got {value}")
    if not 0 <= warm.read_fraction <= 1:  # NaN too
        raise ConfigError(f"warm_start.read_fraction: must be in [0, 1], got {warm.read_fraction}")
    if warm.source == "rollouts" and not warm.rollouts:
        raise ConfigError("warm_start.source rollouts needs warm_start.rollouts (paths)")
    if warm.source == "rft" and (not warm.rft_temperatures or min(warm.rft_temperatures) < 0):
        raise ConfigError("warm_start.rft_temperatures: a non-empty list of temperatures >= 0")
    if warm.source != "none" and config.model.lora_rank == 0:
        raise ConfigError("warm_start needs a LoRA policy (model.lora_rank > 0)")
    if config.model.init_adapter is not None and config.model.lora_rank == 0:
        raise ConfigError("model.init_adapter needs a LoRA policy (model.lora_rank > 0)")


def _check_critic_and_kl(config: RunConfig) -> None:
    critic, train = config.critic, config.train
    if train.kl.coef < 0:
        raise ConfigError(f"train.kl.coef: must be >= 0, got {train.kl.coef}")
    if train.kl.coef > 0 and config.model.lora_rank == 0:
        raise ConfigError(
            "train.kl.coef needs a LoRA policy (model.lora_rank > 0): the reference is the base "
            "model with the adapter disabled; full fine-tuning keeps no reference copy"
        )
    if train.kl.into == "reward" and train.advantage not in CRITIC_ADVANTAGES:
        raise ConfigError(
            f"train.kl.into reward needs per-token rewards (train.advantage gae or verlog), got "
            f"{train.advantage}: use train.kl.into loss"
        )
    if critic.whiten_advantages and train.advantage not in CRITIC_ADVANTAGES:
        raise ConfigError(
            f"critic.whiten_advantages is for gae and verlog, not train.advantage "
            f"{train.advantage} (train.normalize_advantage scales LOO's)"
        )
    for key in ("gamma", "lam", "gamma_token", "lambda_token", "gamma_step", "lambda_step"):
        if not 0 <= getattr(critic, key) <= 1:
            raise ConfigError(f"critic.{key}: must be in [0, 1], got {getattr(critic, key)}")
    if critic.hidden_sizes and (len(critic.hidden_sizes) != 2 or min(critic.hidden_sizes) < 1):
        raise ConfigError(f"critic.hidden_sizes: two widths >= 1, got {critic.hidden_sizes}")
    if (critic.lr is not None and critic.lr <= 0) or critic.max_grad_norm <= 0:
        raise ConfigError("critic.lr and critic.max_grad_norm must be > 0")
    if critic.clip_eps is not None and critic.clip_eps <= 0:
        raise ConfigError(f"critic.clip_eps: must be > 0 or null, got {critic.clip_eps}")
    if min(critic.coef, critic.coef_final, critic.first_token_weight) < 0:
        raise ConfigError("critic.coef, coef_final and first_token_weight must be >= 0")
    if critic.value_range and (len(critic.value_range) != 2 or
                               critic.value_range[0] >= critic.value_range[1]):  # fmt: skip
        raise ConfigError(f"critic.value_range: [low, high], got {critic.value_range}")
    if critic.warmup_iterations < 0 or critic.coef_decay_iterations < 0:
        raise ConfigError("critic.warmup_iterations and coef_decay_iterations must be >= 0")


def check_splits(config: RunConfig, suite: TaskSuite, *, training: bool = True) -> None:
    """Every split the run uses exists in the suite (else a one-line ConfigError); evaluation
    alone uses only the eval splits, so a training config evaluates on any suite."""
    named = {"eval.split": config.eval.split}
    named |= {f"eval.more_splits[{i}]": s for i, s in enumerate(config.eval.more_splits)}
    if training:
        named["train.split"] = config.train.split
    if training and config.warm_start.source in ("gold", "rft"):
        named["warm_start.split"] = config.warm_start.split
    for key, split in ((k, part) for k, s in named.items() for part in s.split("+")):  # a+b
        try:
            suite.tasks(split)
        except (KeyError, ValueError, AssertionError) as exc:
            reason = exc.args[0] if exc.args else split
            raise ConfigError(f"{key}: {reason}") from None


def sandbox_limits(config: RunConfig) -> Limits:
    """The `sandbox` section's limits; a bad value is a one-line `ConfigError`."""
    cfg = config.sandbox
    try:
        return Limits(
            memory_mb=cfg.memory_mb, disk_mb=cfg.disk_mb, max_files=cfg.max_files,
            output_mb=cfg.output_mb,
        )  # fmt: skip
    except ValueError as exc:
        raise ConfigError(f"sandbox: {exc}") from None
