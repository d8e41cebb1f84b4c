"""The learner: old log-probs, then epochs of minibatch gradient steps on the one policy model.

`Learner` owns the optimizer and the step guards; the math is in loop/algo/losses.py and
loop/algo/advantages.py, the policy loss the settings choose in loop/learner/objective.py. One
iteration's learning (loop_spec.md section 2, steps 5 to 8):

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

The recompute and every step run the common start of their samples once
(loop/learner/prefix.py, `shared_prefix_min`) where the model allows it; the results are the
whole sequences'.

Optional terms share the forward pass and the step. A `critic` (loop/learner/critic.py): the
value head reads the same last hidden state as the log-probs, the recompute also records the
old values, each step adds `coef * clipped value loss` and steps the head's optimizer; during
the critic warm-up the actor is frozen (no policy loss or step). `kl_coef` > 0 (GRPO's KL to
the reference, LoRA only): the recompute also records the reference log-probs, from the same
model with the LoRA adapter disabled (peft's `disable_adapter()`: no second copy) or, with
`reference_adapter` (`train.kl.reference: start`), under that saved adapter loaded in place of
the current one for one pass and swapped back (`logprobs_with_adapter`); the reference never
changes, so once per iteration is enough, and each step adds `kl_coef * k3`
(loop/algo/losses.py `kl_penalty`).
`demo_coef` > 0 (`replay`): each step adds `demo_coef` x the mean cross-entropy of the next
`demos_per_step` demonstrations of the warm start (own forward passes; `loss/demo`).
`reference_logprobs` (the KL in the reward, Verlog's way): recorded the same way, no KL term
in the loss (loop/learner/critic.py folds k1 into the rewards before GAE). The memory stress
test (`stress_test`, loop/learner/stress.py) runs one step's terms through `loss_backward`.

With several processes each learner gets an equal shard of the rollouts; gradients are averaged
across processes by the sharding wrapper, so the local loss is scaled by the world size to keep
the paper's "sum over the global minibatch / minibatch_size" (see loop/model/distributed.py).
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from loop.algo.losses import (
    ValueLoss,
    clipped_value_loss,
    cross_entropy_loss,
    kl_estimates,
    kl_penalty,
)
from loop.learner.batch import Batch, Sample, collate
from loop.learner.critic import Critic, first_token_weights
from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden, values_from_hidden
from loop.learner.objective import policy_loss
from loop.learner.prefix import SharedPrefix, can_share, shared_length
from loop.learner.settings import LearnerSettings
from loop.learner.stats import LearnStats, Losses, importance_stats, parity_stats, record_extras
from loop.learner.stress import stress_rollout
from loop.model import distributed
from loop.model.checkpoint import load_adapter
from loop.model.policy import Policy


class NonFiniteLossError(RuntimeError):
    """Too many non-finite losses: the run stops rather than train on garbage."""


class Learner:
    """Optimizer, schedule and the gradient steps of LOOP over one policy model."""

    def __init__(
        self, policy: Policy, settings: LearnerSettings, *, critic: Critic | None = None
    ) -> None:
        self.policy = policy
        self.model = policy.model
        self.settings = settings
        self.critic = critic
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("the policy has no trainable parameters")
        fused = policy.device.type == "cuda"
        self.optimizer = torch.optim.AdamW(
            self.params, lr=settings.lr, weight_decay=settings.weight_decay, fused=fused or None
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.global_step = 0
        self.nan_steps_total = 0
        self.pad_id = int(policy.tokenizer.pad_token_id or 0)
        self.demonstrations: list[Sample] = []  # replayed with `demo_coef` (see `replay`)

    @property
    def needs_reference(self) -> bool:
        """The recompute records the reference's log-probs (a KL in the loss or the reward)."""
        return self.settings.kl_coef > 0 or self.settings.reference_logprobs

    @property
    def _reference_off(self) -> bool:
        """The reference is the model with its adapter off (not a saved adapter)."""
        return self.needs_reference and self.settings.reference_adapter is None

    # -- 1. old log-probs -------------------------------------------------------------------
    @torch.no_grad()
    def recompute_old_logprobs(self, samples: Sequence[Sample]) -> dict[str, float]:
        """Set every sample's `old_logprobs` from the current weights; return parity stats."""
        was_training = self.model.training
        self.model.eval()
        try:
            prefix = self._shared_prefix(samples)
            reference_prefix = None  # the reference's own keys: the same sums as the policy's
            if prefix is not None and self._reference_off:
                with self.model.disable_adapter():
                    reference_prefix = self._shared_prefix(samples)
            for chunk in _chunks(list(samples), self.settings.micro_batch_size):
                batch = self._collate(chunk)
                hidden = self._hidden(batch, prefix)
                logprobs = self._logprobs(batch, hidden).float().cpu()
                values = self._values(hidden).cpu() if self.critic is not None else None
                reference = (
                    self._reference_logprobs(batch, reference_prefix)
                    if self._reference_off
                    else None
                )
                for row, sample in enumerate(chunk):
                    n = len(sample.tokens)
                    sample.old_logprobs = logprobs[row, :n].clone()
                    if values is not None:
                        sample.old_values = values[row, :n].clone()
                    if reference is not None:
                        sample.ref_logprobs = reference[row, :n].clone()
        finally:
            self.model.train(was_training)
        if self.needs_reference and self.settings.reference_adapter is not None:
            found = self.logprobs_with_adapter(self.settings.reference_adapter, samples)
            for sample, logprobs in zip(samples, found, strict=True):
                sample.ref_logprobs = logprobs
        return parity_stats(samples)

    @torch.no_grad()
    def logprobs_with_adapter(self, adapter: Path, samples: Sequence[Sample]) -> list[Tensor]:
        """Each sample's log-probs under the LoRA adapter in `adapter` (a published version:
        the weights a stale group sampled, pi_v), the current weights put back bit for bit
        afterwards. One learner process (the adapter is loaded whole)."""
        if distributed.is_distributed():
            raise RuntimeError("log-probs under an older adapter need one learner process")
        saved = {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}
        was_training = self.model.training
        self.model.eval()
        try:
            load_adapter(self.model, adapter)
            prefix = self._shared_prefix(samples)
            found: list[Tensor] = []
            for chunk in _chunks(list(samples), self.settings.micro_batch_size):
                batch = self._collate(chunk)
                logprobs = self._logprobs(batch, self._hidden(batch, prefix)).float().cpu()
                found += [
                    logprobs[row, : len(sample.tokens)].clone() for row, sample in enumerate(chunk)
                ]
            return found
        finally:
            for name, param in self.model.named_parameters():
                if name in saved:
                    param.copy_(saved[name])
            self.model.train(was_training)

    # -- 2./3. epochs of minibatch steps ------------------------------------------------------
    def learn(
        self,
        samples: Sequence[Sample],
        *,
        seed: int,
        iteration: int = 0,
        minibatch_size: int | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> LearnStats:
        """`epochs` shuffled passes of minibatch steps over `samples` (old log-probs set).

        `minibatch_size` (global, in rollouts) replaces the learner's for this call (strictly
        on-policy mode: one minibatch of everything); `on_step` is called after every step.
        """
        size = self.settings.minibatch_size if minibatch_size is None else minibatch_size
        stats = LearnStats()
        if self.critic is not None:
            stats.value_coef = self.critic.coef_at(iteration)
            stats.actor_frozen = self.critic.actor_frozen(iteration)
        if self.settings.loss == "ppo" and any(s.old_logprobs is None for s in samples):
            raise ValueError("learn() needs old log-probs: call recompute_old_logprobs first")
        if all(s.old_logprobs is not None for s in samples):  # not demonstrations
            stats.importance = importance_stats(samples, self.settings)  # every process's
        self.model.train()
        rng = random.Random(seed)
        order = list(range(len(samples)))
        minibatch = self.local_minibatch_size(size)
        for _epoch in range(self.settings.epochs):
            rng.shuffle(order)
            for start in range(0, len(order), minibatch):
                chunk = [samples[i] for i in order[start : start + minibatch]]
                stepped = self._step(chunk, stats, size)
                if on_step is not None:
                    on_step()
                if not stepped:
                    stats.stopped_early = True
                    self.step_schedule()
                    return stats
        self.step_schedule()
        return stats

    def replay(self, demonstrations: Sequence[Sample], *, seed: int) -> None:
        """Set the demonstrations that each step's `demo_coef` term replays, in a seeded order;
        step g takes the `demos_per_step` after step g - 1's (cycling), so a resumed run picks
        up where it stopped (`global_step` is checkpointed) and each process takes its share."""
        order = list(range(len(demonstrations)))
        random.Random(seed).shuffle(order)
        self.demonstrations = [demonstrations[i] for i in order]

    def local_minibatch_size(self, minibatch_size: int | None = None) -> int:
        """This process's share of a minibatch (the rollouts are sharded equally)."""
        size = self.settings.minibatch_size if minibatch_size is None else minibatch_size
        return size // distributed.world_size()  # a multiple: loop/checks.py refuses others

    def step_schedule(self) -> None:
        """The once-per-iteration schedule step (also when no optimizer step was taken)."""
        with warnings.catch_warnings():  # torch warns when no optimizer step came first
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step")
            self.scheduler.step()

    def _step(self, minibatch: list[Sample], stats: LearnStats, minibatch_size: int) -> bool:
        """One optimizer step over `minibatch`; False when a guard stops the iteration (the
        summed losses are divided by the global `minibatch_size`)."""
        self._zero_grad()
        scale = distributed.world_size() / minibatch_size
        loss_sum, clipped, units, tokens, log_ratio_sums = 0.0, 0.0, 0, 0, []
        demos = [] if stats.actor_frozen else self._step_demos()
        prefix = self._shared_prefix([*minibatch, *demos])
        for chunk in _chunks(minibatch, self.settings.micro_batch_size):
            batch = self._collate(chunk)
            value_coef = stats.value_coef or 0.0
            losses = self._losses(
                batch, frozen=stats.actor_frozen, value_coef=value_coef, prefix=prefix
            )
            (losses.total.sum() * scale).backward()
            if not math.isfinite(float(losses.total.detach().sum())):
                loss_sum = math.nan
            if losses.policy is not None:
                out = losses.policy
                loss_sum += float(out.loss.detach().sum())
                clipped += float(out.clipped.detach().sum())
                log_ratio_sums.append(out.log_ratio_sum.detach().float().cpu())
            record_extras(losses, stats)
            units += len(chunk)
            tokens += int(batch.is_output.sum())
        demo = self._demo_term(demos, prefix) if demos else None
        if prefix is not None:
            prefix.backward()
        # Totals over every process, so metrics and guards see the global minibatch.
        loss_sum, clipped, total_units, total_tokens, demo_sum = distributed.all_sum(
            [loss_sum, clipped, units, tokens, demo or 0.0]
        )
        units = int(total_units)
        stats.trained_tokens += int(total_tokens)
        if not (math.isfinite(loss_sum) and math.isfinite(demo_sum)):
            return self._skip_non_finite(stats)
        if demo is not None:
            stats.demo_losses.append(demo_sum / self.settings.demos_per_step)
        frozen = stats.actor_frozen  # critic warm-up: no policy loss, the head alone learns
        grad_norm = 0.0
        if not frozen:
            kl = kl_estimates(distributed.all_gather_cat(torch.cat(log_ratio_sums)))
            stats.kl_k1.append(float(kl.k1))
            stats.kl_k3.append(float(kl.k3))
            if abs(float(kl.k1)) > self.settings.kl_threshold:
                self._zero_grad()
                stats.skipped_high_kl += 1
                return False
            norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.max_grad_norm)
            grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
            if not math.isfinite(grad_norm):  # a finite loss can still give inf/NaN gradients:
                return self._skip_non_finite(stats)  # AdamW would write NaN into the weights
        if self.critic is not None:
            torch.nn.utils.clip_grad_norm_(self.critic.head.parameters(), self.critic.max_grad_norm)
            self.critic.optimizer.step()
        self.global_step += 1
        stats.optimizer_steps += 1
        if frozen:
            return True
        self.optimizer.step()
        stats.losses.append(loss_sum / max(units, 1))
        stats.clip_fractions.append(clipped / max(units, 1))
        stats.grad_norms.append(grad_norm)
        return True

    def _step_demos(self) -> list[Sample]:
        """This process's share of the step's `demos_per_step` demonstrations (none when replay
        is off: no demonstrations, or `demo_coef` 0)."""
        s, demos = self.settings, self.demonstrations
        if not demos or s.demo_coef <= 0:
            return []
        world, rank = distributed.world_size(), distributed.rank()
        share = s.demos_per_step // world
        first = self.global_step * s.demos_per_step + rank * share
        return [demos[(first + i) % len(demos)] for i in range(share)]

    def _demo_term(self, picked: list[Sample], prefix: SharedPrefix | None) -> float:
        """Backpropagate `demo_coef` x the mean cross-entropy of the step's demonstrations
        `picked` (`_step_demos`); returns their summed losses."""
        s, world, total = self.settings, distributed.world_size(), 0.0
        for chunk in _chunks(picked, s.micro_batch_size):
            batch = self._collate(chunk)
            hidden = self._hidden(batch, prefix)
            nll = cross_entropy_loss(self._logprobs(batch, hidden), batch.is_output)
            # averaged over the processes by the sharding wrapper: world / demos_per_step
            (nll.loss.sum() * (s.demo_coef * world / s.demos_per_step)).backward()
            total += float(nll.loss.detach().sum())
        return total

    def _skip_non_finite(self, stats: LearnStats) -> bool:
        """Drop this step's gradients and count it; abort past `max_nan_steps` in the run."""
        self._zero_grad()
        stats.skipped_nan += 1
        self.nan_steps_total += 1
        if self.nan_steps_total > self.settings.max_nan_steps:
            raise NonFiniteLossError(
                f"{self.nan_steps_total} non-finite losses or gradient norms (train.max_nan_steps="
                f"{self.settings.max_nan_steps}): check the learning rate and the log-prob parity"
            )
        return False

    def _losses(
        self, batch: Batch, *, frozen: bool, value_coef: float, prefix: SharedPrefix | None = None
    ) -> Losses:
        """Policy loss, plus the value loss and the KL to the reference when they are on.

        frozen: the actor is frozen (the critic's warm-up: no policy loss); value_coef: the
        value loss's weight this iteration (both from the critic's schedule, read by `learn`).
        """
        if frozen:  # no gradient reaches the body: run it without building a graph
            with torch.no_grad():
                hidden = self._hidden(batch)
        else:
            hidden = self._hidden(batch, prefix)
        policy, value, kl_ref = None, None, None
        total = torch.zeros(batch.input_ids.shape[0], device=batch.input_ids.device)
        if not frozen:
            logprobs = self._logprobs(batch, hidden)
            policy = policy_loss(batch, logprobs, self.settings)
            total = total + policy.loss
            if self.settings.kl_coef > 0:
                if batch.ref_logprobs is None:
                    raise ValueError("kl_coef > 0 needs reference log-probs: run the recompute")
                kl_ref = kl_penalty(logprobs, batch.ref_logprobs, batch.is_output)
                total = total + self.settings.kl_coef * kl_ref
        if self.critic is not None:
            value = self._value_loss(batch, hidden)
            total = total + value_coef * value.loss
        return Losses(total, policy, value, kl_ref)

    def _value_loss(self, batch: Batch, hidden: Tensor) -> ValueLoss:
        assert self.critic is not None
        if batch.old_values is None or batch.returns is None:
            raise ValueError("the value loss needs old values and returns: run assign_gae")
        weights = first_token_weights(
            batch.turn_ids, batch.is_output, self.critic.first_token_weight
        )
        return clipped_value_loss(
            self._values(hidden), batch.old_values, batch.returns, batch.is_output,
            clip_eps=self.critic.clip_eps, weights=weights,
        )  # fmt: skip

    # -- the memory stress test (loop/learner/stress.py) ---------------------------------------
    def stress_test(self, seq_len: int) -> float:
        """Forward and backward one synthetic rollout of `seq_len` tokens (`stress_rollout`)
        through `loss_backward`; returns the loss."""
        values, reference = self.critic is not None, self.needs_reference
        sample = stress_rollout(seq_len, self.policy.tokenizer, values=values, reference=reference)
        return self.loss_backward(sample)

    def loss_backward(self, sample: Sample) -> float:
        """Forward and backward `sample` alone with every term on (the value loss at its first
        coefficient, even during the critic's warm-up): the step's peak memory. The optimizer is
        not stepped and the gradients are cleared; returns the loss."""
        self.model.train()
        self._zero_grad()
        try:
            value_coef = self.critic.coef_at(0) if self.critic is not None else 0.0
            batch = self._collate([sample])
            out = self._losses(batch, frozen=False, value_coef=value_coef)  # every term: the peak
            out.total.sum().backward()
            return float(out.total.detach().sum())
        finally:
            self._zero_grad()

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Optimizer, schedule and step counters (the weights are saved separately).

        Collective with several processes: every rank calls it; rank 0 gets the full state.
        """
        state = {
            "optimizer": distributed.optimizer_state_dict(self.model, self.optimizer),
            "scheduler": self.scheduler.state_dict(),
            "global_step": self.global_step,
            "nan_steps_total": self.nan_steps_total,
        }
        if self.critic is not None:
            state["critic"] = self.critic.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        distributed.load_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.global_step = int(state["global_step"])
        self.nan_steps_total = int(state["nan_steps_total"])
        if self.critic is not None:
            if "critic" not in state:
                raise ValueError("the checkpoint has no value head: it was not a critic run")
            self.critic.load_state_dict(state["critic"])

    # -- helpers -------------------------------------------------------------------------------
    def _collate(self, samples: Sequence[Sample]) -> Batch:
        return collate(samples, self.pad_id, self.policy.device)

    def _hidden(self, batch: Batch, prefix: SharedPrefix | None = None) -> Tensor:
        if prefix is not None:
            return prefix.hidden(self.model, batch.input_ids, batch.attention_mask)
        return last_hidden_state(self.model, batch.input_ids, batch.attention_mask)

    def _shared_prefix(self, samples: Sequence[Sample]) -> SharedPrefix | None:
        """The samples' common start run once (loop/learner/prefix.py), when it is on
        (`shared_prefix_min` tokens or more, two samples or more) and the model allows it."""
        least = self.settings.shared_prefix_min
        if (
            not least
            or len(samples) < 2
            or self.critic is not None
            or distributed.is_distributed()
            or not can_share(self.model)
        ):
            return None
        length = shared_length(samples)
        if length < least:
            return None
        return SharedPrefix.build(self.model, samples[0].tokens[:length].to(self.policy.device))

    def _logprobs(self, batch: Batch, hidden: Tensor) -> Tensor:
        return logprobs_from_hidden(
            self.model, hidden, batch.input_ids, chunk_size=self.settings.logprob_chunk_size,
            temperature=self.settings.temperature, positions=batch.is_output,
        )  # fmt: skip

    def _values(self, hidden: Tensor) -> Tensor:
        assert self.critic is not None
        source = hidden if self.critic.grad_to_body else hidden.detach()
        values = values_from_hidden(
            self.critic.head, source, chunk_size=self.settings.logprob_chunk_size
        )
        return self.critic.clamp(values)

    def _reference_logprobs(self, batch: Batch, prefix: SharedPrefix | None) -> Tensor:
        """Log-probs of the base model: the same model with its LoRA adapter disabled (`prefix`
        built so too)."""
        disabled: AbstractContextManager[Any] = self.model.disable_adapter()
        with disabled:
            return self._logprobs(batch, self._hidden(batch, prefix)).float().cpu()

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic is not None:
            self.critic.optimizer.zero_grad(set_to_none=True)


def _chunks(items: list[Sample], size: int) -> list[list[Sample]]:
    return [items[i : i + size] for i in range(0, len(items), size)]
