"""A synthetic task suite for trainer tests: the reward depends only on the tokens emitted.

The policy is the tiny random Llama of conftest.py with a word-level tokenizer whose `decode`
wraps the sampled words in a python block, `emit("w17 w42 ...")`, so the real agent loop
(loop/rollout/agent.py) extracts it as code and calls `step`. The environment runs no code: it
reads the words, ends the episode, and its test report has one test per word, passed when the word
is in the target set (ids below `TARGET_BELOW`). Reward = fraction of emitted words in the target
set, which a policy can raise only by changing which tokens it samples.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from loop.config import load_config
from loop.generators.hf.generator import HFGenerator
from loop.model.policy import Policy
from loop.parts import TrainParts
from loop.trainer import train
from tasks.core import Task, TestReport, TestResult
from tests.loop.conftest import tiny_llama, tiny_tokenizer

TARGET_BELOW = 150  # words w3 .. w149 are "good": about half of the vocabulary
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }} {{ m['content'] }} </s> {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)


class CodeWordTokenizer(PreTrainedTokenizerFast):
    """Decodes sampled words as a python block, so the agent loop sees them as code."""

    def decode(self, token_ids: Any, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        text = super().decode(token_ids, *args, **kwargs)
        return f'```python\nemit("{text}")\n```'


def code_word_tokenizer() -> CodeWordTokenizer:
    """The tiny word-level tokenizer with a chat template and the code-wrapping decode."""
    base = tiny_tokenizer()
    tokenizer = CodeWordTokenizer(
        tokenizer_object=base.backend_tokenizer,
        bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="</s>",
    )  # fmt: skip
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def synthetic_policy(seed: int = 0) -> Policy:
    """The tiny Llama (trainable, full fine-tuning) with the code-word tokenizer."""
    model = tiny_llama(seed=seed).train()
    return Policy(model=model, tokenizer=code_word_tokenizer(), device=torch.device("cpu"))


@dataclass
class WordEnv:
    """One episode: the first `step` records the emitted words and ends the episode."""

    task: Task
    words: list[str] = field(default_factory=list)
    api_calls: list[Any] = field(default_factory=list)
    last_result: Any = None
    done: bool = False
    start_fingerprint: str | None = None

    def reset(self) -> str:
        return self.task.instruction

    async def areset(self) -> str:
        return self.reset()

    async def aclose(self) -> None:
        return None

    def step(self, code: str) -> str:
        match = re.search(r'emit\("(.*)"\)', code, re.S)
        self.words = (match.group(1) if match else "").split()
        self.done = True
        return "ok"

    async def astep(self, code: str) -> str:
        return self.step(code)

    async def aevaluate(self) -> TestReport:
        return self.evaluate()

    def evaluate(self) -> TestReport:
        tests = [
            TestResult(f"word_{i}", "emit a low word", _is_target(w), "" if _is_target(w) else w)
            for i, w in enumerate(self.words)
        ] or [TestResult("no_words", "emit at least one word", False, "nothing emitted")]
        return TestReport(self.task.id, tuple(tests))


def _is_target(word: str) -> bool:
    return word.startswith("w") and word[1:].isdigit() and int(word[1:]) < TARGET_BELOW


class WordSuite:
    """Four training tasks (and two dev tasks) with the same word-emitting goal."""

    name = "words"
    shares_weights = False
    uses_sandbox = False  # the environment runs no code
    marks_collateral = False
    replays_exactly = True  # the words alone decide the state

    def __init__(self) -> None:
        self._splits = {
            split: [
                Task(f"{split}{i}_1", f"{split}{i}", 1, 1, f"w{10 + i} w{20 + i}", (), split)
                for i in range(count)
            ]
            for split, count in (("train", 4), ("dev", 2))
        }

    @property
    def splits(self) -> dict[str, list[Task]]:
        return self._splits

    def tasks(self, split: str) -> list[Task]:
        return list(self._splits[split])

    def task(self, task_id: str) -> Task:
        return next(t for ts in self._splits.values() for t in ts if t.id == task_id)

    def make_env(self, task: Task, sandbox: Any) -> WordEnv:
        return WordEnv(task)

    def example_messages(self) -> list[dict[str, str]]:
        return []


@dataclass
class MultiTurnWordEnv(WordEnv):
    """Like `WordEnv`, but the episode lasts `turns` steps; the words of every step count."""

    turns: int = 3
    steps: int = 0

    def step(self, code: str) -> str:
        match = re.search(r'emit\("(.*)"\)', code, re.S)
        self.words += (match.group(1) if match else "").split()
        self.steps += 1
        self.done = self.steps >= self.turns
        return f"ok {self.steps}"


class MultiTurnWordSuite(WordSuite):
    """`WordSuite` with episodes of `turns` steps (for memory windows and per-turn credit)."""

    def __init__(self, turns: int = 3) -> None:
        super().__init__()
        self.turns = turns

    def make_env(self, task: Task, sandbox: Any) -> WordEnv:
        return MultiTurnWordEnv(task, turns=self.turns)


class NoSandboxPool:
    """The environment runs no code, so rollouts get no sandbox."""

    async def acquire_async(self) -> None:
        return None

    async def release_async(self, sandbox: Any) -> None:
        return None


# The synthetic training run of tests/loop/test_trainer.py and test_golden_curve.py.
SYNTHETIC = [
    "model.lora_rank=0", "agent.max_turns=1", "agent.max_new_tokens=6",
    "agent.max_context_tokens=4000", "train.tasks_per_iteration=2",
    "train.rollouts_per_task=8", "train.min_rollouts_per_task=8", "train.rollouts_fraction=1.0",
    "train.epochs=2", "train.minibatch_size=8", "train.lr=0.001", "train.max_grad_norm=1.0",
    "train.eval_every=0", "train.tensorboard=false", "train.stress_test=false",
    "train.max_concurrent_rollouts=16",
]  # fmt: skip


def run_synthetic(
    tmp_path: Path,
    iterations: int,
    *extra: str,
    max_batch_size: int = 16,
    suite: WordSuite | None = None,
) -> list[dict[str, Any]]:
    """Train the synthetic policy on `WordSuite` for `iterations`; the metrics.jsonl records.

    `suite`: another word suite (e.g. `MultiTurnWordSuite`, with `agent.max_turns` to match).
    `max_batch_size=1` makes the run bit-for-bit reproducible: the hf generator then never
    batches rollouts whose composition (and so padding and float rounding) depends on timing.
    """
    config = load_config(
        None, [f"output_dir={tmp_path}", "name=synth", f"train.iterations={iterations}",
               *SYNTHETIC, *extra],
    )  # fmt: skip
    torch.manual_seed(0)
    policy = synthetic_policy()
    generator = HFGenerator(policy, max_batch_size=max_batch_size)
    parts = TrainParts(policy, generator, policy.tokenizer, suite or WordSuite(), NoSandboxPool())
    train(config, parts, show_progress=False)
    lines = (tmp_path / "synth" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
