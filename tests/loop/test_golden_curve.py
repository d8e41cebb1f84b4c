"""The golden curve: 3 iterations of the synthetic training run, against recorded numbers.

    python -m pytest tests/loop/test_golden_curve.py -q          (about 10 s on 2 cores)

A change that should not alter numerics (a refactor, a move, a rename) must reproduce these
values: `loss/policy` and `rollout/reward_mean` of every iteration, and the learner/sampler
parity statistics `recompute/*`. The run is tests/loop/synthetic.py's (tiny Llama, hf
generator, real agent loop, LOO advantages, clipped PPO) with a generator batch of one, which
makes it bit-for-bit reproducible on one machine and independent of torch's thread count.
The numbers were recorded on x86-64 CPU with torch 2.x in float32; a different CPU family or a
torch upgrade may move the last digits of `recompute/*` (they are float noise of about 1e-6).
Record new values only for a change that is meant to alter the numerics, and say so. Last
recorded: the hf generator's prompts of several tasks view one prefix entry (the sampler's
float noise moved by up to 2e-6; losses and rewards unchanged to the last bit).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.loop.synthetic import run_synthetic

GOLDEN: list[dict[str, float]] = [
    {
        "loss/policy": 0.0020413606544025242,
        "recompute/abs_logprob_diff_max": 1.6570091247558594e-05,
        "recompute/abs_logprob_diff_mean": 2.38209031522274e-06,
        "recompute/abs_prob_diff_max": 3.1468271842471918e-06,
        "recompute/abs_prob_diff_mean": 5.631443810747466e-07,
        "recompute/abs_prob_diff_p95": 2.4477108309106654e-06,
        "recompute/abs_prob_diff_p99": 2.995616981872617e-06,
        "recompute/ratio_max": 1.0000100136304584,
        "recompute/ratio_min": 0.9999834300460356,
        "recompute/tokens": 96.0,
        "rollout/reward_mean": 0.48958333333333337,
    },
    {
        "loss/policy": 0.0014515371876768768,
        "recompute/abs_logprob_diff_max": 1.811981201171875e-05,
        "recompute/abs_logprob_diff_mean": 1.599042055507501e-06,
        "recompute/abs_prob_diff_max": 2.299841348363252e-06,
        "recompute/abs_prob_diff_mean": 5.039109948521403e-07,
        "recompute/abs_prob_diff_p95": 1.3649461527709406e-06,
        "recompute/abs_prob_diff_p99": 2.299841348363252e-06,
        "recompute/ratio_max": 1.000005006802695,
        "recompute/ratio_min": 0.9999818803521511,
        "recompute/tokens": 96.0,
        "rollout/reward_mean": 0.8854166666666669,
    },
    {
        "loss/policy": -0.0026738912565633655,
        "recompute/abs_logprob_diff_max": 1.0013580322265625e-05,
        "recompute/abs_logprob_diff_mean": 1.2543605407699943e-06,
        "recompute/abs_prob_diff_max": 2.9241990359141212e-06,
        "recompute/abs_prob_diff_mean": 4.468539026885526e-07,
        "recompute/abs_prob_diff_p95": 1.1126441788744668e-06,
        "recompute/abs_prob_diff_p99": 2.4797193915876413e-06,
        "recompute/ratio_max": 1.0000100136304584,
        "recompute/ratio_min": 0.9999925494471585,
        "recompute/tokens": 96.0,
        "rollout/reward_mean": 0.875,
    },
]


def test_the_synthetic_run_reproduces_the_golden_curve(tmp_path: Path) -> None:
    records = run_synthetic(tmp_path, 3, max_batch_size=1)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for iteration, (record, golden) in enumerate(zip(records, GOLDEN, strict=True)):
        recorded = {k: v for k, v in record.items() if k.startswith("recompute/")}
        assert sorted(recorded) == sorted(k for k in golden if k.startswith("recompute/"))
        for key, value in golden.items():
            assert record[key] == pytest.approx(value, rel=1e-6, abs=1e-12), (iteration, key)
