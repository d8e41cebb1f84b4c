"""Publishing the policy's new weights to the generator that samples the next rollouts.

A generator declares how it sees the weights (`Generator.shares_weights`): the `hf` generator
samples with the training model itself, so there is nothing to publish; every other backend
(in-process vLLM, a server) is handed the LoRA adapter saved to a directory, which rank 0 loads.
Both calls are collective: every learner process makes them, in the same order.
"""

from __future__ import annotations

from pathlib import Path

from loop.generators.base import Generator
from loop.model import distributed
from loop.model.checkpoint import save_weights
from loop.model.policy import Policy


def publish_weights(policy: Policy, generator: Generator, target: Path) -> None:
    """Make `generator` sample from the policy's current weights (collective): saved to
    `target` (shards gathered to rank 0) and loaded there, unless the generator shares them."""
    if generator.shares_weights:
        return
    save_weights(policy.model, target)
    serve_adapter(generator, target)


def serve_adapter(generator: Generator, adapter_dir: Path) -> None:
    """Point a generator that keeps its own weights at a saved adapter (rank 0 loads it;
    collective); a no-op for one that shares the policy's weights."""
    if generator.shares_weights:
        return
    if distributed.is_main():
        generator.load_adapter(adapter_dir)
    distributed.barrier()
