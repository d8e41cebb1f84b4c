"""The run configuration's types: one dataclass per section, every field with its one-line doc.

The doc is the field's metadata (`doc(default, text)`), so `python train.py --help-config`
prints it and a test checks that no field lacks one. Defaults follow the paper where it has a
number (loop_spec.md); `configs/quickstart.yaml` scales them down for a CPU. Loading, the
`--help-config` text (`describe`) and validation live in loop/config.py and loop/checks.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Advantage = Literal["loo", "grpo", "turn", "reinforce", "filter", "gae", "verlog", "preference"]


class ConfigError(ValueError):
    """A configuration problem, stated in one line that names the key."""


def one_line(exc: BaseException, *, typed: bool = False) -> str:
    """An exception in one line for a one-line error: its message's first line (looking
    through wrappers with no message of their own, such as vLLM's), prefixed by its type when
    `typed`; its type alone when it has no message."""
    while not str(exc).strip() and exc.__cause__ is not None:
        exc = exc.__cause__
    text = str(exc).strip()
    if not text:
        return type(exc).__name__
    first = text.splitlines()[0]
    return f"{type(exc).__name__}: {first}" if typed else first


def doc(default: Any, text: str) -> Any:
    """A field with `default` and its one-line doc (shown by `--help-config`)."""
    return dataclasses.field(default=default, metadata={"doc": text})


def doc_factory(factory: Callable[[], Any], text: str) -> Any:
    """A field whose default is made by `factory` (a list, a section), with its doc."""
    return dataclasses.field(default_factory=factory, metadata={"doc": text})


@dataclass
class ModelConfig:
    """The policy LLM."""

    name: str = doc(
        "smollm2-135m", "a hub id, a local path, or a built-in alias (loop/model/aliases.py)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = doc(
        "float32", "weights' dtype (float32 on CPU; bfloat16 on GPU)"
    )
    device: Literal["cpu", "cuda", "auto"] = doc("cpu", "where the policy runs (auto: CUDA if any)")
    attn_implementation: str | None = doc(None, 'e.g. "sdpa", "flash_attention_2"; None = default')
    lora_rank: int = doc(16, "LoRA r; 0 = full fine-tuning")
    lora_alpha: int = doc(32, "LoRA alpha (the update is scaled by alpha / r)")
    lora_dropout: float = doc(0.0, "dropout on the LoRA branch")
    lora_target_modules: str = doc(
        "all-linear",
        "which layers get LoRA adapters (PEFT's target_modules; all-linear: every linear layer)",
    )
    load_in_4bit: bool = doc(False, "4-bit base via bitsandbytes (CUDA only)")
    gradient_checkpointing: bool = doc(False, "recompute activations in backward: less memory")
    torch_threads: int | None = doc(None, "CPU threads for torch ops (None: torch's default)")
    recompute: Literal["none", "mlp", "layers"] = doc("none", "recomputed in backward, not kept")
    init_adapter: str | None = doc(None, "start from this PEFT LoRA adapter directory (LoRA only)")


@dataclass
class GeneratorConfig:
    """Which backend samples the rollouts."""

    backend: Literal["hf", "vllm_server", "openai"] = doc(
        "hf",
        "hf (samples with the training model itself) | vllm_server (vLLM OpenAI servers, "
        "versioned LoRA publication) | openai (an endpoint; evaluation only)",
    )
    max_batch_size: int = doc(8, "hf: rows decoded together (continuous batching)")
    kv_reuse: bool = doc(True, "hf: reuse shared prompt prefixes and each rollout's previous turn")
    kv_cache_mb: float | None = doc(
        None,
        "hf: memory for cached prefixes and previous turns (LRU); None: a quarter of the GPU's "
        "free memory, 1024 on a CPU",
    )
    kv_rows_mb: float | None = doc(None, "hf: rows' keys and values at most (past it: wait)")
    torch_threads: int | None = doc(None, "hf: torch's CPU threads when sampling (None: as is)")
    gpu_memory_utilization: float = doc(0.4, "vllm_server: a server's share of (KV) memory")
    max_model_len: int = doc(8192, "vllm_server: longest sequence a server plans for")
    tensor_parallel_size: int = doc(1, "vllm_server: GPUs one server spans")
    devices: list[int] = doc_factory(
        list,
        "vllm_server: the servers' GPUs, as indices among those the trainer sees (an inherited "
        "CUDA_VISIBLE_DEVICES maps them; [] = all), tensor_parallel_size per server, never the "
        "GPUs 0..n-1 of the n learners on rank 0's node (LOCAL_WORLD_SIZE). On CPU: the cores "
        "the servers' threads are bound to, split evenly between them",
    )
    num_servers: int = doc(1, "vllm_server: servers to start (when `servers` is empty)")
    servers: list[str] = doc_factory(
        list,
        "vllm_server: URLs of running servers to use instead (http://host:port/v1, started "
        "with --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=1; the run directory on a "
        "filesystem they see)",
    )
    server_port: int = doc(0, "vllm_server: the first started server's port (0: free ports)")
    server_start_timeout_s: float = doc(600.0, "vllm_server: a server's start-up, at most")
    request_timeout_s: float = doc(600.0, "vllm_server: a completion's wait (tried twice), at most")
    publish_timeout_s: float = doc(120.0, "vllm_server: one server's adapter load, at most")
    health_timeout_s: float = doc(
        30.0, "vllm_server: a server not answering GET /health this long leaves routing"
    )
    server_args: list[str] = doc_factory(list, "vllm_server: more args for started servers")
    base_url: str | None = doc(None, "openai: the endpoint, e.g. http://127.0.0.1:8000/v1")
    served_model: str | None = doc(
        None, "openai, vllm_server: the model name the endpoint serves (vllm_server: the base)"
    )
    openai_mode: Literal["completions", "chat"] = doc(
        "completions",
        "openai: the completions API on token ids (token in, token out) or the chat API",
    )


@dataclass
class SandboxConfig:
    """The REPL sandboxes the agent's code runs in."""

    pool_size: int = doc(4, "warm kernels kept ready")
    cell_timeout_s: float = doc(30.0, "wall time of one cell")
    memory_mb: int = doc(2048, "address-space limit of one kernel")
    max_output_chars: int = doc(20_000, "cell output cut with a notice past this")
    disk_mb: int = doc(256, "the agent's writable files in total (a tmpfs; sandbox/limits.py)")
    max_files: int = doc(4096, "... and their number")
    output_mb: int = doc(64, "output the host reads from one sandbox over an episode, at most")


@dataclass
class AgentConfig:
    """The ReAct episode."""

    max_turns: int = doc(50, "the paper: 40 in training, 50 in evaluation")
    max_new_tokens: int = doc(1500, "per turn")
    max_context_tokens: int = doc(32_768, "the whole rollout; the episode ends when it is spent")
    max_observation_tokens: int = doc(3000, "longer observations are cut with a notice")
    temperature: float = doc(1.0, "sampling temperature (training needs > 0)")
    top_p: float = doc(
        1.0, "nucleus sampling (training needs 1.0: the learner scores the full distribution)"
    )
    rollout_timeout_s: float = doc(
        3600.0,
        'wall time of one rollout ("timeout", scored, when its cells and tokens used half)',
    )
    token_time_z: float = doc(
        2.0,
        "timeout attribution: emitted tokens cost the agent the backend's measured time per "
        "token plus this many standard errors (loop/rollout/attribution.py)",
    )
    worked_example: bool = doc(True, "show the suite's worked example in the prompt ([P] does)")
    memory_turns: int | None = doc(None, "Verlog's memory: context + the last n turns (None: all)")


@dataclass
class EvalConfig:
    """evaluate.py and the trainer's periodic evaluation."""

    split: str = doc("dev", "the split to evaluate (apptown adds easy, lookup and their _heldout)")
    more_splits: list[str] = doc_factory(list, "also evaluated during training")
    rollouts_per_task: int = doc(1, "K for pass@k")
    max_difficulty: int | None = doc(None, "keep only tasks up to this difficulty, every split")
    limit: int | None = doc(None, "evaluate only the first N tasks of the split")
    max_concurrent_rollouts: int = doc(8, "rollouts in flight at once, all passes together")
    temperature: float | None = doc(None, "sampling temperature (None: agent.temperature)")
    max_turns: int | None = doc(None, "the turn limit in evaluation (None: agent.max_turns)")
    sampled_rollouts_per_task: int = doc(
        0,
        "also sample K rollouts per task at sampled_temperature in the same pass, written as split"
        " '<split>@T<t>' (eval/sampled/*): greedy success can rise while sampled does not (0: off)",
    )
    sampled_temperature: float = doc(1.0, "the sampled pass's temperature (training's: 1)")


CRITIC_ADVANTAGES = ("gae", "verlog")  # train.advantage values that train a value head


@dataclass
class OffPolicyConfig:
    """train.off_policy: a sampler that is not the learner (loop/algo/correction.py)."""

    old_logprobs: Literal["recompute", "sampler"] = doc(
        "recompute",
        "the PPO ratio's old log-probs: recompute (a no-grad learner pass over every kept "
        "rollout, compared with the sampler's: recompute/*; [P] App. D, [C]) | sampler (the "
        "sampler's own, no pass: AReaL's recompute_logprob false; only generator.backend hf in "
        "float32, which samples with the learner's weights: within 1e-4 of the recompute)",
    )
    logprob_diff_threshold: float | None = doc(None, "abort if max |learner - sampler| exceeds it")
    correction: Literal["none", "truncate", "mask"] = doc(
        "none",
        "the sampler-mismatch correction of the decoupled loss: each token's clipped objective "
        "times w = pi_prox/mu | none (w = 1, the paper) | truncate (min(w, cap): verl's and "
        "SkyRL's token TIS; AReaL's decoupled PPO) | mask (w outside band drops the token: IcePop)",
    )
    cap: float = doc(2.0, "correction truncate: the cap C on w (verl's and SkyRL's TIS: 2)")
    band: list[float] = doc_factory(
        lambda: [0.5, 2.0],
        "correction mask: tokens with w outside [low, high] get no gradient (IcePop: 0.5, 2)",
    )
    split_mismatch: bool = doc(
        False,
        "with overlap.max_staleness >= 1: recompute a stale group's tokens under the adapter it "
        "sampled (pi_v), splitting the mu-pi_prox mismatch into the engine's (mu vs pi_v) and "
        "staleness (pi_v vs pi_prox): mismatch/*; one pass; LoRA, one learner process",
    )


@dataclass
class KLConfig:
    """train.kl: a KL penalty to a reference policy (GRPO's, Verlog's); off in the paper."""

    coef: float = doc(0.0, "beta of the KL to the reference (LoRA only: the adapter off)")
    into: Literal["loss", "reward"] = doc(
        "loss",
        "where the KL goes: loss (k3 in the loss, GRPO) | reward (k1 on each output token's "
        "reward before GAE, Verlog's code; gae and verlog only)",
    )
    reference: Literal["base", "start"] = doc(
        "base",
        "the policy the KL is to: base (the LoRA adapter off: GRPO's and Verlog's reference) | "
        "start (the policy RL started from: the warm-start adapter or model.init_adapter, kept "
        "as runs/<name>/kl_reference/: held near what the demonstrations taught; one process)",
    )


@dataclass
class ReplayConfig:
    """train.replay: the warm start's demonstrations in every step; off in the paper."""

    coef: float = doc(
        0.0,
        "lambda of a cross-entropy term on the warm start's demonstrations added to every "
        "step's loss, against forgetting what they taught (0: off, the paper). Replay of "
        "supervised data during RL, as InstructGPT's PPO-ptx mixes pretraining gradients "
        "(Ouyang et al. 2022); needs warm_start.source gold or rollouts",
    )
    demos_per_step: int = doc(
        2, "coef > 0: demonstrations in each step's term (seeded cycle; a multiple of the learners)"
    )


@dataclass
class OverlapConfig:
    """train.overlap: collecting ahead while an iteration learns; off in the paper."""

    max_staleness: int = doc(
        0,
        "S: collect the next iterations' rollouts while this one learns, at most S policy "
        "versions behind (0: the synchronous loop of the paper and [C]; 1: one-step "
        "off-policy, verl's and [C]'s async_rollouts). Older groups are dropped and counted; "
        "needs generator.backend vllm_server; pair with off_policy.correction truncate",
    )


@dataclass
class HorizonConfig:
    """train.horizon: a turn limit that grows (ScalingInter-RL); off in the paper."""

    start: int | None = doc(None, "turn limit of iteration 0 (None: agent.max_turns)")
    step: int = doc(0, "the turn limit grows by this ...")
    every: int = doc(1, "... every this many iterations, up to agent.max_turns")


@dataclass
class PreferenceConfig:
    """train.preference: the preference baselines of [P] App. C (loop/algo/preference.py)."""

    beta: float = doc(0.1, "beta of the DPO / DMPO loss (DPO's usual 0.1; [P] gives none)")
    gamma: float = doc(0.9, "DMPO's discount in its turn weights phi(t, T) (1: (T - t) / T)")
    margin: float = doc(0.0, "a pair needs returns (or Q values) more than this apart ([P])")
    search_iterations: int = doc(
        0, "> 0: DPO-MCTS, a tree search of this many iterations per task (no K rollouts; [P]: 30)"
    )
    buffer_size: int = doc(1024, "DPO-MCTS: pairs kept in its persistent replay buffer")
    pairs_per_iteration: int = doc(64, "DPO-MCTS: pairs drawn from the buffer per iteration")


@dataclass
class TrainConfig:
    """train.py: the LOOP iteration (loop_spec.md sections 2 and 3; paper values as defaults),
    its variants, the run's bookkeeping, and the extensions in named sections."""

    # The paper's LOOP.
    iterations: int = doc(200, "RL iterations (each: collect, learn, sync)")
    tasks_per_iteration: int = doc(40, "N: tasks drawn per iteration (without replacement)")
    rollouts_per_task: int = doc(6, "K: i.i.d. rollouts of each task")
    advantage: Advantage = doc(
        "loo",
        "loo | grpo | turn (MT-GRPO) | reinforce | filter (A = 1 where the return reaches "
        "return_threshold, else 0: expert iteration, with loss cross_entropy) | gae (per-token "
        "GAE from a value head: the paper's PPO with a learned critic) | verlog (dual-discount "
        "GAE) | preference (rollouts 2j, 2j+1 whose returns differ by more than "
        "preference.margin: A = +1 / -1, DMPO, with loss dpo)",
    )
    adv_threshold: float = doc(0.01, "drop rollouts with |A| below this before learning")
    loss: Literal["ppo", "reinforce", "cross_entropy", "dpo"] = doc(
        "ppo",
        "clipped surrogate | REINFORCE without clipping | cross-entropy on the kept rollouts (EI)"
        " | dpo (the DMPO loss of preference pairs, the iteration's start as the reference)",
    )
    clip_eps: float = doc(0.1, "PPO epsilon")
    epochs: int = doc(2, "passes over the kept rollouts per iteration")
    minibatch_size: int = doc(32, "rollouts per optimizer step (the loss is divided by this)")
    lr: float = doc(5e-5, "AdamW, constant schedule stepped once per iteration")
    max_grad_norm: float = doc(0.1, "global L2 clip (the reference code; the paper says 1.0)")
    kl_threshold: float = doc(20.0, "|k1| above this skips the rest of the iteration")
    split: str = doc("train", "the suite split tasks are drawn from")
    max_difficulty: int | None = doc(None, "keep only tasks up to this difficulty (paper: 2)")
    max_concurrent_rollouts: int = doc(8, "rollouts in flight at once")
    rollouts_fraction: float = doc(0.9, "straggler cut-off: stop once this share is done")
    min_rollouts_per_task: int = doc(4, "... and every task has at least this many")
    reward: Literal["fraction", "success", "acted"] = doc(
        "fraction",
        "fraction of tests passed | all passed | acted: the collateral test counts only once "
        "the agent changed the state or passed another test (loop/algo/credit.py)",
    )
    ratio_level: Literal["token", "turn", "trajectory"] = doc("token", "importance-weight level")
    clip_lower: Literal["reciprocal", "symmetric"] = doc("reciprocal", "[1/(1+eps), 1+eps], 1-eps")
    micro_batch_size: int = doc(1, "rollouts per forward pass (gradient accumulation in between)")
    weight_decay: float = doc(0.01, "AdamW weight decay")

    # The advantage's and the draw's variants (off by default: the paper).
    return_threshold: float = doc(1.0, "advantage filter: the return a rollout must reach (EI: 1)")
    normalize_advantage: bool = doc(False, 'loo only: divide by the group std ("LOOP RwNorm")')
    turn_coef: float = doc(1.0, "advantage turn: weight of the turn-level advantage (MT-GRPO)")
    strictly_on_policy: bool = doc(False, "one epoch, one minibatch of everything (RLOO / GRPO)")
    no_signal_draw_prob: float = doc(
        1.0, "a task whose last group had no signal (one reward for all) is drawn with this chance"
    )
    stratify: Literal["scenario"] | None = doc(
        None, "scenario: each iteration's tasks spread evenly over the scenarios (None: uniform)"
    )

    # The run: memory, guards, checkpoints, logs.
    shared_prefix_min: int = doc(
        64,
        "the tokens every rollout of a step starts with (the system prompt) run through the model"
        " once for the step, when at least this many (0: every sequence whole); the same gradients,"
        " fewer tokens. Not with gradient checkpointing, several learners or a critic (prefix.py)",
    )
    max_nan_steps: int = doc(20, "abort the run after this many skipped non-finite steps")
    max_seq_len: int = doc(32_000, "longer rollouts are truncated for learning (and counted)")
    logprob_chunk_size: int = doc(1024, "positions per LM-head chunk in the log-prob computation")
    max_infra_failure_share: float | None = doc(0.5, "abort if more of an iteration's fail")
    stress_test: bool = doc(True, "forward+backward of a max_seq_len rollout before iteration 0")
    eval_every: int = doc(5, "evaluate on eval.split before every n-th iteration (0: never)")
    checkpoint_every: int = doc(1, "save every n iterations (and after the last)")
    keep_checkpoints: int = doc(3, "keep the last n checkpoints")
    keep_every: int = doc(0, "also keep every k-th iteration's checkpoint (0: only the last n)")
    save_rollouts: bool = doc(True, "write every rollout to rollouts/iter-N.jsonl.gz")
    tensorboard: bool = doc(True, "write TensorBoard events to <run_dir>/tb/")
    wandb_project: str | None = doc(None, "log to Weights & Biases too (needs wandb installed)")
    deterministic: bool = doc(False, "torch deterministic algorithms (+ MKL_CBWR=AUTO,STRICT)")
    collective_timeout_s: float = doc(
        3600.0,
        "several learner processes: a collective of the learners (an all-reduce, a checkpoint"
        " gather) that waits longer fails the run ([C]: init_process_group's 3,600 s; torch: 600)",
    )
    rollout_wait_timeout_s: float = doc(
        6 * 3600.0,
        "several learner processes: how long ranks 1.. wait for rank 0 to evaluate and collect an"
        " iteration's rollouts (a separate gloo group: this wait does not loosen the one above)",
    )

    # The extensions, each off by default (the paper).
    off_policy: OffPolicyConfig = doc_factory(
        OffPolicyConfig, "the ratio's old log-probs and the sampler-mismatch correction"
    )
    kl: KLConfig = doc_factory(KLConfig, "a KL penalty to a reference policy")
    replay: ReplayConfig = doc_factory(ReplayConfig, "the warm start's demonstrations replayed")
    overlap: OverlapConfig = doc_factory(OverlapConfig, "collecting ahead while learning")
    horizon: HorizonConfig = doc_factory(HorizonConfig, "a turn limit that grows (ScalingInter-RL)")
    preference: PreferenceConfig = doc_factory(PreferenceConfig, "DMPO's and DPO-MCTS's settings")


@dataclass
class CriticConfig:
    """The value head of `train.advantage: gae | verlog` (loop/learner/critic.py; [P] App. C,
    Verlog)."""

    hidden_sizes: list[int] = doc_factory(list, "MLP widths; []: 3/5, 2/5 of hidden")
    lr: float | None = doc(None, "AdamW of the head (None: train.lr)")
    clip_eps: float | None = doc(0.2, "value clipping around the old value (None: unclipped)")
    value_range: list[float] = doc_factory(list, "clamp V to [lo, hi] ([P]: 0, 1)")
    coef: float = doc(0.1, "value loss coefficient at iteration 0 ([P]: 0.1)")
    coef_final: float = doc(0.001, "... decayed linearly to this ([P]: 0.001)")
    coef_decay_iterations: int = doc(200, "... over this many iterations ([P]: 200)")
    grad_to_body: bool = doc(False, "let the value loss reach the LoRA weights ([P]: no)")
    warmup_iterations: int = doc(0, "first iterations with the actor frozen ([P]: 10)")
    first_token_weight: float = doc(1.0, "value-loss weight of a turn's first token (Verlog: > 1)")
    max_grad_norm: float = doc(1.0, "global L2 clip of the head's gradient")
    gamma: float = doc(1.0, "gae: discount ([P]: 1; 0.95-0.999 diverged)")
    lam: float = doc(1.0, "gae: lambda ([P]: 1, so A = R - V)")
    gamma_token: float = doc(1.0, "verlog: discount between tokens of a turn (paper 000: 1)")
    lambda_token: float = doc(1.0, "verlog: lambda between tokens of a turn (paper 000: 1)")
    gamma_step: float = doc(0.99, "verlog: discount across turns (paper 000: 0.99)")
    lambda_step: float = doc(0.95, "verlog: lambda across turns (paper 000: 0.95)")
    whiten_advantages: bool = doc(
        False, "zero mean, unit variance over the batch before the loss (Verlog's code, verl)"
    )


@dataclass
class WarmStartConfig:
    """Supervised fine-tuning before RL (loop/warmstart.py; the paper's SFT-GT and RFT)."""

    source: Literal["none", "gold", "rollouts", "rft"] = doc(
        "none",
        "none | gold (the suite's gold solutions played as agent episodes) | rollouts "
        "(successful rollouts from `rollouts`, replayed) | rft (rejection sampling over a "
        "temperature ladder)",
    )
    split: str = doc("train", "tasks of the gold demonstrations and of RFT (a+b: both splits)")
    max_difficulty: int | None = doc(None, "keep only tasks up to this difficulty")
    limit: int | None = doc(None, "the first N of those tasks only (None: all)")
    style: Literal["episode", "paper", "careful", "lookup"] = doc(
        "episode",
        'gold: episode (a thought and a cell per turn) | paper ("Execution successful." '
        "observations) | careful (the API's documentation read before its first call, in half "
        "the tasks after a failed wrong call, not trained on) | lookup (careful, each app's "
        "APIs listed before the chosen one's documentation: loop/demos.py)",
    )
    read_fraction: float = doc(1.0, "careful, lookup: the share of demonstrations that read first")
    rollouts: list[str] = doc_factory(list, "run dirs, eval dirs or rollouts files")
    min_reward: float = doc(1.0, "rollouts and rft: keep rollouts whose reward reaches this")
    epochs: int = doc(3, "passes over the demonstrations")
    lr: float = doc(1e-3, "AdamW, constant")
    minibatch_size: int = doc(8, "demonstrations per optimizer step")
    select: Literal["last", "dev"] = doc("last", "dev: evaluate after each epoch, keep the best")
    rft_temperatures: list[float] = doc_factory(
        lambda: [round(0.05 * i, 2) for i in range(1, 21)],
        "rft: the temperature ladder (the paper's: 0.05 to 1.0 in steps of 0.05)",
    )
    rft_passes: int = doc(1, "passes over the ladder for tasks still unsolved (paper: until 8 h)")
    cache: bool = doc(True, "reuse an adapter trained on the same data with the same settings")


@dataclass
class SuiteOptions:
    """A suite's own section, named after the suite (`openenv:`): what the suite of that name
    is built with (loop/build.py `suite_options`); other suites never see it."""


@dataclass
class OpenEnvConfig(SuiteOptions):
    """suite openenv: an OpenEnv environment server (tasks/openenv/)."""

    url: str | None = doc(None, "the server, e.g. http://127.0.0.1:8000 (ws:// works too)")
    env_name: str | None = doc(None, "its environment (None: the only one it lists)")
    train_seeds: list[int] = doc_factory(list, "split train resets with these (none: its tasks)")
    eval_seeds: list[int] = doc_factory(list, "... and split dev with these")
    code_field: str = doc("code", "the action field that carries the agent's cell")
    observation_field: str = doc("text", "the observation field the agent sees (else all of it)")
    submit_field: str | None = doc("submit", "the action field that ends an episode, if it has one")
    success_reward: float = doc(1.0, "success = reward >= this (a server's claim never overrides)")
    max_text_chars: int = doc(100_000, "a reset text or observation is cut past this (noted)")
    connect_timeout_s: float = doc(30.0, "opening a session, at most")
    message_timeout_s: float = doc(300.0, "one reset or step, at most (a cell's time included)")
    max_message_mb: float = doc(16.0, "the largest message taken from the server")
    token_env: str = doc("LOOP_OPENENV_TOKEN", "the variable whose value, if set, is the bearer")


@dataclass
class RunConfig:
    """One run: what to train or evaluate, with what, where results go."""

    name: str = doc("run", "the run's name: results go to <output_dir>/<name>/")
    output_dir: str = doc("runs", "results go to <output_dir>/<name>/")
    suite: str = doc("apptown", "the task suite (tasks/registry.py): apptown, appworld or openenv")
    seed: int = doc(0, "the seed every other seed derives from (loop/seeds.py)")
    model: ModelConfig = doc_factory(ModelConfig, "the policy LLM")
    generator: GeneratorConfig = doc_factory(GeneratorConfig, "which backend samples the rollouts")
    sandbox: SandboxConfig = doc_factory(SandboxConfig, "the REPL sandboxes the agent's code uses")
    agent: AgentConfig = doc_factory(AgentConfig, "the ReAct episode")
    eval: EvalConfig = doc_factory(EvalConfig, "evaluate.py and the trainer's periodic evaluation")
    train: TrainConfig = doc_factory(TrainConfig, "the LOOP iteration")
    critic: CriticConfig = doc_factory(
        CriticConfig, "the value head of train.advantage gae | verlog"
    )
    warm_start: WarmStartConfig = doc_factory(WarmStartConfig, "supervised fine-tuning before RL")
    openenv: OpenEnvConfig = doc_factory(OpenEnvConfig, "suite openenv: the server and its wire")

    @property
    def run_dir(self) -> Path:
        """Where this run writes (derived in one place)."""
        return Path(self.output_dir) / self.name

    def to_dict(self) -> dict[str, Any]:
        """Plain data, for writing the resolved config next to the results."""
        return dataclasses.asdict(self)
