"""Typed run configuration: YAML file + `key=value` overrides -> `RunConfig`, or a one-line error.

Every field has a type and a one-line doc; a wrong key, a wrong type or a bad value is a
`ConfigError` naming the dotted key (`agent.max_turns: expected int, got 'ten'`), never a
traceback deep in a run. Defaults follow the paper where it has a number (loop_spec.md);
`configs/quickstart.yaml` scales them down for a CPU.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml


class ConfigError(ValueError):
    """A configuration problem, stated in one line that names the key."""


@dataclass
class ModelConfig:
    """The policy LLM."""

    name: str = "smollm2-135m"  # a hub id, a local path, or a built-in alias (loop/models.py)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    attn_implementation: str | None = None  # e.g. "sdpa", "flash_attention_2"; None = default
    lora_rank: int = 16  # LoRA r; 0 = full fine-tuning
    lora_alpha: int = 32
    lora_dropout: float = 0.0
    lora_target_modules: str = "all-linear"
    load_in_4bit: bool = False  # 4-bit base via bitsandbytes (CUDA only)
    gradient_checkpointing: bool = False
    torch_threads: int | None = None  # CPU threads for torch ops (None: torch's default)
    init_adapter: str | None = None  # start from this PEFT LoRA adapter directory (LoRA only)


@dataclass
class GeneratorConfig:
    """Which backend samples the rollouts."""

    backend: Literal["hf", "vllm", "openai"] = "hf"
    max_batch_size: int = 8  # hf: rows decoded together (continuous batching)
    kv_reuse: bool = True  # hf: reuse shared prompt prefixes and each rollout's previous turn
    kv_cache_mb: float = 1024  # hf: memory for cached prefixes and previous turns (LRU)
    torch_threads: int | None = None  # hf: torch's CPU threads while sampling (None: as is)
    gpu_memory_utilization: float = 0.4  # vllm: share of (GPU or CPU KV) memory for the engine
    max_model_len: int = 8192  # vllm: longest sequence the engine plans for
    tensor_parallel_size: int = 1  # vllm: GPUs one engine spans
    base_url: str | None = None  # openai: the endpoint, e.g. http://127.0.0.1:8000/v1
    served_model: str | None = None  # openai: the model name the endpoint serves
    openai_mode: Literal["completions", "chat"] = "completions"


@dataclass
class SandboxConfig:
    """The REPL sandboxes the agent's code runs in."""

    pool_size: int = 4  # warm kernels kept ready
    cell_timeout_s: float = 30.0  # wall time of one cell
    memory_mb: int = 2048
    max_output_chars: int = 20_000  # cell output cut with a notice past this


@dataclass
class AgentConfig:
    """The ReAct episode."""

    max_turns: int = 50  # the paper: 40 in training, 50 in evaluation
    max_new_tokens: int = 1500  # per turn
    max_context_tokens: int = 32_768  # the whole rollout; the episode ends when it is spent
    max_observation_tokens: int = 3000  # longer observations are cut with a notice
    temperature: float = 1.0
    top_p: float = 1.0
    rollout_timeout_s: float = 3600.0  # wall time of one rollout ("timeout" when its cells used it)
    worked_example: bool = True  # show the suite's worked example in the prompt (the paper does)
    memory_turns: int | None = None  # Verlog's memory: context + the last n turns (None: all)


@dataclass
class EvalConfig:
    """evaluate.py and the trainer's periodic evaluation."""

    split: str = "dev"  # the suite's split to evaluate (apptown adds easy and easy_heldout)
    more_splits: list[str] = field(default_factory=list)  # also evaluated during training
    rollouts_per_task: int = 1  # K for pass@k
    limit: int | None = None  # evaluate only the first N tasks of the split
    max_concurrent_rollouts: int = 8
    temperature: float | None = None  # sampling temperature (None: agent.temperature)
    max_turns: int | None = None  # the turn limit in evaluation (None: agent.max_turns)


@dataclass
class TrainConfig:
    """train.py: the LOOP iteration (loop_spec.md sections 2 and 3; paper values as defaults)."""

    iterations: int = 200  # RL iterations (each: collect, learn, sync)
    split: str = "train"  # the suite split tasks are drawn from
    max_difficulty: int | None = None  # keep only tasks up to this difficulty (paper: 2)
    tasks_per_iteration: int = 40  # N: tasks drawn per iteration (without replacement)
    rollouts_per_task: int = 6  # K: i.i.d. rollouts of each task
    max_concurrent_rollouts: int = 8  # rollouts in flight at once
    rollouts_fraction: float = 0.9  # straggler cut-off: stop once this share of rollouts is done
    min_rollouts_per_task: int = 4  # ... and every task has at least this many
    # fraction of tests passed | all passed | acted: the collateral test counts only once the
    # agent called complete_task or changed something (loop/credit.py)
    reward: Literal["fraction", "success", "acted"] = "fraction"
    # loo | grpo | turn (MT-GRPO) | reinforce | filter (A = 1 where the return reaches
    # return_threshold, else 0: expert iteration, with loss cross_entropy) | gae (per-token GAE
    # from a value head: the paper's PPO with a learned critic) | verlog (dual-discount GAE)
    advantage: Literal["loo", "grpo", "turn", "reinforce", "filter", "gae", "verlog"] = "loo"
    return_threshold: float = 1.0  # advantage filter: the return a rollout must reach (EI: 1.0)
    normalize_advantage: bool = False  # loo only: divide by the group std ("LOOP RwNorm")
    turn_coef: float = 1.0  # advantage turn: weight of the turn-level advantage (MT-GRPO)
    adv_threshold: float = 0.01  # drop rollouts with |A| below this before learning
    # clipped surrogate | REINFORCE without clipping | cross-entropy on the kept rollouts (EI)
    loss: Literal["ppo", "reinforce", "cross_entropy"] = "ppo"
    ratio_level: Literal["token", "turn", "trajectory"] = "token"  # importance-weight granularity
    clip_eps: float = 0.1  # PPO epsilon
    clip_lower: Literal["reciprocal", "symmetric"] = "reciprocal"  # [1/(1+eps), 1+eps] or 1-eps
    epochs: int = 2  # passes over the kept rollouts per iteration
    minibatch_size: int = 32  # rollouts per optimizer step (the loss is divided by this)
    micro_batch_size: int = 1  # rollouts per forward pass (gradient accumulation in between)
    strictly_on_policy: bool = False  # one epoch, one minibatch of everything (RLOO / GRPO)
    lr: float = 5e-5  # AdamW, constant schedule stepped once per iteration
    weight_decay: float = 0.01
    max_grad_norm: float = 0.1  # global L2 clip (the reference code; the paper says 1.0)
    kl_threshold: float = 20.0  # |k1| above this skips the rest of the iteration
    kl_coef: float = 0.0  # beta of the k3 KL to the reference (GRPO; LoRA only: adapter off)
    max_nan_steps: int = 20  # abort the run after this many skipped non-finite steps
    max_seq_len: int = 32_000  # longer rollouts are truncated for learning (and counted)
    logprob_chunk_size: int = 1024  # positions per LM-head chunk in the log-prob computation
    logprob_diff_threshold: float | None = None  # abort if max |learner - sampler| exceeds it
    max_infra_failure_share: float | None = 0.5  # abort if more of an iteration's rollouts fail
    stress_test: bool = True  # forward+backward of a max_seq_len rollout before iteration 0
    horizon_start: int | None = None  # turn limit of iteration 0 (None: agent.max_turns)
    horizon_step: int = 0  # ScalingInter-RL: the turn limit grows by this ...
    horizon_every: int = 1  # ... every this many iterations, up to agent.max_turns
    # A task whose last group carried no signal (every rollout the same reward: all solved or
    # all failed) is drawn with this probability when its turn comes (1.0: always, the paper).
    no_signal_draw_prob: float = 1.0
    eval_every: int = 5  # evaluate on eval.split before every n-th iteration (0: never)
    checkpoint_every: int = 1  # save every n iterations (and after the last)
    keep_checkpoints: int = 3  # keep the last n checkpoints
    save_rollouts: bool = True  # write every rollout to rollouts/iter-N.jsonl.gz
    tensorboard: bool = True
    wandb_project: str | None = None  # log to Weights & Biases too (needs wandb installed)
    deterministic: bool = False  # torch deterministic algorithms (reproducible on CPU)


@dataclass
class CriticConfig:
    """The value head of `train.advantage: gae | verlog` (loop/critic.py; [P] App. C, Verlog)."""

    hidden_sizes: list[int] = field(default_factory=list)  # MLP widths; []: 3/5, 2/5 of hidden
    lr: float | None = None  # AdamW of the head (None: train.lr)
    clip_eps: float | None = 0.2  # value clipping around the old value (None: unclipped)
    value_range: list[float] = field(default_factory=list)  # clamp V to [lo, hi] ([P]: 0, 1)
    coef: float = 0.1  # value loss coefficient at iteration 0 ([P]: 0.1)
    coef_final: float = 0.001  # ... decayed linearly to this ([P]: 0.001)
    coef_decay_iterations: int = 200  # ... over this many iterations ([P]: 200)
    grad_to_body: bool = False  # let the value loss reach the LoRA weights ([P]: no)
    warmup_iterations: int = 0  # first iterations with the actor frozen ([P]: 10)
    first_token_weight: float = 1.0  # value-loss weight of a turn's first token (Verlog: > 1)
    max_grad_norm: float = 1.0  # global L2 clip of the head's gradient
    gamma: float = 1.0  # gae: discount ([P]: 1; 0.95-0.999 diverged)
    lam: float = 1.0  # gae: lambda ([P]: 1, so A = R - V)
    gamma_token: float = 1.0  # verlog: discount between tokens of a turn (paper 000: 1)
    lambda_token: float = 1.0  # verlog: lambda between tokens of a turn (paper 000: 1)
    gamma_step: float = 0.99  # verlog: discount across turns (paper 000: 0.99)
    lambda_step: float = 0.95  # verlog: lambda across turns (paper 000: 0.95)


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning before RL (loop/warmstart.py; the paper's SFT-GT and RFT)."""

    # none | gold (the suite's gold solutions played as agent episodes) | rollouts (successful
    # rollouts from `rollouts`, replayed) | rft (rejection sampling over a temperature ladder)
    source: Literal["none", "gold", "rollouts", "rft"] = "none"
    split: str = "train"  # tasks of the gold demonstrations and of RFT
    max_difficulty: int | None = None  # keep only tasks up to this difficulty
    style: Literal["episode", "paper"] = "episode"  # paper: "Execution successful." observations
    rollouts: list[str] = field(default_factory=list)  # run dirs, eval dirs or rollouts files
    min_reward: float = 1.0  # rollouts and rft: keep rollouts whose reward reaches this
    epochs: int = 3  # passes over the demonstrations
    lr: float = 1e-3  # AdamW, constant
    minibatch_size: int = 8  # demonstrations per optimizer step
    select: Literal["last", "dev"] = "last"  # dev: evaluate after each epoch, keep the best
    rft_temperatures: list[float] = field(
        default_factory=lambda: [round(0.05 * i, 2) for i in range(1, 21)]
    )  # the paper's ladder: 0.05 to 1.0 in steps of 0.05
    rft_passes: int = 1  # passes over the ladder for tasks still unsolved (paper: until 8 h)
    cache: bool = True  # reuse an adapter trained on the same data with the same settings


@dataclass
class RunConfig:
    """One run: what to train or evaluate, with what, where results go."""

    name: str = "run"
    output_dir: str = "runs"  # results go to <output_dir>/<name>/
    suite: str = "apptown"
    seed: int = 0
    model: ModelConfig = field(default_factory=ModelConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)

    @property
    def run_dir(self) -> Path:
        """Where this run writes (derived in one place)."""
        return Path(self.output_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for writing the resolved config next to the results."""
        return dataclasses.asdict(self)


def load_config(path: Path | str | None, overrides: list[str] = ()) -> RunConfig:  # type: ignore[assignment]
    """Read a YAML file (or start from defaults), apply `a.b=value` overrides, validate.

    A file may start from another: `base: other.yaml` (relative to the file) loads that one first
    and then applies this file's keys on top, section by section.
    """
    data = _read_yaml(Path(path), ()) if path is not None else {}
    for override in overrides:
        _apply_override(data, override)
    config = _build(RunConfig, data, prefix="")
    _check_values(config)
    return config


def _read_yaml(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """One config file as a mapping, with its `base` chain merged underneath."""
    if not path.is_file():
        where = f" (base of {chain[-1]})" if chain else ""
        raise ConfigError(f"config file not found: {path}{where}")
    if path.resolve() in chain:
        raise ConfigError(f"{path}: base configs form a cycle")
    try:
        loaded = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(exc)})") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of keys")
    base = loaded.pop("base", None)
    if base is None:
        return loaded
    if not isinstance(base, str):
        raise ConfigError(f"{path}: base must be a file name, got {base!r}")
    return _merge(_read_yaml(path.parent / base, (*chain, path.resolve())), loaded)


def _merge(under: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `under`; mappings merge key by key, anything else replaces."""
    merged = dict(under)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {override!r} is not key=value")
    try:
        value = yaml.safe_load(raw) if raw else ""
    except yaml.YAMLError:
        value = raw
    node = data
    *parents, leaf = key.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {key}: {part} is not a section")
        node = child
    node[leaf] = value


def _build(cls: type, data: Any, prefix: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]} (known: {', '.join(fields)})")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            values[name] = _build(typing.cast(type, hint), value, prefix=f"{prefix}{name}.")
        else:
            values[name] = _coerce(value, hint, f"{prefix}{name}")
    return cls(**values)


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_coerce(item, args[0], f"{key}[{i}]") for i, item in enumerate(value)]
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not (
        isinstance(value, hint) and not (hint is int and isinstance(value, bool))
    ):
        raise ConfigError(f"{key}: expected {hint.__name__}, got {value!r}")
    return value


def _check_values(config: RunConfig) -> None:
    positive = {
        "agent.max_turns": config.agent.max_turns,
        "agent.max_new_tokens": config.agent.max_new_tokens,
        "agent.max_context_tokens": config.agent.max_context_tokens,
        "agent.max_observation_tokens": config.agent.max_observation_tokens,
        "eval.rollouts_per_task": config.eval.rollouts_per_task,
        "eval.max_concurrent_rollouts": config.eval.max_concurrent_rollouts,
        "sandbox.cell_timeout_s": config.sandbox.cell_timeout_s,
        "generator.max_batch_size": config.generator.max_batch_size,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
    if config.generator.torch_threads is not None and config.generator.torch_threads < 1:
        raise ConfigError(
            f"generator.torch_threads: must be >= 1, got {config.generator.torch_threads}"
        )
    if (kv_cache_mb := config.generator.kv_cache_mb) < 0:
        raise ConfigError(f"generator.kv_cache_mb: must be >= 0, got {kv_cache_mb}")
    if config.sandbox.pool_size < 0:
        raise ConfigError(f"sandbox.pool_size: must be >= 0, got {config.sandbox.pool_size}")
    if config.eval.limit is not None and config.eval.limit <= 0:
        raise ConfigError(f"eval.limit: must be > 0, got {config.eval.limit}")
    if config.agent.temperature < 0 or not 0 < config.agent.top_p <= 1:
        raise ConfigError("agent.temperature must be >= 0 and agent.top_p in (0, 1]")
    if config.generator.backend == "openai" and not (
        config.generator.base_url and config.generator.served_model
    ):
        raise ConfigError("generator.backend openai needs generator.base_url and served_model")
    if config.agent.memory_turns is not None and config.agent.memory_turns < 1:
        raise ConfigError(f"agent.memory_turns: must be >= 1, got {config.agent.memory_turns}")
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
        "train.horizon_every": train.horizon_every,
        "train.checkpoint_every": train.checkpoint_every,
        "train.keep_checkpoints": train.keep_checkpoints,
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
    if train.adv_threshold < 0 or train.eval_every < 0 or train.horizon_step < 0:
        raise ConfigError("train.adv_threshold, eval_every and horizon_step must be >= 0")
    if train.strictly_on_policy and train.epochs != 1:
        raise ConfigError("train.strictly_on_policy needs train.epochs=1 (one on-policy pass)")
    if train.horizon_start is not None and train.horizon_start < 1:
        raise ConfigError(f"train.horizon_start: must be >= 1, got {train.horizon_start}")
    if not 0 < train.no_signal_draw_prob <= 1:
        raise ConfigError(
            f"train.no_signal_draw_prob: must be in (0, 1], got {train.no_signal_draw_prob}"
        )
    if train.loss == "cross_entropy" and train.advantage != "filter":
        raise ConfigError(
            "train.loss cross_entropy trains on the rollouts that advantage filter keeps: "
            f"set train.advantage=filter (got {train.advantage})"
        )


def _check_warm_start(config: RunConfig) -> None:
    warm = config.warm_start
    positive = {
        "warm_start.epochs": warm.epochs,
        "warm_start.lr": warm.lr,
        "warm_start.minibatch_size": warm.minibatch_size,
        "warm_start.rft_passes": warm.rft_passes,
    }
    for key, value in positive.items():
        if value <= 0:
            raise ConfigError(f"{key}: must be > 0, got {value}")
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
    if train.kl_coef < 0:
        raise ConfigError(f"train.kl_coef: must be >= 0, got {train.kl_coef}")
    if train.kl_coef > 0 and config.model.lora_rank == 0:
        raise ConfigError(
            "train.kl_coef needs a LoRA policy (model.lora_rank > 0): the reference is the base "
            "model with the adapter disabled; full fine-tuning keeps no reference copy"
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


def _first_line(exc: Exception) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
