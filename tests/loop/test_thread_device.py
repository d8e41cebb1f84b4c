"""The overlap's learner thread runs on this process's GPU, not on cuda:0.

    python -m pytest tests/loop/test_thread_device.py -q        (a second; no GPU: a fake
    `torch.cuda` keeps one current device per thread, as CUDA does)

With `train.overlap.max_staleness` >= 1 steps 4-5 run in a worker thread
(loop/rollout/ahead.py `off_loop`); CUDA's current device is per thread, so on rank 1 the thread
would start on cuda:0. The policy's device carries its index, collectives go to `LOCAL_RANK`'s
GPU, and `update_policy` makes the thread's current device the policy's before any work.
"""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from loop.config import RunConfig
from loop.learner import update
from loop.model import distributed, policy
from loop.rollout.ahead import AheadCollector


class PerThreadCuda:
    """`torch.cuda`'s device calls, with CUDA's rule: a new thread starts on device 0."""

    def __init__(self) -> None:
        self.local = threading.local()

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return getattr(self.local, "device", 0)

    def set_device(self, device: Any) -> None:
        self.local.device = torch.device(device).index


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> PerThreadCuda:
    fake = PerThreadCuda()
    for name in ("is_available", "current_device", "set_device"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    fake.set_device("cuda:1")  # what init_from_env does on rank 1 (LOCAL_RANK=1)
    return fake


class SeenError(Exception):
    """Raised by the stub learner once it has recorded its thread's device."""


def test_policy_device_carries_the_process_gpu_index(cuda: PerThreadCuda) -> None:
    assert policy._check_device("cuda") == torch.device("cuda", 1)
    assert policy._check_device("auto") == torch.device("cuda", 1)


def test_collectives_use_the_local_rank_gpu_from_any_thread(
    cuda: PerThreadCuda, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "nccl")
    seen: list[torch.device] = []
    thread = threading.Thread(target=lambda: seen.append(distributed._device()))
    thread.start()
    thread.join()
    assert seen == [torch.device("cuda", 1)]


def test_the_overlap_learner_thread_runs_on_the_policy_gpu(cuda: PerThreadCuda) -> None:
    devices: list[int] = []

    def recompute(samples: Any) -> dict[str, float]:
        devices.append(torch.cuda.current_device())
        raise SeenError

    learner: Any = SimpleNamespace(
        policy=SimpleNamespace(device=torch.device("cuda", 1)),
        recompute_old_logprobs=recompute,
    )

    async def learn_off_loop() -> None:
        ahead = AheadCollector(
            collect=None,  # type: ignore[arg-type]
            max_staleness=1, tasks_per_iteration=1, iterations=2, published=0,
        )  # fmt: skip
        ahead._running[1] = ([], asyncio.ensure_future(asyncio.sleep(0)))  # one running ahead
        with pytest.raises(SeenError):
            await ahead.off_loop(
                update.update_policy, learner, [], [], None, RunConfig(), 0, None, False
            )
        await ahead.cancel()

    asyncio.run(learn_off_loop())
    assert devices == [1], f"the learner thread ran on cuda:{devices}, not the policy's cuda:1"
