"""The learned critic of the PPO baselines: a value head on the one policy model, and its GAE step.

The LOOP paper's "PPO (learned critic)" row ([P] App. C) and Verlog (paper 000) train a value
function next to the policy. Here it is a small MLP on the policy's last hidden state (no second
LLM: one model copy, as for every method of this trainer):

- `ValueHead`: H -> w1 -> w2 -> 1 with ReLU, the paper's 3-layer head (5120 -> 3072 -> 2048 -> 1
  on Qwen2.5-32B, i.e. widths 3/5 and 2/5 of the hidden size, the default here). It reads the
  hidden state through `detach()` unless `critic.grad_to_body` is set: [P] found value
  gradients in the LoRA weights destabilising. Its last layer starts at zero (V = 0 until it
  learns), so the first advantages are the plain returns rather than noise.
- Values come from the same forward pass as the log-probs (loop/learner/logprobs.py
  `values_from_hidden`), chunked like them, so the head adds no vocabulary-sized tensor.
- `Critic`: the head, its own AdamW (the policy's optimizer and its sharded state stay as they
  are) and the value-loss settings; the learner calls it. The head and its optimizer are saved
  in the trainer state of every checkpoint and restored on resume.
- `value_coef`: the value loss coefficient decays linearly from `coef` to `coef_final` over
  `coef_decay_iterations` ([P]: 0.1 -> 0.001 over 200 iterations).
- `first_token_weights`: Verlog weighs the first token of each turn more in the value loss
  (App. B.3.2: its value bootstraps the previous turn).
- `assign_gae`: after the learner's no-grad pass has set each sample's old values, per-token
  advantages and value targets by GAE (`advantage: gae`, [P]'s gamma = lambda = 1) or Verlog's
  dual-discount GAE (`advantage: verlog`), with the rollout's reward on its last output token.
  Every rollout is scored at the end of its episode (the unit tests run even at the turn
  limit), so no bootstrap value is needed here: the pure functions take one for truncated
  rollouts, which Verlog's fixed-turn batching would produce (not built).
- `value_range`: [P] clipped the value predictions to [0, 1], the reward's range.
- Critic warm-up ([P]: 10 iterations; Verlog App. B.3.3): for the first `warmup_iterations`
  iterations the actor is frozen and only the value head learns, on each iteration's rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from loop.algo.gae import GAE, compute_dual_discount_gae, compute_gae, kl_reward, whiten
from loop.config_types import CRITIC_ADVANTAGES, RunConfig
from loop.learner.batch import Sample
from loop.model.policy import Policy

PAPER_WIDTH_FRACTIONS = (3 / 5, 2 / 5)  # [P]'s head on a 5120-wide model: 3072, 2048


class ValueHead(nn.Module):
    """A 3-layer ReLU MLP from a hidden state to a scalar value: (N, H) -> (N,)."""

    def __init__(self, hidden_size: int, widths: Sequence[int]):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, widths[0]),
            nn.ReLU(),
            nn.Linear(widths[0], widths[1]),
            nn.ReLU(),
            nn.Linear(widths[1], 1),
        )
        last = self.net[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        """hidden: (N, H) in any float dtype -> (N,) float32 values."""
        first = self.net[0]
        assert isinstance(first, nn.Linear)
        return self.net(hidden.to(first.weight.dtype)).squeeze(-1)


def head_widths(hidden_size: int, widths: Sequence[int]) -> tuple[int, int]:
    """The configured widths, or [P]'s proportions of the model's hidden size when empty."""
    if widths:  # two widths >= 1 (loop/checks.py)
        return int(widths[0]), int(widths[1])
    return tuple(max(1, round(hidden_size * f)) for f in PAPER_WIDTH_FRACTIONS)  # type: ignore[return-value]


def value_coef(iteration: int, *, coef: float, coef_final: float, decay_iterations: int) -> float:
    """Linear decay from `coef` at iteration 0 to `coef_final` at `decay_iterations`, then flat."""
    if decay_iterations <= 0:
        return coef_final
    progress = min(max(iteration, 0) / decay_iterations, 1.0)
    return coef + (coef_final - coef) * progress


def first_token_weights(turn_ids: Tensor, mask: Tensor, weight: float) -> Tensor:
    """Value-loss weights: `weight` at the first output token of each turn, 1 at the others.

    turn_ids: (B, T) int64 (-1 off the mask).   mask: (B, T) bool.   Returns (B, T) float32,
    0 off the mask. A turn's output tokens are contiguous, so its first one is where the turn
    id differs from the previous position's.
    """
    previous = torch.cat([torch.full_like(turn_ids[:, :1], -1), turn_ids[:, :-1]], dim=1)
    first = mask & (turn_ids != previous)
    weights = torch.where(first, weight, 1.0).to(torch.float32)
    return torch.where(mask, weights, 0.0)


class Critic:
    """The value head, its optimizer and the value-loss settings the learner uses."""

    def __init__(
        self,
        head: ValueHead,
        *,
        lr: float,
        clip_eps: float | None = 0.2,
        coef: float = 0.1,
        coef_final: float = 0.001,
        coef_decay_iterations: int = 200,
        grad_to_body: bool = False,
        first_token_weight: float = 1.0,
        max_grad_norm: float = 1.0,
        warmup_iterations: int = 0,
        value_range: tuple[float, float] | None = None,
    ):
        self.head = head
        self.optimizer = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
        self.clip_eps, self.grad_to_body = clip_eps, grad_to_body
        self.coef, self.coef_final, self.coef_decay_iterations = (
            coef,
            coef_final,
            coef_decay_iterations,
        )
        self.first_token_weight, self.max_grad_norm = first_token_weight, max_grad_norm
        self.warmup_iterations = warmup_iterations
        self.value_range = value_range

    def clamp(self, values: Tensor) -> Tensor:
        """Predictions clamped to `value_range` ([P]: [0, 1], the range of the reward)."""
        if self.value_range is None:
            return values
        return values.clamp(self.value_range[0], self.value_range[1])

    def coef_at(self, iteration: int) -> float:
        """The value loss coefficient of `iteration`."""
        return value_coef(
            iteration, coef=self.coef, coef_final=self.coef_final,
            decay_iterations=self.coef_decay_iterations,
        )  # fmt: skip

    def actor_frozen(self, iteration: int) -> bool:
        """True during the critic warm-up: only the value head learns."""
        return iteration < self.warmup_iterations

    def state_dict(self) -> dict[str, Any]:
        """The head's weights and its optimizer (saved with the learner's state)."""
        return {"head": self.head.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned."""
        self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])


def build_critic(config: RunConfig, policy: Policy) -> Critic | None:
    """The run's critic (a value head on `policy`), or None when the advantage needs none."""
    cfg, train = config.critic, config.train
    if train.advantage not in CRITIC_ADVANTAGES:
        return None
    hidden = int(policy.model.config.hidden_size)
    head = ValueHead(hidden, head_widths(hidden, cfg.hidden_sizes)).to(policy.device)
    return Critic(
        head, lr=cfg.lr if cfg.lr is not None else train.lr, clip_eps=cfg.clip_eps,
        coef=cfg.coef, coef_final=cfg.coef_final, coef_decay_iterations=cfg.coef_decay_iterations,
        grad_to_body=cfg.grad_to_body, first_token_weight=cfg.first_token_weight,
        max_grad_norm=cfg.max_grad_norm, warmup_iterations=cfg.warmup_iterations,
        value_range=(cfg.value_range[0], cfg.value_range[1]) if cfg.value_range else None,
    )  # fmt: skip


class CriticAdvantages(NamedTuple):
    """What `assign_gae` reports besides the samples' own advantages and targets."""

    metrics: dict[str, float]  # critic/*
    turn_means: dict[int, dict[int, float]]  # rollout (Sample.source) -> turn -> mean advantage


def assign_gae(samples: Sequence[Sample], config: RunConfig) -> CriticAdvantages:
    """Per-token advantages and value targets of `samples` from their old values (in place).

    samples: loop.learner.batch.Sample with `old_values` set (the learner's no-grad pass) and
    `reward`.
    The recursion runs over a whole episode: the samples of one rollout (one, or one per turn
    with a memory window, ordered by turn) are joined on their output tokens, the reward sits
    on the episode's last one. Returns the `critic/*` metrics and each rollout's per-turn mean
    advantage (for the rollouts file and the report: `Credit.with_turn_advantages`); nothing
    for the other advantages.
    """
    if config.train.advantage not in CRITIC_ADVANTAGES or not samples:
        return CriticAdvantages({}, {})
    episodes: dict[Any, list[Any]] = {}
    for index, sample in enumerate(samples):
        if sample.old_values is None:
            raise ValueError("assign_gae needs old values: run the learner's recompute first")
        key = sample.source if sample.source >= 0 else ("alone", index)
        episodes.setdefault(key, []).append(sample)
    done = []
    for episode in episodes.values():
        episode.sort(key=lambda s: s.turn)
        done.append((episode, *_episode_gae(episode, config)))
    raw = torch.cat([out.advantages[0] for _, out, _, _ in done])
    final = raw  # [V]: the whole batch's advantages whitened before the loss
    if config.critic.whiten_advantages and raw.numel() >= 2:
        final = whiten(raw, torch.ones(raw.shape, dtype=torch.bool))
    offset = 0
    for episode, out, _, _ in done:
        start = 0
        for sample in episode:  # split the episode's output tokens back into its samples
            n = int(sample.is_output.sum())
            adv = torch.zeros(len(sample.tokens), dtype=torch.float32)
            ret = torch.zeros(len(sample.tokens), dtype=torch.float32)
            adv[sample.is_output] = final[offset + start : offset + start + n].float()
            ret[sample.is_output] = out.returns[0, start : start + n].float()  # from raw GAE
            sample.advantages, sample.returns = adv, ret
            start += n
        offset += start
    metrics = _gae_metrics(
        raw, torch.cat([old[0] for _, _, old, _ in done]),
        torch.cat([out.returns[0] for _, out, _, _ in done]),
    )  # fmt: skip
    penalties = [kl[0] for _, _, _, kl in done if kl is not None]
    if penalties:
        metrics["critic/kl_reward_mean"] = float(torch.cat(penalties).mean())
    return CriticAdvantages(metrics, _turn_means(samples))


def _turn_means(samples: Sequence[Sample]) -> dict[int, dict[int, float]]:
    """Rollout -> turn -> the mean advantage of the turn's output tokens."""
    means: dict[int, dict[int, float]] = {}
    for sample in samples:
        if sample.source < 0 or sample.advantages is None:
            continue
        for turn in sample.turn_ids[sample.is_output].unique().tolist():
            tokens = sample.advantages[(sample.turn_ids == turn) & sample.is_output]
            means.setdefault(sample.source, {})[int(turn)] = float(tokens.mean())
    return means


def _episode_gae(episode: list[Sample], config: RunConfig) -> tuple[GAE, Tensor, Tensor | None]:
    """GAE over the output tokens of one episode's samples: (1, N) GAE, (1, N) old values and,
    with `train.kl.into: reward`, the (1, N) KL rewards added to the outcome (else None)."""
    cfg = config.critic
    values = [s.old_values for s in episode]
    assert all(v is not None for v in values), "assign_gae checked the old values"
    old = torch.cat([v[s.is_output] for v, s in zip(values, episode, strict=True) if v is not None])
    old = old.double()[None]
    turn_ids = torch.cat([s.turn_ids[s.is_output] for s in episode])[None]
    mask = torch.ones(old.shape, dtype=torch.bool)
    rewards = torch.zeros(old.shape, dtype=torch.float64)
    if old.shape[1]:
        rewards[0, -1] = episode[-1].reward  # the outcome, on the episode's last sampled token
    penalty = None
    if config.train.kl.into == "reward" and config.train.kl.coef > 0:
        penalty = kl_reward(
            _output_tokens(episode, "old_logprobs"), _output_tokens(episode, "ref_logprobs"),
            mask, config.train.kl.coef,
        )  # fmt: skip
        rewards = rewards + penalty
    if config.train.advantage == "gae":
        return compute_gae(rewards, old, mask, gamma=cfg.gamma, lam=cfg.lam), old, penalty
    out = compute_dual_discount_gae(
        rewards, old, mask, turn_ids, gamma_token=cfg.gamma_token, lambda_token=cfg.lambda_token,
        gamma_step=cfg.gamma_step, lambda_step=cfg.lambda_step,
    )  # fmt: skip
    return out, old, penalty


def _output_tokens(episode: list[Sample], field: str) -> Tensor:
    """(1, N): a per-token field of the episode's samples on their output tokens, in order."""
    parts = []
    for sample in episode:
        values = getattr(sample, field)
        if values is None:
            raise ValueError(f"train.kl.into reward needs {field}: run the learner's recompute")
        parts.append(values[sample.is_output])
    return torch.cat(parts).double()[None]


def _gae_metrics(adv: Tensor, val: Tensor, ret: Tensor) -> dict[str, float]:
    if not len(adv):
        return {}
    residual = (ret - val).var(unbiased=False)
    explained = 1 - float(residual / ret.var(unbiased=False).clamp(min=1e-12))
    return {
        "critic/value_mean": float(val.mean()),
        "critic/return_mean": float(ret.mean()),
        "critic/advantage_mean": float(adv.mean()),
        "critic/advantage_abs_mean": float(adv.abs().mean()),
        "critic/explained_variance": explained if len(ret) > 1 else 0.0,
    }
