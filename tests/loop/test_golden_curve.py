"""The golden curve: 3 iterations of the synthetic training run, against recorded numbers.

    python -m pytest tests/loop/test_golden_curve.py -q          (about 10 s on 2 cores)

A change that should not alter numerics (a refactor, a move, a rename) must reproduce these
values. The run is tests/loop/synthetic.py's (tiny Llama, hf generator, real agent loop, LOO
advantages, clipped PPO) with a generator batch of one, which makes it bit-for-bit
reproducible on one machine and independent of torch's thread count. Across machines only
some numbers are exact, so each kind is held to what it can promise:
- exact (==): `rollout/reward_mean` (fractions of tests passed: which tokens were sampled, and
  so every turn of every rollout, must be the same) and `recompute/tokens` (a count);
- `loss/policy` within LOSS_ABS (absolute): the loss is a sum of products of float32
  log-prob differences, so another CPU's kernels move its last digits (seen: 6.8e-8 between
  an Intel and an AMD EPYC machine, on losses of about 2e-3); a wrong mask, advantage or clip
  moves it by 1e-4 or more;
- the learner/sampler parity statistics `recompute/*` are float noise (about 1e-6 to 2e-5,
  different on each CPU model), so they are held to PARITY_BOUNDS, absolute: what a correct
  recompute cannot exceed in float32 on this model, far below what a real mismatch (another
  temperature, a shifted position, a stale weight) produces (1e-2 and more).
Record new values only for a change that is meant to alter the numerics, and say so. Last
recorded: the hf generator's prompts of several tasks view one prefix entry (losses and
rewards unchanged to the last bit on the recording machine).
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


LOSS_ABS = 1e-6
# recompute/* statistic -> the largest float-noise value a correct recompute may show
PARITY_BOUNDS = {
    "recompute/abs_logprob_diff_max": 1e-4,
    "recompute/abs_logprob_diff_mean": 1e-5,
    "recompute/abs_prob_diff_max": 2e-5,
    "recompute/abs_prob_diff_mean": 5e-6,
    "recompute/abs_prob_diff_p95": 1e-5,
    "recompute/abs_prob_diff_p99": 2e-5,
    "recompute/ratio_max": 1e-4,  # |ratio - 1|
    "recompute/ratio_min": 1e-4,
}
EXACT = ("rollout/reward_mean", "recompute/tokens")


def test_the_synthetic_run_reproduces_the_golden_curve(tmp_path: Path) -> None:
    records = run_synthetic(tmp_path, 3, max_batch_size=1)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    for iteration, (record, golden) in enumerate(zip(records, GOLDEN, strict=True)):
        recorded = sorted(k for k in record if k.startswith("recompute/"))
        assert recorded == sorted(k for k in golden if k.startswith("recompute/"))
        assert sorted(golden) == sorted([*EXACT, "loss/policy", *PARITY_BOUNDS])
        for key in EXACT:
            assert record[key] == golden[key], (iteration, key, record[key])
        assert record["loss/policy"] == pytest.approx(golden["loss/policy"], rel=0, abs=LOSS_ABS)
        for key, bound in PARITY_BOUNDS.items():
            noise = abs(record[key] - 1) if key.startswith("recompute/ratio") else record[key]
            assert 0 <= noise <= bound, (iteration, key, record[key])


def test_the_parity_bounds_hold_the_recorded_noise_with_room() -> None:
    """The bounds are not so tight that another CPU's noise trips them: at least 4x what was
    recorded, and at most 100x, so a real mismatch cannot hide under them."""
    for golden in GOLDEN:
        for key, bound in PARITY_BOUNDS.items():
            noise = abs(golden[key] - 1) if key.startswith("recompute/ratio") else golden[key]
            assert 4 * noise <= bound <= 100 * max(noise, 1e-7), (key, noise, bound)
