"""The learner's settings, built once from a run's config: RL's and the warm start's alike.

The fields and their sources are documented where the user sets them (loop/config_types.py,
`TrainConfig` and `WarmStartConfig`); the defaults here are the paper's, for a learner built
by hand (a test, a benchmark). `LearnerSettings.for_rl` and `.for_warm_start` are the two
ways a run builds them, side by side so they cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from loop.config import RunConfig


@dataclass(frozen=True)
class LearnerSettings:
    """How the learner optimises (validated once, by loop/checks.py, when read from a config)."""

    lr: float
    weight_decay: float
    loss: Literal["ppo", "reinforce", "cross_entropy", "dpo"] = "ppo"
    ratio_level: Literal["token", "turn", "trajectory"] = "token"
    clip_eps: float = 0.1  # [P] section 4.2 / [C]: the ratio band [1/1.1, 1.1]
    clip_lower: Literal["reciprocal", "symmetric"] = "reciprocal"  # [C]'s lower bound 1/(1+eps)
    epochs: int = 2  # [P] App. B
    minibatch_size: int = 32  # rollouts per optimizer step ([P] App. B)
    micro_batch_size: int = 1  # rollouts per forward pass (gradient accumulation)
    max_grad_norm: float = 0.1  # [C] (the paper says 1.0)
    kl_threshold: float = 20.0  # [C]: |k1| above it skips the rest of the iteration
    max_nan_steps: int = 20  # non-finite steps skipped before the run aborts
    temperature: float = 1.0  # the sampler's: log-probs of logits / temperature
    logprob_chunk_size: int = 1024  # positions per LM-head chunk
    kl_coef: float = 0.0  # GRPO's k3 KL to the reference in the loss (LoRA only)
    reference_logprobs: bool = False  # record log pi_ref in the recompute (a KL in the reward)
    reference_adapter: Path | None = None  # pi_ref: this LoRA adapter (None: the adapter off)
    is_correction: Literal["none", "truncate", "mask"] = "none"  # w = 1: the paper's loss
    is_cap: float = 2.0  # truncate: verl's and SkyRL's token TIS cap C
    is_band: tuple[float, float] = (0.5, 2.0)  # mask: IcePop's band
    demo_coef: float = 0.0  # lambda of the demonstrations' cross-entropy in each step (0: off)
    demos_per_step: int = 2  # demonstrations in that term, global
    shared_prefix_min: int = 64  # a step's common start run once when this long (0: never)
    dpo_beta: float = 0.1  # loss dpo: beta of the DMPO / DPO loss
    dmpo_gamma: float = 0.9  # loss dpo: DMPO's discount in its turn weights

    @classmethod
    def for_rl(cls, config: RunConfig) -> LearnerSettings:
        """LOOP's learner: the `train` section, at the sampler's temperature."""
        cfg = config.train
        return cls(
            lr=cfg.lr, weight_decay=cfg.weight_decay, loss=cfg.loss, ratio_level=cfg.ratio_level,
            clip_eps=cfg.clip_eps, clip_lower=cfg.clip_lower, epochs=cfg.epochs,
            minibatch_size=cfg.minibatch_size, micro_batch_size=cfg.micro_batch_size,
            max_grad_norm=cfg.max_grad_norm, kl_threshold=cfg.kl_threshold,
            max_nan_steps=cfg.max_nan_steps, temperature=config.agent.temperature,
            logprob_chunk_size=cfg.logprob_chunk_size,
            kl_coef=cfg.kl.coef if cfg.kl.into == "loss" else 0.0,
            reference_logprobs=cfg.kl.into == "reward" and cfg.kl.coef > 0,
            is_correction=cfg.off_policy.correction, is_cap=cfg.off_policy.cap,
            is_band=(cfg.off_policy.band[0], cfg.off_policy.band[1]), demo_coef=cfg.replay.coef,
            demos_per_step=cfg.replay.demos_per_step, shared_prefix_min=cfg.shared_prefix_min,
            dpo_beta=cfg.preference.beta, dmpo_gamma=cfg.preference.gamma,
        )  # fmt: skip

    @classmethod
    def for_warm_start(cls, config: RunConfig) -> LearnerSettings:
        """The warm start's: cross-entropy on demonstrations with the `warm_start` section's
        rate and minibatch, one epoch a call (the caller loops), the rest as in RL."""
        warm, rl = config.warm_start, cls.for_rl(config)
        return cls(
            lr=warm.lr, weight_decay=rl.weight_decay, loss="cross_entropy", epochs=1,
            minibatch_size=warm.minibatch_size,
            micro_batch_size=min(rl.micro_batch_size, warm.minibatch_size),
            max_grad_norm=rl.max_grad_norm, temperature=1.0,
            logprob_chunk_size=rl.logprob_chunk_size, shared_prefix_min=rl.shared_prefix_min,
        )  # fmt: skip
