"""The learner with a step's common start run once, against every sequence run whole.

    python benchmarks/bench_shared_prefix.py [--repeats 3] [--threads 2]

SmolLM2-135M-Instruct + LoRA r16 (B factors random), float32, the quickstart's learner shapes:
24 rollouts of 6 tasks (the real first prompts of six easy tasks, no worked example, as the
quickstart prompts), each followed by 3 turns of 100 sampled ids and 60 ids of glue and
observation (random ids: the cost does not depend on them); the step's minibatch is 4 of them
plus 2 demonstrations of the same shape (`train.replay.coef`). Times, alternating the two ways,
medians of `--repeats`: the recompute of the 24 rollouts' old log-probs (no grad) and one
optimizer step (forward and backward of the 6 sequences). Also the largest gap between the two
ways' old log-probs. `train.shared_prefix_min` 0 is the whole-sequence way.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))  # as a script
from benchmarks.bench_rollout_speed import TASKS, scripts
from loop.learner.batch import Sample
from loop.learner.learner import Learner
from loop.learner.prefix import shared_length
from loop.learner.settings import LearnerSettings
from loop.model.aliases import resolve_model
from loop.model.policy import LoraSettings, load_policy


def rollout(prompt: list[int], seed: int, turns: int = 3) -> Sample:
    """`prompt`, then `turns` x (100 sampled ids, 60 environment ids); advantage +-1."""
    rng = torch.Generator().manual_seed(seed)
    tokens, output = list(prompt), [False] * len(prompt)
    for _ in range(turns):
        tokens += torch.randint(0, 49000, (160,), generator=rng).tolist()
        output += [True] * 100 + [False] * 60
    is_output = torch.tensor(output)
    n = len(tokens)
    return Sample(
        tokens=torch.tensor(tokens), is_output=is_output,
        sampler_logprobs=torch.full((n,), float("nan")), turn_ids=torch.where(is_output, 0, -1),
        advantages=torch.where(is_output, 1.0 if seed % 2 else -1.0, 0.0),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    path = resolve_model("smollm2-135m")
    prompts = [s.prompt for s in scripts(AutoTokenizer.from_pretrained(path), TASKS[:6], 1, False)]
    samples = [rollout(prompts[i // 4], seed=i) for i in range(24)]
    demos = [rollout(prompts[i], seed=100 + i) for i in range(2)]
    step = [*samples[::6], *demos]  # 4 rollouts of different tasks and 2 demonstrations
    base = load_policy(path, lora=LoraSettings(rank=16, alpha=32))
    with torch.no_grad():
        for name, parameter in base.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02)
    times: dict[str, dict[str, list[float]]] = {"whole": {}, "shared": {}}
    olds: dict[str, list[torch.Tensor]] = {}
    for repeat in range(args.repeats):
        for way in ("whole", "shared") if repeat % 2 == 0 else ("shared", "whole"):
            policy = copy.deepcopy(base)
            settings = LearnerSettings(
                lr=3e-4, weight_decay=0.0, epochs=1, minibatch_size=6,
                shared_prefix_min=0 if way == "whole" else 64,
            )  # fmt: skip
            learner = Learner(policy, settings)
            start = time.perf_counter()
            learner.recompute_old_logprobs(samples)
            recompute = time.perf_counter() - start
            olds[way] = [s.old_logprobs for s in samples if s.old_logprobs is not None]
            learner.recompute_old_logprobs(step)
            start = time.perf_counter()
            learner.learn(step, seed=0)
            learn = time.perf_counter() - start
            times[way].setdefault("recompute of 24 rollouts", []).append(recompute)
            times[way].setdefault("one step of 4 rollouts + 2 demonstrations", []).append(learn)
            print(f"  {way}: recompute {recompute:.1f} s, step {learn:.1f} s", flush=True)
    lengths = [len(s.tokens) for s in samples]
    print(
        f"\n{len(samples)} rollouts of {min(lengths)}-{max(lengths)} ids; shared start of the "
        f"24: {shared_length(samples)} ids, of the step: {shared_length(step)}; "
        f"{torch.get_num_threads()} threads"
    )
    for what in times["whole"]:
        whole = statistics.median(times["whole"][what])
        shared = statistics.median(times["shared"][what])
        print(f"{what}: whole {whole:.2f} s, shared {shared:.2f} s ({whole / shared:.2f}x)")
    pairs = zip(olds["whole"], olds["shared"], strict=True)
    gap = max((a - b).abs().max().item() for a, b in pairs)
    print(f"largest old log-prob gap between the two ways: {gap:.2e}")


if __name__ == "__main__":
    main()
