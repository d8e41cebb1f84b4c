"""Two learner processes with FSDP2 give the same step as one process on the same rollouts.

    python -m pytest tests/loop/test_distributed.py -q        (30-50 s on 2 cores: slow)

or the 2-process half alone: PYTHONPATH=. torchrun --nproc-per-node 2 \
    tests/loop/test_distributed.py /tmp/out       (writes /tmp/out/results.pt)

The test launches this file under torchrun (`--nproc-per-node 2`, gloo on CPU), which is how a
user launches train.py, so `distributed.init_from_env` reads the launcher's environment. Each
process shards the tiny Llama with `distributed.shard_model` the trainer's lean way (built on
the meta device, rank 0's weights sent as shards: tied weights must stay tied), takes its half
of four rollouts (as the trainer shards them), recomputes the old log-probs and runs one
`Learner` optimizer step over the global minibatch of four; then the shards are gathered
(`full_state_dict`) and saved through `checkpoint.save_weights`, and the optimizer state is
gathered and reloaded into a fresh optimizer (`optimizer_state_dict`,
`load_optimizer_state_dict`), and the trainer's checkpoint is written, then read into a freshly
loaded model and learner (`save_checkpoint`, `load_weights`, `load_state`: what a resume and
`model.init_adapter` do), which must restore the weights and AdamW's moments exactly.
The test runs the same cases in its own process without a process group and compares: old
log-probs, loss, gradient norm, the gradients themselves, AdamW's moments, the updated weights,
and the saved adapter or model files. Four cases cover what sharding can get wrong:

- `lora`: LoRA on an untied model, gradient checkpointing on, one rollout per forward pass;
- `full_tied`: full fine-tuning with tied input/output embeddings (one parameter in two
  places), two rollouts per forward pass (padding);
- `lora_bf16`: a bfloat16 base with float32 LoRA weights (peft's default upcast): groups of
  mixed dtypes, gradients reduced in float32;
- `lora_demos`: LoRA with two demonstrations replayed in the step (`demo_coef`), one per
  process: each process's share, scaled so that the averaged gradient is the mean's.

The learning rate is large and the grad-norm clip tight, so the weights move by far more than
the tolerance and the global (cross-shard) gradient norm decides the update.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from accelerate import init_empty_weights

from loop.learner.batch import Sample
from loop.learner.learner import Learner
from loop.learner.settings import LearnerSettings
from loop.model import aliases, checkpoint, distributed
from loop.model.policy import LoraSettings, Policy, _wrap_lora
from tests.loop.conftest import tiny_llama, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
LENGTHS = (9, 14, 6, 11)  # four rollouts: two per process
ADVANTAGES = (1.5, -0.5, 1.0, -1.25)
LR = 0.05
MAX_GRAD_NORM = 0.05


@dataclass(frozen=True)
class Case:
    """One configuration of the policy and the learner."""

    name: str
    lora: bool
    tied: bool = False
    dtype: torch.dtype = torch.float32
    gradient_checkpointing: bool = False
    micro_batch_size: int = 1
    loss: str = "ppo"
    demo_coef: float = 0.0  # > 0: two demonstrations replayed in the step, one per process
    # How closely two processes match one. A bfloat16 base's adapters run in bfloat16 under
    # FSDP2 (its mixed precision policy, as vLLM samples them) but in float32 in one process
    # (peft's upcast), so there the two agree to bfloat16's rounding, not float32's: measured
    # log-probs 0.19 apart, gradients 7% of the largest, the norm 1.1%; Adam's first step then
    # moves a weight by +-lr whatever its gradient's size, so the weights are not compared.
    # A sharding fault (a gradient summed twice, a shard missed) is an O(1) error either way.
    logprob_atol: float = 5e-5
    grad_rtol: float = 1e-5  # of the largest gradient element, and of the norm
    compare_weights: bool = True


CASES = (
    Case("lora", lora=True, gradient_checkpointing=True),
    Case("full_tied", lora=False, tied=True, micro_batch_size=2, loss="reinforce"),
    Case(
        "lora_bf16",
        lora=True,
        dtype=torch.bfloat16,
        logprob_atol=0.5,
        grad_rtol=0.2,
        compare_weights=False,
    ),
    Case("lora_demos", lora=True, demo_coef=0.5),
)


def make_policy(case: Case, *, empty: bool = False) -> Policy:
    """The tiny Llama of `case`, identical in every process (seeded); with `empty`, its
    parameters on the meta device, as `load_policy(..., empty=True)` builds them."""
    if empty:
        with torch.random.fork_rng(devices=[]):
            with init_empty_weights(include_buffers=False):
                model = tiny_llama(tie_word_embeddings=case.tied)
            model.tie_weights()
            return _finish_policy(case, model.to(case.dtype))
    return _finish_policy(case, tiny_llama(tie_word_embeddings=case.tied).to(case.dtype))


def _finish_policy(case: Case, model: Any) -> Policy:
    if case.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
        model.enable_input_require_grads()
    if case.lora:
        torch.manual_seed(1)
        model = _wrap_lora(model, LoraSettings(rank=4, alpha=8))
        # peft starts B at zero, which would leave A without gradient in the first step.
        generator = torch.Generator().manual_seed(2)
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.copy_(0.1 * torch.randn(param.shape, generator=generator))
    tokenizer = tiny_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    return Policy(model=model, tokenizer=tokenizer, device=torch.device("cpu"))


def make_samples() -> list[Sample]:
    """Four rollouts of different lengths; the last 60% of each is output."""
    generator = torch.Generator().manual_seed(3)
    samples = []
    for length, advantage in zip(LENGTHS, ADVANTAGES, strict=True):
        tokens = torch.randint(3, 300, (length,), generator=generator)
        is_output = torch.arange(length) >= int(0.4 * length)
        sampler_logprobs = torch.full((length,), float("nan"))
        turn_ids = torch.where(is_output, 0, -1)
        advantages = torch.where(is_output, advantage, 0.0)
        samples.append(Sample(tokens, is_output, sampler_logprobs, turn_ids, advantages))
    return samples


def run_case(case: Case, out_dir: Path) -> dict[str, Any]:
    """One step of `case` in this process (its shard of the rollouts when distributed).

    Returns, on rank 0, what the test compares; `{}` on the other ranks.
    """
    if distributed.is_distributed():  # the trainer's lean load: rank 0 reads, the others receive
        policy = make_policy(case, empty=True)
        weights = make_policy(case).model.state_dict() if distributed.is_main() else None
        distributed.shard_model(policy.model, weights)
    else:
        policy = make_policy(case)
    causal_lm = aliases.causal_lm(policy.model)
    tied = causal_lm.get_input_embeddings().weight is causal_lm.get_output_embeddings().weight
    assert tied == case.tied, f"{case.name}: tied weights {'lost' if case.tied else 'made'}"
    learner = Learner(
        policy,
        LearnerSettings(
            lr=LR,
            weight_decay=0.01,
            loss=case.loss,
            epochs=1,
            minibatch_size=len(LENGTHS),
            micro_batch_size=case.micro_batch_size,
            max_grad_norm=MAX_GRAD_NORM,
            demo_coef=case.demo_coef,
            demos_per_step=2,
        ),
    )
    learner.replay(make_samples()[:2], seed=0)  # every process holds them all (the trainer's)
    # The trainer's sharding: an equal share of the rollouts per process.
    samples = make_samples()[distributed.rank() :: distributed.world_size()]
    learner.recompute_old_logprobs(samples)
    recomputed = [s.old_logprobs for s in samples]
    for sample in samples:  # ratios away from 1, so that some tokens are clipped
        assert sample.old_logprobs is not None
        offset = 0.1 * torch.sin(torch.arange(len(sample.tokens), dtype=torch.float32))
        sample.old_logprobs = sample.old_logprobs + offset
    stats = learner.learn(samples, seed=0)
    assert stats.optimizer_steps == 1, stats
    # The learner logs its own process's mean loss: combine them into the global mean.
    loss_sum, count = distributed.all_sum([stats.losses[0] * len(samples), len(samples)])
    gathered = _gather_objects(recomputed)
    grads = {  # left in place by the step: clipped, then used by AdamW
        name: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
        for name, p in policy.model.named_parameters()
        if p.requires_grad
    }
    state = distributed.full_state_dict(policy.model, trainable_only=True)
    checkpoint.save_weights(policy.model, out_dir / case.name)
    optimizer_state = distributed.optimizer_state_dict(policy.model, learner.optimizer)
    names = [name for name, p in policy.model.named_parameters() if p.requires_grad]
    roundtrip = _optimizer_roundtrip(policy, optimizer_state, names)
    restored = _checkpoint_roundtrip(case, policy, learner, out_dir / f"{case.name}-checkpoints")
    if not distributed.is_main():
        return {}
    old: list[Any] = [None] * len(LENGTHS)
    for rank, logprobs in enumerate(gathered):
        for j, values in enumerate(logprobs):
            old[rank + j * len(gathered)] = values
    return {
        "old_logprobs": old,
        "loss": loss_sum / count,
        "grad_norm": stats.grad_norms[0],
        "clipfrac": stats.clip_fractions[0],
        "demo_losses": stats.demo_losses,
        "grads": grads,
        "exp_avg": _exp_avgs(optimizer_state, names),
        "optimizer_roundtrip_diff": roundtrip,
        "checkpoint_roundtrip_diff": restored,
        "state": state,
    }


def _exp_avgs(optimizer_state: dict[str, Any], names: list[str]) -> dict[str, torch.Tensor]:
    """AdamW's first moments by parameter name (one process keys them by position)."""
    moments = optimizer_state["state"]
    keys = names if distributed.is_distributed() else range(len(names))
    return {name: moments[key]["exp_avg"] for name, key in zip(names, keys, strict=True)}


def _optimizer_roundtrip(policy: Policy, state: dict[str, Any], names: list[str]) -> float:
    """Resume: every rank loads the full state into a new learner; the largest change."""
    full = distributed.broadcast_object(state)
    fresh = Learner(policy, LearnerSettings(lr=LR, weight_decay=0.01)).optimizer
    distributed.load_optimizer_state_dict(policy.model, fresh, full)
    again = distributed.optimizer_state_dict(policy.model, fresh)
    if not distributed.is_main():
        return 0.0
    before, after = _exp_avgs(state, names), _exp_avgs(again, names)
    return max(float((before[name] - after[name]).abs().max()) for name in names)


def _checkpoint_roundtrip(case: Case, policy: Policy, learner: Learner, root: Path) -> float:
    """A resume: the trainer's checkpoint written, then read into a freshly loaded (lean) model
    and learner, as after a kill; the largest difference in the weights and AdamW's moments."""
    checkpoint.save_checkpoint(root, 1, policy.model, {"learner": learner.state_dict()}, keep=1)
    if distributed.is_distributed():
        fresh = make_policy(case, empty=True)
        weights = make_policy(case).model.state_dict() if distributed.is_main() else None
        distributed.shard_model(fresh.model, weights)
    else:
        fresh = make_policy(case)
    again = Learner(fresh, LearnerSettings(lr=LR, weight_decay=0.01))
    saved = root / "iter-1"
    checkpoint.load_weights(fresh.model, saved)  # model.init_adapter reads adapters this way
    again.load_state_dict(checkpoint.load_state(saved)["learner"])
    names = [name for name, p in policy.model.named_parameters() if p.requires_grad]
    before = distributed.full_state_dict(policy.model, trainable_only=True)
    after = distributed.full_state_dict(fresh.model, trainable_only=True)
    saved_state = distributed.optimizer_state_dict(policy.model, learner.optimizer)
    loaded_state = distributed.optimizer_state_dict(fresh.model, again.optimizer)
    if not distributed.is_main():
        return 0.0
    old_moments, new_moments = _exp_avgs(saved_state, names), _exp_avgs(loaded_state, names)
    assert before.keys() == after.keys() and before
    return max(
        *(float((before[k] - after[k]).abs().max()) for k in before),
        *(float((old_moments[k] - new_moments[k]).abs().max()) for k in names),
    )


def _gather_objects(obj: Any) -> list[Any]:
    if not distributed.is_distributed():
        return [obj]
    out: list[Any] = [None] * distributed.world_size()
    torch.distributed.all_gather_object(out, obj)
    return out


def count_steps() -> int:
    """Optimizer steps of one epoch over 8 rollouts in global minibatches of 4 (2 expected);
    the model loaded whole in every process and then sharded (the other way to shard)."""
    policy = make_policy(CASES[0])
    distributed.shard_model(policy.model)
    learner = Learner(policy, LearnerSettings(lr=LR, weight_decay=0.0, epochs=1, minibatch_size=4))
    samples = (make_samples() * 2)[distributed.rank() :: distributed.world_size()]
    learner.recompute_old_logprobs(samples)
    return learner.learn(samples, seed=0).optimizer_steps


def worker_main(out_dir: Path) -> None:
    """Entry point under torchrun: every case, results written by rank 0."""
    torch.set_num_threads(1)
    assert distributed.init_from_env(), "launch with torchrun --nproc-per-node 2"
    try:
        results: dict[str, Any] = {case.name: run_case(case, out_dir) for case in CASES}
        results["optimizer_steps"] = count_steps()
        if distributed.is_main():
            torch.save(results, out_dir / "results.pt")
    finally:
        distributed.shutdown()


# -- the test ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_process_results(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Run every case under torchrun with 2 CPU processes; their results and output folder."""
    out_dir = tmp_path_factory.mktemp("fsdp2")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        __file__, str(out_dir),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return out_dir, torch.load(out_dir / "results.pt", weights_only=False)


# Measured on 2 cores (2-process minus 1-process, worst case over the float32 cases): old
# log-probs 6e-6; gradients 4e-7 of the largest; weights 8e-5 = 0.0017 lr. The weights are
# looser because AdamW's first step moves each weight by lr * g / (|g| + eps), about +-lr
# whatever |g|, so float noise in a near-zero gradient element moves its update by up to lr; a
# wrong gradient scale would not show in the weights at all (Adam is scale-invariant), which is
# why the gradients and their norm are compared tightly too.
WEIGHT_ATOL = 0.01 * LR


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_two_processes_match_one(
    case: Case, two_process_results: tuple[Path, dict], tmp_path: Path
) -> None:
    out_dir, results = two_process_results
    single = run_case(case, tmp_path)
    double = results[case.name]
    for one, two in zip(single["old_logprobs"], double["old_logprobs"], strict=True):
        torch.testing.assert_close(two, one, rtol=0, atol=case.logprob_atol)
    assert abs(double["loss"] - single["loss"]) <= 1e-5 * max(1.0, abs(single["loss"]))
    assert len(single["demo_losses"]) == (1 if case.demo_coef else 0)  # the replayed pair's
    for one, two in zip(single["demo_losses"], double["demo_losses"], strict=True):
        assert abs(two - one) <= 1e-5 * max(1.0, one)  # mean, summed over the processes
    # The clip is active, so the update depends on the global norm across shards.
    assert single["grad_norm"] > 2 * MAX_GRAD_NORM
    assert abs(double["grad_norm"] - single["grad_norm"]) <= case.grad_rtol * single["grad_norm"]
    assert double["grads"].keys() == single["grads"].keys() and single["grads"]
    largest = max(float(g.abs().max()) for g in single["grads"].values())
    for key, grad in single["grads"].items():
        atol = case.grad_rtol * largest
        torch.testing.assert_close(double["grads"][key], grad, rtol=0, atol=atol, msg=key)
    for key, moment in single["exp_avg"].items():  # the sharded optimizer's state, gathered
        atol = 0.1 * case.grad_rtol * largest  # exp_avg = (1 - beta1) * g after one step
        torch.testing.assert_close(double["exp_avg"][key], moment, rtol=0, atol=atol, msg=key)
    assert double["optimizer_roundtrip_diff"] == 0.0
    assert double["checkpoint_roundtrip_diff"] == 0.0  # resumed exactly
    assert single["checkpoint_roundtrip_diff"] == 0.0
    assert double["state"].keys() == single["state"].keys()
    initial = distributed.full_state_dict(make_policy(case).model, trainable_only=True)
    moved = max(float((single["state"][k] - initial[k]).abs().max()) for k in initial)
    assert moved > 0.5 * LR, f"the step hardly moved the weights ({moved})"
    if not case.compare_weights:
        return
    for key, value in single["state"].items():
        torch.testing.assert_close(double["state"][key], value, rtol=0, atol=WEIGHT_ATOL, msg=key)
    assert_same_saved_weights(out_dir / case.name, tmp_path / case.name, WEIGHT_ATOL)


def assert_same_saved_weights(two: Path, one: Path, tol: float) -> None:
    """The two runs wrote the same files with the same tensors (PEFT adapter or HF model)."""
    from safetensors.torch import load_file

    names = sorted(p.name for p in one.iterdir())
    assert sorted(p.name for p in two.iterdir()) == names
    for name in names:
        if name.endswith(".safetensors"):
            a, b = load_file(str(one / name)), load_file(str(two / name))
            assert a.keys() == b.keys() and a
            for key in a:
                torch.testing.assert_close(b[key], a[key], rtol=0, atol=tol, msg=key)


@pytest.mark.slow
def test_saved_adapter_loads_in_peft(two_process_results: tuple[Path, dict]) -> None:
    """The gathered adapter is a PEFT adapter: it loads onto the base model as is."""
    from peft import PeftModel

    out_dir, results = two_process_results
    loaded = PeftModel.from_pretrained(tiny_llama(), str(out_dir / "lora"))
    state = dict(loaded.named_parameters())
    for key, value in results["lora"]["state"].items():
        torch.testing.assert_close(state[key].detach(), value, rtol=0, atol=0, msg=key)


@pytest.mark.slow
def test_minibatch_is_global(two_process_results: tuple[Path, dict]) -> None:
    """`minibatch_size` counts rollouts over all processes, as in the reference code."""
    _, results = two_process_results
    assert count_steps() == 2
    assert results["optimizer_steps"] == 2


def test_single_process_helpers_are_identities() -> None:
    policy = make_policy(CASES[0])
    assert not distributed.init_from_env()  # no launcher environment: one process
    assert distributed.shard_model(policy.model) is policy.model
    trainable = distributed.full_state_dict(policy.model, trainable_only=True)
    assert trainable and all("lora_" in key for key in trainable)


if __name__ == "__main__":
    worker_main(Path(sys.argv[1]))
