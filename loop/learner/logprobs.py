"""Per-token log-probabilities of a sequence under a causal LM, without full-vocabulary logits.

`token_logprobs` is what the learner uses for the PPO ratio (old and new log-probs) and for the
sampler/learner parity check. It runs the transformer body once, then applies the LM head,
log-softmax and gather over chunks of `chunk_size` positions, so at most
`chunk_size x vocab` logits exist at a time instead of `B x T x vocab`. Under autograd each
chunk is recomputed in the backward pass (non-reentrant activation checkpointing), so the
saved activations are the (B, T, H) hidden states, not the logits. This is the role Cut
Cross-Entropy plays in the reference implementation (loop_spec.md section 7.4).

Conventions (shared with `token_logprobs_naive`, the slow reference kept for tests):
- `out[b, t] = log p(input_ids[b, t] | input_ids[b, :t])` for t >= 1; `out[:, 0] = 0.0`
  (the first token has no context). Callers mask with `is_output`, which is never True there.
- Padded positions (attention_mask == 0) get finite values that mean nothing; mask them.
- Position ids follow the attention mask (`cumsum - 1`), so left padding does not shift
  the positions of real tokens: a left-padded row gives the same values as the row alone.
- `temperature` divides the logits (after any final soft-capping the model applies), as the
  sampler does; the loss of the paper uses temperature 1.0.
- Values are float32 whatever the model dtype (logits are upcast before the softmax).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from loop.model.aliases import causal_lm


def token_logprobs(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    chunk_size: int = 1024,
    temperature: float = 1.0,
) -> Tensor:
    """Log-prob of each token given its prefix, computed chunk by chunk.

    model: a transformers causal LM, or a peft model wrapping one (LoRA layers live inside
        the body, so calling the body directly applies them).
    input_ids: (B, T) int64.   attention_mask: (B, T) 0/1, or None for no padding.
    Returns (B, T) float32 with column 0 equal to 0.0. Differentiable with respect to the
    model's parameters when grad is enabled.
    """
    _check_inputs(input_ids, attention_mask, chunk_size, temperature)
    hidden = last_hidden_state(model, input_ids, attention_mask)
    return logprobs_from_hidden(
        model, hidden, input_ids, chunk_size=chunk_size, temperature=temperature
    )


def last_hidden_state(model: Any, input_ids: Tensor, attention_mask: Tensor | None) -> Tensor:
    """The transformer body's last hidden state (B, T, H): one forward, no LM head."""
    out = causal_lm(model).base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=_position_ids(attention_mask),
        use_cache=False,
    )
    return out.last_hidden_state


def logprobs_from_hidden(
    model: Any,
    hidden_states: Tensor,
    input_ids: Tensor,
    *,
    chunk_size: int,
    temperature: float,
    positions: Tensor | None = None,
) -> Tensor:
    """`token_logprobs` from the body's hidden states (B, T, H): LM head over chunks.

    positions: (B, T) bool, the tokens whose log-probs are needed (the learner passes the
    output mask); the LM head then runs over those rows only and every other entry is 0.0.
    In a rollout most tokens are prompt and observations, so this skips most of the
    vocabulary-sized matrix products, forward and backward.
    """
    lm = causal_lm(model)
    lm_head = lm.get_output_embeddings()
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    batch, seq_len = input_ids.shape
    if seq_len == 1:  # nothing to predict: only the conventional 0.0 of position 0
        return hidden_states.new_zeros(batch, 1, dtype=torch.float32)
    # hidden[t] predicts token t + 1: (B, T-1, H) -> (B*(T-1), H), targets (B*(T-1),).
    hidden = hidden_states[:, :-1].reshape(batch * (seq_len - 1), -1)
    targets = input_ids[:, 1:].reshape(-1)
    rows = None if positions is None else positions[:, 1:].reshape(-1).nonzero().squeeze(-1)
    if rows is not None:
        hidden, targets = hidden.index_select(0, rows), targets.index_select(0, rows)
    recompute_in_backward = torch.is_grad_enabled() and hidden.requires_grad
    pieces = []
    for start in range(0, hidden.shape[0], chunk_size):
        args = (hidden[start : start + chunk_size], targets[start : start + chunk_size])
        if recompute_in_backward:
            piece = checkpoint(
                _chunk_logprobs, *args, lm_head, softcap, temperature, use_reentrant=False
            )
        else:
            piece = _chunk_logprobs(*args, lm_head, softcap, temperature)
        pieces.append(piece)
    picked = torch.cat(pieces) if pieces else hidden.new_zeros(0, dtype=torch.float32)
    if rows is not None:
        picked = picked.new_zeros(batch * (seq_len - 1)).index_copy(0, rows, picked)
    logprobs = picked.reshape(batch, seq_len - 1)
    first = logprobs.new_zeros(batch, 1)
    return torch.cat([first, logprobs], dim=1)


def values_from_hidden(head: Any, hidden_states: Tensor, *, chunk_size: int) -> Tensor:
    """V(s_t) of every token t, from the value head on the body's hidden states, in chunks.

    head: a module mapping (N, H) -> (N,) (loop.learner.critic.ValueHead).
    hidden_states: (B, T, H); detach it first to keep the value loss out of the body.
    Returns (B, T) float32 aligned like the log-probs: `out[:, t]` is the value of the state in
    which token t was sampled, read from hidden[t - 1] (the position whose logits sampled t);
    `out[:, 0] = 0.0`. Like the log-probs, each chunk is recomputed in the backward pass, so
    the head's (chunk, width) activations exist for one chunk at a time.
    """
    batch, seq_len, _ = hidden_states.shape
    if seq_len == 1:
        return hidden_states.new_zeros(batch, 1, dtype=torch.float32)
    hidden = hidden_states[:, :-1].reshape(batch * (seq_len - 1), -1)
    recompute_in_backward = torch.is_grad_enabled() and (
        hidden.requires_grad or any(p.requires_grad for p in head.parameters())
    )
    pieces = []
    for start in range(0, hidden.shape[0], chunk_size):
        piece = hidden[start : start + chunk_size]
        if recompute_in_backward:
            pieces.append(checkpoint(head, piece, use_reentrant=False))
        else:
            pieces.append(head(piece))
    values = torch.cat(pieces).float().reshape(batch, seq_len - 1)
    return torch.cat([values.new_zeros(batch, 1), values], dim=1)


def token_logprobs_naive(
    model: Any,
    input_ids: Tensor,
    attention_mask: Tensor | None = None,
    *,
    temperature: float = 1.0,
) -> Tensor:
    """The slow reference: full (B, T, V) logits, log-softmax, gather. Same conventions."""
    _check_inputs(input_ids, attention_mask, 1, temperature)
    if input_ids.shape[1] == 1:
        return torch.zeros(input_ids.shape[0], 1, device=input_ids.device)
    logits = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=_position_ids(attention_mask),
        use_cache=False,
    ).logits
    logprobs = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    picked = logprobs.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    return torch.cat([picked.new_zeros(input_ids.shape[0], 1), picked], dim=1)


def _chunk_logprobs(
    hidden: Tensor, targets: Tensor, lm_head: Any, softcap: float | None, temperature: float
) -> Tensor:
    """hidden: (N, H), targets: (N,) -> (N,) float32 log-probs of the targets."""
    logits = lm_head(hidden).float()  # (N, V): the only vocabulary-sized tensor, one chunk
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    logits = logits / temperature
    return logits.gather(-1, targets[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _position_ids(attention_mask: Tensor | None) -> Tensor | None:
    """(B, T) positions counting only real tokens; padded positions get 0."""
    if attention_mask is None:
        return None
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def _check_inputs(
    input_ids: Tensor, attention_mask: Tensor | None, chunk_size: int, temperature: float
) -> None:
    if input_ids.dim() != 2 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be (B, T) with T >= 1, got {tuple(input_ids.shape)}")
    if attention_mask is not None and attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask {tuple(attention_mask.shape)} != input_ids {tuple(input_ids.shape)}"
        )
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
