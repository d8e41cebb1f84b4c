"""`loop/learner/prefix.py`: a step's common start run once gives the log-probs and the
gradients of running every sequence whole, and the learner uses it only where it is exact.

Run: python -m pytest tests/loop/test_shared_prefix.py -q
"""

from __future__ import annotations

import copy

import pytest
import torch

from loop.learner.batch import Sample, collate
from loop.learner.learner import Learner
from loop.learner.logprobs import last_hidden_state, logprobs_from_hidden
from loop.learner.prefix import SharedPrefix, shared_length
from loop.learner.settings import LearnerSettings
from loop.model.policy import LoraSettings, Policy, load_policy
from tests.loop.conftest import TINY_VOCAB

# float32 sums of the same terms in another order: the largest gap measured was 1.2e-5 of a
# parameter's largest gradient (2 AMD EPYC cores); other CPUs' kernels sum in other orders, so
# the bound leaves room. A missing path (a layer's keys or values not sent back) is off by O(1).
GRAD_NOISE = 1e-4


def sample(tokens: list[int], first_output: int, advantage: float = 1.0) -> Sample:
    n = len(tokens)
    is_output = torch.arange(n) >= first_output
    return Sample(
        tokens=torch.tensor(tokens),
        is_output=is_output,
        sampler_logprobs=torch.full((n,), float("nan")),
        turn_ids=torch.where(is_output, 0, -1),
        advantages=torch.where(is_output, advantage, 0.0),
    )


def samples_with_a_common_start(count: int, start: int, seed: int = 0) -> list[Sample]:
    """`count` samples: the same `start` ids, then a few prompt ids and outputs of their own."""
    rng = torch.Generator().manual_seed(seed)
    common = torch.randint(3, TINY_VOCAB, (start,), generator=rng).tolist()
    made = []
    for i in range(count):
        own = torch.randint(3, TINY_VOCAB, (5 + 3 * i,), generator=rng).tolist()
        made.append(sample(common + own, first_output=start + 2, advantage=1.0 - i / count))
    return made


@pytest.fixture
def lora_policy(tiny_model_dir) -> Policy:
    policy = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8))
    with torch.no_grad():  # a live adapter, so the prefix's keys depend on it
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.05)
    return policy


def test_shared_length_stops_before_the_first_trained_token_and_the_first_difference():
    a = sample([5, 6, 7, 8, 9, 10], first_output=4)
    b = sample([5, 6, 7, 8, 11], first_output=3)
    assert shared_length([a, b]) == 2  # b's first trained token (3) comes from position 2
    c = sample([5, 6, 12, 8, 9, 10], first_output=5)
    assert shared_length([a, c]) == 2  # they differ at position 2
    assert shared_length([a, a]) == 3  # a's own first trained token (4) minus one
    assert shared_length([sample([5, 6], 1), sample([5, 6], 1)]) == 0


def test_hidden_states_and_gradients_equal_the_whole_sequences(lora_policy: Policy) -> None:
    model = lora_policy.model.train()
    samples = samples_with_a_common_start(3, start=12)
    length = shared_length(samples)
    assert length == 12  # the own ids start at 12

    def trained_logprobs(prefix: SharedPrefix | None) -> list[torch.Tensor]:
        found = []
        for one in samples:
            batch = collate([one], 0, torch.device("cpu"))
            hidden = (
                prefix.hidden(model, batch.input_ids, batch.attention_mask)
                if prefix
                else last_hidden_state(model, batch.input_ids, batch.attention_mask)
            )
            logprobs = logprobs_from_hidden(
                model, hidden, batch.input_ids, chunk_size=8, temperature=1.0,
                positions=batch.is_output,
            )  # fmt: skip
            (logprobs[batch.is_output] * (1 + len(found))).sum().neg().backward()
            found.append(logprobs[batch.is_output].detach())
        return found

    params = [p for p in model.parameters() if p.requires_grad]
    whole = trained_logprobs(None)
    whole_grads = [p.grad.clone() for p in params]
    model.zero_grad()
    prefix = SharedPrefix.build(model, samples[0].tokens[:length])
    shared = trained_logprobs(prefix)
    prefix.backward()
    for a, b in zip(whole, shared, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    for a, b in zip(whole_grads, [p.grad for p in params], strict=True):
        assert (a - b).abs().max() <= GRAD_NOISE * a.abs().max() and a.abs().max() > 0


def _learner(policy: Policy, shared_prefix_min: int, micro_batch_size: int = 1) -> Learner:
    settings = LearnerSettings(
        lr=1e-3, weight_decay=0.0, epochs=1, minibatch_size=4,
        micro_batch_size=micro_batch_size, shared_prefix_min=shared_prefix_min,
    )  # fmt: skip
    return Learner(policy, settings)


@pytest.mark.parametrize("micro_batch_size", [1, 2])  # 2: right-padded rows over one prefix
def test_a_learner_step_is_the_same_with_and_without_the_shared_prefix(
    lora_policy, micro_batch_size: int
) -> None:
    runs = {}
    for least in (0, 8):
        policy = copy.deepcopy(lora_policy)
        learner = _learner(policy, least, micro_batch_size)
        built = []
        original = SharedPrefix.build

        def counting(model, ids, original=original, built=built):
            built.append(len(ids))
            return original(model, ids)

        samples = samples_with_a_common_start(4, start=12, seed=1)
        SharedPrefix.build = staticmethod(counting)  # type: ignore[method-assign]
        try:
            parity = learner.recompute_old_logprobs(samples)
            stats = learner.learn(samples, seed=0)
        finally:
            SharedPrefix.build = original  # type: ignore[method-assign]
        runs[least] = (policy, [s.old_logprobs for s in samples], stats, built, parity)
    (off, old_off, stats_off, built_off, _), (on, old_on, stats_on, built_on, _) = (
        runs[0], runs[8],
    )  # fmt: skip
    assert built_off == [] and built_on == [12, 12]  # the recompute's, then the step's
    for a, b in zip(old_off, old_on, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert stats_off.optimizer_steps == stats_on.optimizer_steps == 1
    torch.testing.assert_close(stats_off.grad_norms, stats_on.grad_norms, atol=1e-6, rtol=1e-4)
    # the step's gradients (left in .grad): compared, not the weights after AdamW, whose first
    # update is about lr x sign(g) and so flips on rounding noise where a gradient is near 0
    compared = 0
    for (name, a), (_, b) in zip(
        off.model.named_parameters(), on.model.named_parameters(), strict=True
    ):
        if a.grad is not None:
            assert (a.grad - b.grad).abs().max() <= GRAD_NOISE * a.grad.abs().max(), name
            compared += 1
    assert compared > 0


def test_not_used_with_gradient_checkpointing_or_too_short(tiny_model_dir) -> None:
    policy = load_policy(
        str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), gradient_checkpointing=True
    )
    samples = samples_with_a_common_start(2, start=12)
    assert _learner(policy, 8)._shared_prefix(samples) is None  # the cache would be dropped
    plain = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8))
    assert _learner(plain, 8)._shared_prefix(samples) is not None
    assert _learner(plain, 14)._shared_prefix(samples) is None  # 12 shared ids < 14
    assert _learner(plain, 8)._shared_prefix(samples[:1]) is None  # nothing to share with
