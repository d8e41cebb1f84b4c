"""The learner: old log-probs, then epochs of minibatch gradient steps on the one policy model.

`Learner` owns the optimizer and the step guards; the math is in loop/losses.py and
loop/advantages.py. One iteration's learning (loop_spec.md section 2, steps 5 to 8):

1. `recompute_old_logprobs`: a no-grad pass in eval mode gives the learner's log-probs of every
   output token; they overwrite the sampler's as the PPO "old" log-probs, and their difference
   from the sampler's is returned as parity statistics (`recompute/*`).
2. `learn`: `epochs` passes over the samples in a seeded shuffled order, `minibatch_size`
   rollouts per optimizer step, `micro_batch_size` rollouts per forward pass. Each micro-batch's
   per-rollout losses are summed and divided by `minibatch_size` (a fixed divisor, as in the
   reference code, even for a short last minibatch) before `backward`, so gradients accumulate.
3. Guards per step: a non-finite loss, or a non-finite gradient norm after a finite loss,
   skips the step and the rest of the iteration (the run aborts after `max_nan_steps` of them);
   after the backward pass, the k1 KL estimate over the minibatch's rollouts (across processes)
   above `kl_threshold` skips the step and the rest of the iteration (with `loss: reinforce`
   too: the old log-probs are passed for it); the global gradient norm is clipped to
   `max_grad_norm`.
4. The learning-rate schedule (constant) steps once per iteration.

With several processes each learner gets an equal shard of the rollouts; gradients are averaged
across processes by the sharding wrapper, so the local loss is scaled by the world size to keep
the paper's "sum over the global minibatch / minibatch_size" (see loop/distributed.py).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import Tensor

from loop import distributed
from loop.batch import Batch, Sample, collate
from loop.logprobs import token_logprobs
from loop.losses import (
    clipped_surrogate_loss,
    cross_entropy_loss,
    kl_estimates,
    reinforce_loss,
)
from loop.policy import Policy


class NonFiniteLossError(RuntimeError):
    """Too many non-finite losses: the run stops rather than train on garbage."""


@dataclass
class LearnStats:
    """What one iteration of learning did (summed or averaged over its steps)."""

    optimizer_steps: int = 0
    skipped_nan: int = 0
    skipped_high_kl: int = 0
    stopped_early: bool = False
    losses: list[float] = field(default_factory=list)
    clip_fractions: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    kl_k1: list[float] = field(default_factory=list)
    kl_k3: list[float] = field(default_factory=list)
    trained_tokens: int = 0

    def metrics(self) -> dict[str, float]:
        """Namespaced scalars for the run log."""

        def avg(values: list[float]) -> float:
            return sum(values) / len(values) if values else math.nan

        return {
            "learn/optimizer_steps": self.optimizer_steps,
            "learn/skipped_nan_steps": self.skipped_nan,
            "learn/skipped_high_kl": self.skipped_high_kl,
            "learn/stopped_early": float(self.stopped_early),
            "loss/policy": avg(self.losses),
            "loss/clipfrac": avg(self.clip_fractions),
            "loss/grad_norm": avg(self.grad_norms),
            "loss/grad_norm_max": max(self.grad_norms, default=math.nan),
            "loss/kl_k1": avg(self.kl_k1),
            "loss/kl_k3": avg(self.kl_k3),
            "learn/trained_tokens": self.trained_tokens,
        }


class Learner:
    """Optimizer, schedule and the gradient steps of LOOP over one policy model."""

    def __init__(
        self,
        policy: Policy,
        *,
        lr: float,
        weight_decay: float,
        loss: Literal["ppo", "reinforce", "cross_entropy"] = "ppo",
        ratio_level: Literal["token", "turn", "trajectory"] = "token",
        clip_eps: float = 0.1,
        clip_lower: Literal["reciprocal", "symmetric"] = "reciprocal",
        epochs: int = 2,
        minibatch_size: int = 32,
        micro_batch_size: int = 1,
        max_grad_norm: float = 0.1,
        kl_threshold: float = 20.0,
        max_nan_steps: int = 20,
        temperature: float = 1.0,
        logprob_chunk_size: int = 1024,
    ):
        self.policy = policy
        self.model = policy.model
        self.loss, self.ratio_level = loss, ratio_level
        self.clip_eps, self.clip_lower = clip_eps, clip_lower
        self.epochs, self.minibatch_size = epochs, minibatch_size
        self.micro_batch_size = micro_batch_size
        self.max_grad_norm, self.kl_threshold = max_grad_norm, kl_threshold
        self.max_nan_steps, self.temperature = max_nan_steps, temperature
        self.chunk_size = logprob_chunk_size
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters")
        fused = policy.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            self.params, lr=lr, weight_decay=weight_decay, fused=fused or None
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.global_step = 0
        self.nan_steps_total = 0
        self.pad_id = int(policy.tokenizer.pad_token_id or 0)
        self.on_step: Callable[[], None] | None = None  # called after every step (progress)

    # -- 1. old log-probs -------------------------------------------------------------------
    @torch.no_grad()
    def recompute_old_logprobs(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Set every sample's `old_logprobs` from the current weights; return parity stats."""
        was_training = self.model.training
        self.model.eval()
        try:
            for chunk in _chunks(list(samples), self.micro_batch_size):
                batch = self._collate(chunk)
                logprobs = self._logprobs(batch).float().cpu()
                for row, sample in enumerate(chunk):
                    sample.old_logprobs = logprobs[row, : len(sample.tokens)].clone()
        finally:
            self.model.train(was_training)
        return parity_stats(samples)

    # -- 2./3. epochs of minibatch steps ------------------------------------------------------
    def learn(self, samples: Sequence[Sample], *, seed: int) -> LearnStats:
        """`epochs` shuffled passes of minibatch steps over `samples` (old log-probs set)."""
        stats = LearnStats()
        if self.loss == "ppo" and any(s.old_logprobs is None for s in samples):
            raise ValueError("learn() needs old log-probs: call recompute_old_logprobs first")
        self.model.train()
        rng = random.Random(seed)
        order = list(range(len(samples)))
        minibatch = self.local_minibatch_size()
        for _epoch in range(self.epochs):
            rng.shuffle(order)
            for start in range(0, len(order), minibatch):
                chunk = [samples[i] for i in order[start : start + minibatch]]
                stepped = self._step(chunk, stats)
                if self.on_step is not None:
                    self.on_step()
                if not stepped:
                    stats.stopped_early = True
                    self.step_schedule()
                    return stats
        self.step_schedule()
        return stats

    def local_minibatch_size(self) -> int:
        """This process's share of a minibatch (the rollouts are sharded equally)."""
        world = distributed.world_size()
        if self.minibatch_size % world:
            raise ValueError(
                f"train.minibatch_size={self.minibatch_size} must be a multiple of the "
                f"{world} learner processes"
            )
        return self.minibatch_size // world

    def step_schedule(self) -> None:
        """The once-per-iteration schedule step (also when no optimizer step was taken)."""
        with warnings.catch_warnings():  # torch warns when no optimizer step came first
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()

    def _step(self, minibatch: list[Sample], stats: LearnStats) -> bool:
        """One optimizer step over `minibatch`; False when a guard stops the iteration."""
        self.optimizer.zero_grad(set_to_none=True)
        scale = distributed.world_size() / self.minibatch_size
        loss_sum, clipped, units, tokens, log_ratio_sums = 0.0, 0.0, 0, 0, []
        for chunk in _chunks(minibatch, self.micro_batch_size):
            batch = self._collate(chunk)
            out = self._policy_loss(batch)
            (out.loss.sum() * scale).backward()
            loss_sum += float(out.loss.detach().sum())
            clipped += float(out.clipped.detach().sum())
            units += len(chunk)
            log_ratio_sums.append(out.log_ratio_sum.detach().float().cpu())
            tokens += int(batch.is_output.sum())
        # Totals over every process, so metrics and guards see the global minibatch.
        loss_sum, clipped, total_units, total_tokens = distributed.all_sum(
            [loss_sum, clipped, units, tokens]
        )
        units = int(total_units)
        stats.trained_tokens += int(total_tokens)
        if not math.isfinite(loss_sum):
            return self._skip_non_finite(stats)
        kl = kl_estimates(distributed.all_gather_cat(torch.cat(log_ratio_sums)))
        stats.kl_k1.append(float(kl.k1))
        stats.kl_k3.append(float(kl.k3))
        if abs(float(kl.k1)) > self.kl_threshold:
            self.optimizer.zero_grad(set_to_none=True)
            stats.skipped_high_kl += 1
            return False
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
        grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not math.isfinite(grad_norm):  # a finite loss can still give inf/NaN gradients:
            return self._skip_non_finite(stats)  # AdamW would write NaN into the weights
        self.optimizer.step()
        self.global_step += 1
        stats.optimizer_steps += 1
        stats.losses.append(loss_sum / max(units, 1))
        stats.clip_fractions.append(clipped / max(units, 1))
        stats.grad_norms.append(grad_norm)
        return True

    def _skip_non_finite(self, stats: LearnStats) -> bool:
        """Drop this step's gradients and count it; abort past `max_nan_steps` in the run."""
        self.optimizer.zero_grad(set_to_none=True)
        stats.skipped_nan += 1
        self.nan_steps_total += 1
        if self.nan_steps_total > self.max_nan_steps:
            raise NonFiniteLossError(
                f"{self.nan_steps_total} non-finite losses or gradient norms (train.max_nan_steps="
                f"{self.max_nan_steps}): check the learning rate and the log-prob parity"
            )
        return False

    def _policy_loss(self, batch: Batch) -> Any:
        logprobs = self._logprobs(batch)
        mask = batch.is_output
        if self.loss == "cross_entropy":
            return cross_entropy_loss(logprobs, mask, old_logprobs=batch.old_logprobs)
        if self.loss == "reinforce":
            if self.ratio_level == "turn":
                raise ValueError("the REINFORCE loss has no per-turn form: use token or trajectory")
            return reinforce_loss(  # old log-probs only feed k1/k3 and the high-KL stop
                logprobs, batch.advantages, mask, level=self.ratio_level,
                old_logprobs=batch.old_logprobs,
            )  # fmt: skip
        assert batch.old_logprobs is not None
        return clipped_surrogate_loss(
            logprobs, batch.old_logprobs, batch.advantages, mask,
            clip_eps=self.clip_eps, lower=self.clip_lower, level=self.ratio_level,
            turn_ids=batch.turn_ids,
        )  # fmt: skip

    # -- the memory stress test ----------------------------------------------------------------
    def stress_test(self, seq_len: int) -> float:
        """Forward and backward one synthetic rollout of `seq_len` tokens; returns the loss.

        Run before the first iteration so a configuration that cannot fit fails in seconds.
        The sequence is a repeated ordinary token with its last 90% marked as output (as the
        reference code does); the optimizer is not stepped and gradients are cleared.
        """
        tokens = torch.full((seq_len,), self._filler_token(), dtype=torch.long)
        is_output = torch.zeros(seq_len, dtype=torch.bool)
        is_output[seq_len // 10 :] = True
        advantages = torch.where(is_output, 1.0, 0.0)
        sample = Sample(
            tokens, is_output, torch.full((seq_len,), math.nan), torch.where(is_output, 0, -1),
            advantages, old_logprobs=torch.zeros(seq_len),
        )  # fmt: skip
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        try:
            out = self._policy_loss(self._collate([sample]))
            out.loss.sum().backward()
            return float(out.loss.detach().sum())
        finally:
            self.optimizer.zero_grad(set_to_none=True)

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule and step counters (the weights are saved separately).

        Collective with several processes: every rank calls it; rank 0 gets the full state.
        """
        return {
            "optimizer": distributed.optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "global_step": self.global_step,
            "nan_steps_total": self.nan_steps_total,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        distributed.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = int(state["global_step"])
        self.nan_steps_total = int(state["nan_steps_total"])

    # -- helpers -------------------------------------------------------------------------------
    def _collate(self, samples: Sequence[Sample]) -> Batch:
        return collate(samples, self.pad_id, self.policy.device)

    def _logprobs(self, batch: Batch) -> Tensor:
        return token_logprobs(
            self.model, batch.input_ids, batch.attention_mask,
            chunk_size=self.chunk_size, temperature=self.temperature,
        )  # fmt: skip

    def _filler_token(self) -> int:
        ids = self.policy.tokenizer(" the", add_special_tokens=False)["input_ids"]
        return int(ids[0]) if ids else 0


def parity_stats(samples: Sequence[Sample]) -> dict[str, float]:
    """How far the learner's old log-probs are from the sampler's, over output tokens.

    Only tokens with a finite sampler log-prob count. Returns `recompute/*` metrics: mean and
    max |delta log p|; mean, max, p95 and p99 of |delta p|; min and max of p_learner/p_sampler.
    """
    learner, sampler = [], []
    for sample in samples:
        assert sample.old_logprobs is not None
        known = sample.is_output & torch.isfinite(sample.sampler_logprobs)
        learner.append(sample.old_logprobs[known].double())
        sampler.append(sample.sampler_logprobs[known].double())
    if not learner or sum(len(x) for x in learner) == 0:
        return {"recompute/tokens": 0.0}
    new, old = torch.cat(learner), torch.cat(sampler)
    dlogp = (new - old).abs()
    dp = (new.exp() - old.exp()).abs()
    ratio = (new - old).exp()
    return {
        "recompute/tokens": float(len(new)),
        "recompute/abs_logprob_diff_mean": float(dlogp.mean()),
        "recompute/abs_logprob_diff_max": float(dlogp.max()),
        "recompute/abs_prob_diff_mean": float(dp.mean()),
        "recompute/abs_prob_diff_max": float(dp.max()),
        "recompute/abs_prob_diff_p95": float(torch.quantile(dp, 0.95)),
        "recompute/abs_prob_diff_p99": float(torch.quantile(dp, 0.99)),
        "recompute/ratio_min": float(ratio.min()),
        "recompute/ratio_max": float(ratio.max()),
    }


def _chunks(items: list[Sample], size: int) -> list[list[Sample]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
