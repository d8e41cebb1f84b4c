"""The value head and its learner step (loop/learner/critic.py), and the KL to the adapter-disabled
reference: shapes, schedules and weights by hand, GAE on a sample by hand, the warm-up freezing
the actor, no value gradient in the body by default, save and restore, and reference log-probs
equal to the base model's.

Run: python -m pytest tests/loop/test_critic.py -q
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from loop.checks import check_run
from loop.config import ConfigError, load_config
from loop.learner.batch import Sample
from loop.learner.critic import (
    Critic,
    ValueHead,
    assign_gae,
    first_token_weights,
    head_widths,
    value_coef,
)
from loop.learner.learner import Learner
from loop.learner.logprobs import token_logprobs, values_from_hidden
from loop.learner.settings import LearnerSettings
from loop.model.policy import Policy
from tests.loop.conftest import tiny_llama
from tests.loop.synthetic import code_word_tokenizer, synthetic_policy

T, F = True, False


def test_head_widths_follow_the_paper_and_start_at_zero() -> None:
    assert head_widths(5120, []) == (3072, 2048)  # [P]: 5120 -> 3072 -> 2048 -> 1
    assert head_widths(64, [8, 4]) == (8, 4)
    head = ValueHead(64, (38, 26))
    assert [m.out_features for m in head.net if isinstance(m, torch.nn.Linear)] == [38, 26, 1]
    assert torch.equal(head(torch.randn(5, 64)), torch.zeros(5))  # last layer zero: V = 0


def test_value_coef_decays_linearly_then_stays() -> None:
    # [P]: 0.1 -> 0.001 over 200 iterations: at 100, 0.1 + (0.001 - 0.1) / 2 = 0.0505
    coefs = [value_coef(i, coef=0.1, coef_final=0.001, decay_iterations=200)
             for i in (0, 100, 200, 300)]  # fmt: skip
    assert coefs == pytest.approx([0.1, 0.0505, 0.001, 0.001])


def test_first_token_weights_by_hand() -> None:
    # prompt, turn 0 (2 tokens), observation, turn 1 (2 tokens), padding
    turn_ids = torch.tensor([[-1, 0, 0, -1, 1, 1, -1]])
    mask = turn_ids >= 0
    assert first_token_weights(turn_ids, mask, 5.0).tolist() == [[0, 5, 1, 0, 5, 1, 0]]


def test_values_are_aligned_with_the_log_probs_and_chunking_changes_nothing() -> None:
    torch.manual_seed(0)
    head = ValueHead(8, (6, 4))
    torch.nn.init.normal_(head.net[-1].weight)  # type: ignore[arg-type]
    hidden = torch.randn(2, 5, 8)
    values = values_from_hidden(head, hidden, chunk_size=3)
    assert values.shape == (2, 5) and bool((values[:, 0] == 0).all())
    # V of the state token t is sampled in: the head on hidden[t - 1]
    torch.testing.assert_close(values[1, 3], head(hidden[1, 2:3])[0])
    torch.testing.assert_close(values, values_from_hidden(head, hidden, chunk_size=100))


def _two_turn_sample(reward: float) -> Sample:
    # prompt p | turn 0: a0 a1 | observation o | turn 1: b0 b1
    is_output = torch.tensor([F, T, T, F, T, T])
    turn_ids = torch.tensor([-1, 0, 0, -1, 1, 1])
    sample = Sample(
        torch.arange(3, 9), is_output, torch.zeros(6), turn_ids, torch.zeros(6), reward=reward
    )
    sample.old_values = torch.tensor([9.0, 0.2, 0.4, 9.0, 0.5, 0.6])
    return sample


def test_assign_gae_by_hand() -> None:
    # verlog with gamma_step 0.9, lambda_step 0.5 (tests/loop/test_gae.py has the derivation):
    # A = [0.475, 0.275 | 0.5, 0.4], targets A + V = [0.675, 0.675 | 1, 1]
    config = load_config(None, ["train.advantage=verlog", "critic.gamma_step=0.9",
                                "critic.lambda_step=0.5"])  # fmt: skip
    sample = _two_turn_sample(1.0)
    metrics = assign_gae([sample], config).metrics
    torch.testing.assert_close(sample.advantages, torch.tensor([0, 0.475, 0.275, 0, 0.5, 0.4]))
    assert sample.returns is not None
    torch.testing.assert_close(sample.returns, torch.tensor([0, 0.675, 0.675, 0, 1.0, 1.0]))
    assert metrics["critic/value_mean"] == pytest.approx((0.2 + 0.4 + 0.5 + 0.6) / 4)
    # gae with gamma = lambda = 1 ([P]): A = R - V
    sample = _two_turn_sample(1.0)
    assign_gae([sample], load_config(None, ["train.advantage=gae"]))
    torch.testing.assert_close(sample.advantages, torch.tensor([0, 0.8, 0.6, 0, 0.5, 0.4]))


def _critic_learner(policy: Policy, **critic_args) -> Learner:
    head = ValueHead(64, (16, 8))
    critic = Critic(head, lr=1e-2, **critic_args)
    return Learner(
        policy, LearnerSettings(lr=1e-2, weight_decay=0.0, minibatch_size=2), critic=critic
    )


def _ready_samples(learner: Learner) -> list[Sample]:
    config = load_config(None, ["train.advantage=gae"])
    samples = [_two_turn_sample(1.0), _two_turn_sample(0.0)]
    learner.recompute_old_logprobs(samples)
    assign_gae(samples, config)
    return samples


def test_warm_up_freezes_the_actor_and_trains_the_head() -> None:
    policy = synthetic_policy()
    learner = _critic_learner(policy, warmup_iterations=1)
    samples = _ready_samples(learner)
    body = {k: v.clone() for k, v in policy.model.state_dict().items()}
    head = {k: v.clone() for k, v in learner.critic.head.state_dict().items()}  # type: ignore[union-attr]
    stats = learner.learn(samples, seed=0, iteration=0)
    assert stats.actor_frozen and stats.optimizer_steps == 2 and stats.value_losses
    assert all(torch.equal(body[k], v) for k, v in policy.model.state_dict().items())
    after = learner.critic.head.state_dict()  # type: ignore[union-attr]
    assert any(not torch.equal(head[k], after[k]) for k in head)
    stats = learner.learn(samples, seed=0, iteration=1)  # after the warm-up: the actor learns
    assert not stats.actor_frozen
    assert any(not torch.equal(body[k], v) for k, v in policy.model.state_dict().items())


@pytest.mark.parametrize("grad_to_body", [False, True])
def test_value_gradient_reaches_the_body_only_when_asked(grad_to_body: bool) -> None:
    policy = synthetic_policy()
    learner = _critic_learner(policy, grad_to_body=grad_to_body)
    samples = _ready_samples(learner)
    torch.nn.init.normal_(learner.critic.head.net[-1].weight)  # type: ignore[union-attr, arg-type]
    batch = learner._collate(samples)
    learner._value_loss(batch, learner._hidden(batch)).loss.sum().backward()
    body_grads = [p.grad for p in policy.model.parameters() if p.grad is not None]
    assert bool(body_grads) == grad_to_body


def test_critic_state_is_saved_and_restored() -> None:
    learner = _critic_learner(synthetic_policy())
    learner.learn(_ready_samples(learner), seed=0)
    state = learner.state_dict()
    fresh = _critic_learner(synthetic_policy())
    fresh.load_state_dict(state)
    for key, value in learner.critic.head.state_dict().items():  # type: ignore[union-attr]
        assert torch.equal(value, fresh.critic.head.state_dict()[key])  # type: ignore[union-attr]
    assert fresh.critic.optimizer.state_dict()["state"]  # type: ignore[union-attr]
    plain = Learner(synthetic_policy(), LearnerSettings(lr=1e-2, weight_decay=0.0)).state_dict()
    with pytest.raises(ValueError, match="no value head"):
        fresh.load_state_dict(plain)


# ------------------------------------------------------------- KL to the reference (GRPO)


def _lora_policy() -> Policy:
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    for name, param in model.named_parameters():  # a trained adapter: B no longer zero
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    tokenizer = code_word_tokenizer()
    return Policy(model=model, tokenizer=tokenizer, device=torch.device("cpu"))


def test_reference_log_probs_are_the_base_models() -> None:
    policy = _lora_policy()
    base = tiny_llama()  # the same seed: the weights under the adapter
    learner = Learner(policy, LearnerSettings(lr=1e-3, weight_decay=0.0, kl_coef=0.1))
    samples = [_two_turn_sample(1.0)]
    learner.recompute_old_logprobs(samples)
    ids = samples[0].tokens[None]
    expected = token_logprobs(base, ids)[0]
    assert samples[0].ref_logprobs is not None and samples[0].old_logprobs is not None
    output = samples[0].is_output  # the learner computes log-probs of the output tokens only
    torch.testing.assert_close(samples[0].ref_logprobs[output], expected[output], rtol=0, atol=1e-5)
    assert (samples[0].old_logprobs - expected)[output].abs().max() > 1e-2  # the adapter is on
    stats = learner.learn(samples, seed=0)
    # At the first step the policy is the adapted model: k3 > 0 since it differs from the base
    assert stats.kl_ref and stats.kl_ref[0] > 0 and math.isfinite(stats.kl_ref[0])
    mean_kl = sum(stats.kl_ref) / len(stats.kl_ref)  # one value per step (2 epochs)
    assert stats.metrics()["loss/kl_ref"] == pytest.approx(mean_kl)


def test_kl_to_the_reference_is_refused_with_full_fine_tuning() -> None:
    with pytest.raises(ConfigError, match=r"^train.kl.coef needs a LoRA policy"):
        load_config(None, ["train.kl.coef=0.04", "model.lora_rank=0"])
    with pytest.raises(ConfigError, match=r"critic\.gamma_step"):
        load_config(None, ["critic.gamma_step=1.5"])


def _train_lora_on_words(tmp_path: Path, name: str, keys: list[str]) -> list[dict]:
    """2 iterations of the trainer on the word task with a LoRA r4 policy; metrics records."""
    from peft import LoraConfig, get_peft_model

    from loop.generators.hf.generator import HFGenerator
    from loop.parts import TrainParts
    from loop.trainer import train
    from tests.loop.synthetic import NoSandboxPool, WordSuite
    from tests.loop.test_trainer import SYNTHETIC

    args = [a for a in SYNTHETIC if not a.startswith("model.lora_rank")]
    config = load_config(None, [
        f"output_dir={tmp_path}", f"name={name}", "train.iterations=2", *args,
        "model.lora_rank=4", "train.lr=0.01", *keys,
    ])  # fmt: skip
    policy = synthetic_policy()
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, target_modules="all-linear"))
    parts = TrainParts(policy, HFGenerator(policy, max_batch_size=16), policy.tokenizer,
                       WordSuite(), NoSandboxPool())  # fmt: skip
    train(config, parts, show_progress=False)
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_grpo_with_kl_to_the_reference_trains_a_lora_policy(tmp_path: Path) -> None:
    from tests.loop.test_trainer import rewards

    records = _train_lora_on_words(tmp_path, "kl", [
        "train.advantage=grpo", "train.strictly_on_policy=true", "train.epochs=1",
        "train.kl.coef=0.04",
    ])  # fmt: skip
    assert len(rewards(records)) == 2
    # Iteration 0's one step starts from B = 0: the policy is the reference, k3 = 0 exactly.
    assert records[0]["loss/kl_ref"] == 0.0
    assert records[1]["loss/kl_ref"] > 0.0  # after one step the adapter has moved


def test_the_kl_to_the_starting_policy_is_kept_and_trained_against(tmp_path: Path) -> None:
    from tests.loop.test_trainer import rewards

    records = _train_lora_on_words(tmp_path, "start", [
        "train.advantage=grpo", "train.strictly_on_policy=true", "train.epochs=1",
        "train.kl.coef=0.04", "train.kl.reference=start",
    ])  # fmt: skip
    assert len(rewards(records)) == 2
    assert (tmp_path / "start" / "kl_reference" / "adapter_model.safetensors").is_file()
    assert records[0]["loss/kl_ref"] == 0.0  # the first step starts at the reference
    assert records[1]["loss/kl_ref"] > 0.0


def test_the_starting_reference_is_that_adapter_not_the_base(tmp_path: Path) -> None:
    from peft import LoraConfig, get_peft_model

    from loop.model.checkpoint import save_weights

    policy = synthetic_policy()
    policy.model = get_peft_model(policy.model, LoraConfig(r=4, target_modules="all-linear"))
    with torch.no_grad():  # the starting policy: an adapter that counts
        for name, parameter in policy.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(2))
    save_weights(policy.model, tmp_path / "start")
    settings = LearnerSettings(lr=1e-3, weight_decay=0.0, minibatch_size=1, kl_coef=0.04)
    start, base = (
        Learner(policy, dataclasses.replace(settings, reference_adapter=tmp_path / "start")),
        Learner(policy, settings),
    )
    is_output = torch.arange(10) >= 6
    sample = Sample(
        torch.arange(3, 13), is_output, torch.full((10,), math.nan),
        torch.where(is_output, 0, -1), torch.where(is_output, 1.0, 0.0),
    )  # fmt: skip
    start.recompute_old_logprobs([sample])  # the policy is still the starting one
    assert sample.ref_logprobs is not None and sample.old_logprobs is not None
    assert torch.equal(sample.ref_logprobs, sample.old_logprobs)
    base.recompute_old_logprobs([sample])  # the adapter off: another distribution
    assert sample.ref_logprobs is not None and sample.old_logprobs is not None
    assert not torch.allclose(sample.ref_logprobs, sample.old_logprobs)
    with pytest.raises(ConfigError, match="needs one learner process, got 2"):
        check_run(load_config(None, ["train.kl.coef=0.04", "train.kl.reference=start",
                                     "generator.backend=vllm_server"]), 2)  # fmt: skip


def test_verlogs_kl_in_the_reward_and_whitening_train_a_lora_policy(tmp_path: Path) -> None:
    """The trainer end to end with configs/verlog.yaml's learning keys on the word task: the
    KL goes into the rewards (logged, none in the loss) and the advantages are whitened."""
    from tests.loop.test_trainer import rewards

    records = _train_lora_on_words(tmp_path, "verlog", [
        "train.advantage=verlog", "train.kl.into=reward", "train.kl.coef=0.001",
        "critic.whiten_advantages=true", "critic.clip_eps=0.5", "critic.first_token_weight=3.0",
    ])  # fmt: skip
    assert len(rewards(records)) == 2
    assert records[0]["critic/kl_reward_mean"] == 0.0  # the policy starts as the reference
    assert records[1]["critic/kl_reward_mean"] != 0.0  # then it has moved
    assert not any("loss/kl_ref" in r for r in records)  # no KL term in the loss


def test_value_range_clamps_the_predictions() -> None:
    head = ValueHead(4, (3, 2))
    torch.nn.init.constant_(head.net[-1].bias, 2.0)  # type: ignore[arg-type]
    critic = Critic(head, lr=1e-3, value_range=(0.0, 1.0))
    assert critic.clamp(torch.tensor([-0.5, 0.25, 2.0])).tolist() == [0.0, 0.25, 1.0]
    assert Critic(head, lr=1e-3).clamp(torch.tensor([2.0])).tolist() == [2.0]
    with pytest.raises(ConfigError, match="value_range"):
        load_config(None, ["critic.value_range=[1, 0]"])


def test_value_head_and_memory_window_refuse_several_learner_processes() -> None:
    from loop.checks import check_run

    # several processes need it; the check under test comes after
    servers = "generator.backend=vllm_server"
    check_run(load_config(None, ["train.advantage=gae"]), 1)
    with pytest.raises(ConfigError, match=r"^train\.advantage gae: one learner process only$"):
        check_run(load_config(None, ["train.advantage=gae", servers]), 4)
    with pytest.raises(ConfigError, match=r"^agent\.memory_turns: one learner process only$"):
        check_run(load_config(None, ["agent.memory_turns=2", servers]), 4)


def test_the_value_head_creates_no_vocabulary_sized_tensor() -> None:
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from loop.algo.losses import clipped_value_loss

    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: list[tuple[int, ...]] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            self.shapes += [tuple(t.shape) for t in tree_flatten(out)[0]
                            if isinstance(t, torch.Tensor)]  # fmt: skip
            return out

    head = ValueHead(64, head_widths(64, []))  # 38, 26: no width equals the vocabulary (300)
    hidden = torch.randn(1, 40, 64)
    mask = torch.ones(1, 40, dtype=torch.bool)
    with Shapes() as mode:
        values = values_from_hidden(head, hidden, chunk_size=16)
        clipped_value_loss(values, values.detach(), torch.ones(1, 40), mask).loss.sum().backward()
    assert mode.shapes and not any(300 in shape for shape in mode.shapes)
    assert max(torch.Size(s).numel() for s in mode.shapes) <= 40 * 64  # at most the hidden states


def test_assign_gae_returns_each_turns_mean_advantage_for_the_credit() -> None:
    from loop.algo.credit import Credit

    sample = _two_turn_sample(1.0)
    sample.source = 0
    turn_means = assign_gae([sample], load_config(None, ["train.advantage=gae"])).turn_means
    # A = R - V: turn 0 (0.8 + 0.6) / 2 = 0.7, turn 1 (0.5 + 0.4) / 2 = 0.45
    assert turn_means == {0: {0: pytest.approx(0.7), 1: pytest.approx(0.45)}}
    credit = Credit([[0.0, 0.0]], [0.0], [True], [True], 0, 0, [1.0])
    updated = credit.with_turn_advantages(turn_means)
    assert updated.turn_advantages[0] == pytest.approx([0.7, 0.45])
    assert credit.turn_advantages[0] == [0.0, 0.0]  # a new Credit; the old one is unchanged
    assert assign_gae([sample], load_config(None, [])) == ({}, {})  # loo: nothing to assign


def test_the_stress_test_runs_every_term_even_during_the_warm_up() -> None:
    policy = synthetic_policy()
    plain = Learner(policy, LearnerSettings(lr=1e-2, weight_decay=0.0)).stress_test(64)
    with_critic = _critic_learner(policy, warmup_iterations=5).stress_test(64)
    # V = 0 (the head's last layer starts at zero), targets 1: value loss 1/2 (0 - 1)^2 = 0.5,
    # times the coefficient 0.1: the policy loss plus 0.05, not the value loss alone.
    assert with_critic == pytest.approx(plain + 0.05, abs=1e-6)


def test_kl_in_the_reward_by_hand() -> None:
    # gae, gamma = lambda = 1: A_t = (sum of later rewards) - V_t. Output tokens' old and
    # reference log-probs give k1 = [0.5, 0, 0.5, -0.5]; times -0.1: KL rewards
    # [-0.05, 0, -0.05, 0.05], plus the outcome 1 on the last: r = [-0.05, 0, -0.05, 1.05],
    # later sums [0.95, 1.0, 1.0, 1.05], V = [0.2, 0.4, 0.5, 0.6] -> A = [0.75, 0.6, 0.5, 0.45]
    config = load_config(None, ["train.advantage=gae", "train.kl.into=reward", "train.kl.coef=0.1"])
    sample = _two_turn_sample(1.0)
    sample.old_logprobs = torch.tensor([0.0, -1.0, -2.0, 0.0, -0.5, -1.5])
    sample.ref_logprobs = torch.tensor([0.0, -1.5, -2.0, 0.0, -1.0, -1.0])
    metrics = assign_gae([sample], config).metrics
    torch.testing.assert_close(sample.advantages, torch.tensor([0, 0.75, 0.6, 0, 0.5, 0.45]))
    assert sample.returns is not None
    torch.testing.assert_close(sample.returns, torch.tensor([0, 0.95, 1.0, 0, 1.0, 1.05]))
    assert metrics["critic/kl_reward_mean"] == pytest.approx(-0.0125)
    sample.ref_logprobs = None
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        assign_gae([sample], config)


def test_kl_in_the_reward_takes_the_kl_out_of_the_loss_and_keeps_the_reference() -> None:
    from loop.learner.settings import LearnerSettings

    reward = LearnerSettings.for_rl(
        load_config(None, ["train.advantage=verlog", "train.kl.into=reward", "train.kl.coef=0.1"])
    )
    assert reward.kl_coef == 0.0 and reward.reference_logprobs
    loss = LearnerSettings.for_rl(load_config(None, ["train.kl.coef=0.1"]))
    assert loss.kl_coef == 0.1 and not loss.reference_logprobs
    with pytest.raises(ConfigError, match=r"train\.kl\.into reward needs per-token rewards"):
        load_config(None, ["train.kl.into=reward", "train.kl.coef=0.1"])
    with pytest.raises(ConfigError, match=r"critic\.whiten_advantages is for gae and verlog"):
        load_config(None, ["critic.whiten_advantages=true"])


def test_whitened_advantages_by_hand_and_targets_from_the_raw_ones() -> None:
    # raw A = R - V = [0.8, 0.6, 0.5, 0.4]: mean 0.575, unbiased variance 0.0875 / 3
    config = load_config(None, ["train.advantage=gae", "critic.whiten_advantages=true"])
    sample = _two_turn_sample(1.0)
    metrics = assign_gae([sample], config).metrics
    std = math.sqrt(0.0875 / 3)
    expected = [0.0, 0.225 / std, 0.025 / std, 0.0, -0.075 / std, -0.175 / std]
    torch.testing.assert_close(sample.advantages, torch.tensor(expected))
    assert sample.returns is not None  # the value targets: raw A + V, not whitened
    torch.testing.assert_close(sample.returns, torch.tensor([0, 1.0, 1.0, 0, 1.0, 1.0]))
    assert metrics["critic/advantage_mean"] == pytest.approx(0.575)  # logged before whitening


def test_the_verlog_config_is_what_verlogs_code_runs() -> None:
    """configs/verlog.yaml against Verlog's launch scripts and defaults (WentseChen/Verlog at
    589eb7e: examples/Verlog/train_*.sbatch, verl/trainer/config/ppo_trainer.yaml)."""
    config = load_config("configs/verlog.yaml", [])
    assert config.critic.first_token_weight == 3.0  # critic.highlight_ratio=3.0
    assert (config.train.kl.into, config.train.kl.coef) == ("reward", 0.001)  # k1, kl_coef 0.001
    assert config.critic.clip_eps == 0.5  # cliprange_value: 0.5
    assert config.critic.whiten_advantages  # masked_whiten after its GAE
    assert (config.critic.gamma_step, config.critic.lambda_step) == (0.99, 0.95)
    assert (config.critic.gamma_token, config.critic.lambda_token) == (1.0, 1.0)


def test_the_ppo_critic_config_is_the_papers() -> None:
    """configs/table1/ppo-critic.yaml against the LOOP paper's appendix ([P] App. C)."""
    config = load_config("configs/table1/ppo-critic.yaml", [])
    assert config.train.advantage == "gae" and (config.critic.gamma, config.critic.lam) == (1, 1)
    assert config.critic.hidden_sizes == []  # 3/5, 2/5 of the hidden size: 3072, 2048 on 5120
    assert config.critic.value_range == [0.0, 1.0] and config.critic.clip_eps is None  # an L2 loss
    assert (config.critic.coef, config.critic.coef_final) == (0.1, 0.001)
    assert config.critic.coef_decay_iterations == 200 and config.critic.warmup_iterations == 10
    assert not config.critic.grad_to_body and not config.critic.whiten_advantages
    assert config.train.kl.coef == 0.0
