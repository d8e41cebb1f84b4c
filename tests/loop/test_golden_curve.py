"""The golden curve: 3 iterations of the synthetic training run, against recorded numbers.

    python -m pytest tests/loop/test_golden_curve.py -q          (about 10 s on 2 cores)

A change that should not alter numerics (a refactor, a move, a rename) must reproduce these
values: `loss/policy` and `rollout/reward_mean` of every iteration, and the learner/sampler
parity statistics `recompute/*`. The run is tests/loop/synthetic.py's (tiny Llama, hf
generator, real agent loop, LOO advantages, clipped PPO) with a generator batch of one, which
makes it bit-for-bit reproducible on one machine and independent of torch's thread count.
The numbers were recorded on x86-64 CPU with torch 2.x in float32; a different CPU family or a
torch upgrade may move the last digits of `recompute/*` (they are float noise of about 1e-6).
Record new values only for a change that is meant to alter the numerics, and say so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.loop.synthetic import run_synthetic

GOLDEN: list[dict[str, float]] = [
    {
        "loss/policy": 0.00204136676620692,
        "recompute/abs_logprob_diff_max": 1.6689300537109375e-05,
        "recompute/abs_logprob_diff_mean": 2.377181469152371e-06,
        "recompute/abs_prob_diff_max": 3.2916874512789462e-06,
        "recompute/abs_prob_diff_mean": 5.626350667805298e-07,
        "recompute/abs_prob_diff_p95": 2.4377436037559264e-06,
        "recompute/abs_prob_diff_p99": 3.175580340838979e-06,
        "recompute/ratio_max": 1.0000104904725051,
        "recompute/ratio_min": 0.9999833108387285,
        "recompute/tokens": 96.0,
        "rollout/reward_mean": 0.48958333333333337,
    },
    {
        "loss/policy": 0.0014515306102111936,
        "recompute/abs_logprob_diff_max": 1.0728836059570312e-05,
        "recompute/abs_logprob_diff_mean": 1.2383097782731056e-06,
        "recompute/abs_prob_diff_max": 1.5659538176726606e-06,
        "recompute/abs_prob_diff_mean": 4.0082768402575535e-07,
        "recompute/abs_prob_diff_p95": 1.397948668824256e-06,
        "recompute/abs_prob_diff_p99": 1.4738770175465319e-06,
        "recompute/ratio_max": 1.0000054836423544,
        "recompute/ratio_min": 0.9999892712214942,
        "recompute/tokens": 96.0,
        "rollout/reward_mean": 0.8854166666666669,
    },
    {
        "loss/policy": -0.0026738832821138203,
        "recompute/abs_logprob_diff_max": 7.450580596923828e-06,
        "recompute/abs_logprob_diff_mean": 1.0996203248699505e-06,
        "recompute/abs_prob_diff_max": 2.92424644471323e-06,
        "recompute/abs_prob_diff_mean": 4.1442221262303345e-07,
        "recompute/abs_prob_diff_p95": 1.4235635508175193e-06,
        "recompute/abs_prob_diff_p99": 2.568656921955735e-06,
        "recompute/ratio_max": 1.0000069141626966,
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
