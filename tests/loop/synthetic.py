"""A synthetic task suite for trainer tests: the reward depends only on the tokens emitted.

The policy is the tiny random Llama of conftest.py with a word-level tokenizer whose `decode`
wraps the sampled words in a python block, `emit("w17 w42 ...")`, so the real agent loop
(loop/agent.py) extracts it as code and calls `step`. The environment runs no code: it reads the
words, ends the episode, and its test report has one test per word, passed when the word is in
the target set (ids below `TARGET_BELOW`). Reward = fraction of emitted words in the target set,
which a policy can raise only by changing which tokens it samples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast

from loop.policy import Policy
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

    def reset(self) -> str:
        return self.task.instruction

    def step(self, code: str) -> str:
        match = re.search(r'emit\("(.*)"\)', code, re.S)
        self.words = (match.group(1) if match else "").split()
        self.done = True
        return "ok"

    async def astep(self, code: str) -> str:
        return self.step(code)

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

    def __init__(self) -> None:
        self._splits = {
            split: [
                Task(f"{split}{i}_1", f"{split}{i}", 1, 1, f"w{10 + i} w{20 + i}", (), split)
                for i in range(count)
            ]
            for split, count in (("train", 4), ("dev", 2))
        }

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
