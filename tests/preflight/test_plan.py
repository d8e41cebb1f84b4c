"""Each refusal of the preflight (loop/preflight/plan.py), with a traced step given by hand.

Run: python -m pytest tests/preflight/test_plan.py      (milliseconds: no trace is run)

Every refusal test starts from a config the preflight accepts and changes the one thing the
rule is about, so it fails if the rule is missing.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from loop.config import load_config
from loop.preflight.plan import learner_world_size
from loop.preflight.report import make_plan
from loop.preflight.shapes import GIB
from loop.preflight.trace import TraceRequest, TraceResult

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def traced(peak_gib: float) -> object:
    """A stand-in for `run_trace`: every step peaks at `peak_gib` per GPU."""

    def trace(request: TraceRequest) -> TraceResult:
        weights = int(15.2e9 / request.world_size)
        kinds = {"Sharded Param": weights, "Activation": int(peak_gib * GIB) - weights}
        return TraceResult(int(peak_gib * GIB), kinds, int(7.6e9), int(40e6), request.world_size)

    return trace


def plan_of(name: str, overrides: list[str], peak_gib: float = 30.0, **kwargs: object):
    config = load_config(CONFIGS / name, [f"output_dir={Path.cwd()}", *overrides])
    return make_plan(config, trace=traced(peak_gib), **kwargs)  # type: ignore[arg-type]


SERVER_7B = ["generator.backend=vllm_server", "generator.gpu_memory_utilization=0.35"]


def test_the_shipped_configs_and_the_fixed_server_variant_pass() -> None:
    assert plan_of("qwen2.5-7b-1gpu.yaml", []).refusals == []  # 16 rows: an H100
    assert (
        plan_of("qwen2.5-7b-1gpu.yaml", ["generator.max_batch_size=32"], gpu="h200").refusals == []
    )
    assert plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0).refusals == []
    fixed = [*SERVER_7B, "generator.max_model_len=32768"]
    assert plan_of("qwen2.5-7b-1gpu.yaml", fixed).refusals == []


def test_a_context_longer_than_the_servers_is_refused() -> None:
    """The 7B server variant as documented before: max_model_len left at 8192."""
    (refusal,) = plan_of("qwen2.5-7b-1gpu.yaml", SERVER_7B).refusals
    assert "agent.max_context_tokens=32768 > generator.max_model_len=8192" in refusal


def test_the_hf_engines_rows_beyond_the_gpu_are_refused() -> None:
    (refusal,) = plan_of("qwen2.5-7b-1gpu.yaml", ["generator.max_batch_size=64"]).refusals
    assert "generator.max_batch_size=64" in refusal and "agent.max_context_tokens" in refusal


def test_the_hf_engines_slot_growth_is_counted() -> None:
    """32 rows at 32,768 tokens: 56 GiB of slots fit an H100 beside the 7B model, but a growth
    under active rows holds the old slots too (up to 32 x 32,704 tokens) and the prompt being
    admitted (32,768 tokens), which does not."""
    (refusal,) = plan_of("qwen2.5-7b-1gpu.yaml", ["generator.max_batch_size=32"]).refusals
    assert "slots 56.0 GiB" in refusal and "largest transient 57.6 GiB" in refusal


def test_a_learner_beyond_the_named_gpu_is_refused() -> None:
    assert plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0, gpu="h200").refusals == []
    (refusal,) = plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0, gpu="a100-40g").refusals
    assert "train.max_seq_len=32000" in refusal and "a100-40g" in refusal


def test_a_server_sharing_the_learners_gpu_beyond_it_is_refused() -> None:
    over = [*SERVER_7B[:1], "generator.gpu_memory_utilization=0.7",
            "generator.max_model_len=32768"]  # fmt: skip
    (refusal,) = plan_of("qwen2.5-7b-1gpu.yaml", over).refusals
    assert "generator.gpu_memory_utilization=0.7" in refusal and "share" in refusal


def test_a_server_whose_weights_and_one_sequence_overflow_its_share_is_refused() -> None:
    small = [*SERVER_7B[:1], "generator.gpu_memory_utilization=0.15",
             "generator.max_model_len=32768"]  # fmt: skip
    (refusal,) = plan_of("qwen2.5-7b-1gpu.yaml", small).refusals
    assert "generator.max_model_len=32768" in refusal and "gpu_memory_utilization=0.15" in refusal


def test_a_server_start_longer_than_the_collective_wait_is_refused(capsys) -> None:
    """loop/checks.py's rule, which the preflight runs before it plans (no trace is run)."""
    from train import preflight

    slow = ["generator.server_start_timeout_s=4000"]
    assert preflight(CONFIGS / "qwen2.5-32b-8gpu.yaml", slow, None, "h100") == 2
    assert capsys.readouterr().err.startswith(
        "train.py: generator.server_start_timeout_s 4000 must be below "
        "train.collective_timeout_s 3600"
    )


def test_a_rollout_longer_than_the_wait_for_rank_0_is_refused() -> None:
    late = ["agent.rollout_timeout_s=30000"]
    (refusal,) = plan_of("qwen2.5-32b-8gpu.yaml", late, peak_gib=62.0).refusals
    assert "agent.rollout_timeout_s=30000 must be below train.rollout_wait_timeout_s" in refusal


def test_open_files_are_refused_only_above_the_hard_limit(monkeypatch) -> None:
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 1_000_000))
    assert plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0).refusals == []  # soft: raised
    monkeypatch.setattr(resource, "getrlimit", lambda _: (256, 1024))
    (refusal,) = plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0).refusals
    assert "hard RLIMIT_NOFILE is 1024" in refusal and "128 kernels" in refusal


def test_the_world_size_is_the_gpus_below_the_servers() -> None:
    config = load_config(CONFIGS / "qwen2.5-32b-8gpu.yaml")
    assert learner_world_size(config, None) == 4 and learner_world_size(config, 2) == 2
    assert learner_world_size(load_config(CONFIGS / "qwen2.5-7b-1gpu.yaml"), None) == 1


def test_an_unknown_gpu_is_one_line() -> None:
    with pytest.raises(ValueError, match="--gpu 'h300'"):
        plan_of("qwen2.5-7b-1gpu.yaml", [], gpu="h300")


def test_the_disk_counts_the_last_checkpoints_and_every_kth() -> None:
    """The 32B config keeps the last 5 and every 25th of 200 iterations: 13, not 200."""
    (line,) = plan_of("qwen2.5-32b-8gpu.yaml", [], peak_gib=62.0).sections["disk"]
    assert line.startswith("13 checkpoints"), line
    (line,) = plan_of("qwen2.5-32b-8gpu.yaml", ["train.keep_every=0"], 62.0).sections["disk"]
    assert line.startswith("5 checkpoints"), line
