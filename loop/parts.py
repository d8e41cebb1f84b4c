"""What training runs on: the built objects `loop.trainer.train` and the warm start share.

`loop.build.build_training` makes them from a config; a test or a benchmark may make them by
hand (a tiny policy, a scripted suite). One definition, so the trainer and the warm start see
the same typed fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from loop.generators.base import Generator
from loop.generators.tokenizer import Tokenizer
from loop.model.policy import Policy
from loop.rollout.collect import SandboxPool
from tasks import TaskSuite


@dataclass
class TrainParts:
    """The one model copy and everything its rollouts need."""

    policy: Policy  # the one model copy the learner trains
    generator: Generator  # samples the rollouts (the policy itself for `hf`)
    tokenizer: Tokenizer
    suite: TaskSuite
    pool: SandboxPool  # entered: sandboxes for the rollouts
