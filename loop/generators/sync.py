"""Publishing the policy's new weights to the generator that samples the next rollouts.

A generator declares how it sees the weights (`Generator.shares_weights`): the `hf` generator
samples with the training model itself, so there is nothing to publish; every other backend
(the vLLM servers) is handed the LoRA adapter saved to a directory, which rank 0 loads.
Both calls are collective: every learner process makes them, in the same order.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from loop.generators.base import Generator
from loop.model import distributed
from loop.model.checkpoint import save_weights
from loop.model.policy import Policy

PARTIAL = ".partial"


def publish_weights(
    policy: Policy, generator: Generator, target: Path, *, keep: int | None = None
) -> None:
    """Make `generator` sample from the policy's current weights (collective): saved to
    `target` (shards gathered to rank 0), which appears whole or not at all (written beside it,
    then renamed), and loaded there, unless the generator shares them. With `keep`, of the
    directories published beside `target` (its parent holds nothing else) the newest stay."""
    if generator.shares_weights:
        return
    partial = target.with_name(target.name + PARTIAL)
    if distributed.is_main():
        shutil.rmtree(partial, ignore_errors=True)  # left by a killed run
    save_weights(policy.model, partial)
    if distributed.is_main():
        shutil.rmtree(target, ignore_errors=True)  # a resumed run publishes its iteration again
        partial.rename(target)
    serve_adapter(generator, target)
    if keep is not None and distributed.is_main():
        prune_published(target.parent, keep)


def prune_published(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` published directories in `root` (by modification time);
    the deleted ones. The generator has moved to the newest; an older version's requests are
    over (a synchronous iteration; collecting S iterations ahead, the caller keeps S more),
    and a server reads an adapter only when loading it."""
    published = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.endswith(PARTIAL)),
        key=lambda p: p.stat().st_mtime_ns,
    )
    doomed = published[: max(0, len(published) - keep)]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def serve_adapter(generator: Generator, adapter_dir: Path) -> None:
    """Point a generator that keeps its own weights at a saved adapter (rank 0 loads it;
    collective); a no-op for one that shares the policy's weights."""
    if generator.shares_weights:
        return
    if distributed.is_main():
        generator.load_adapter(adapter_dir)
    distributed.barrier()
