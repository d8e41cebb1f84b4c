"""The `hf` engine's token draw (loop/generators/hf/sampling.py): inverse transform of one uniform
per row. It must draw each token with its probability, never a token outside the top-p
nucleus, the same token for a row whatever rows stand beside it, and the argmax at
temperature 0.

Run: python -m pytest tests/loop/test_token_draw.py -q
"""

from __future__ import annotations

import math

import pytest
import torch

from loop.generators.base import SamplingParams
from loop.generators.hf.sampling import draw_tokens, pick_tokens, seeded_rng, top_p_logprobs


def test_draws_follow_the_distribution() -> None:
    probs = torch.tensor([0.5, 0.0, 0.3, 0.15, 0.05])
    n = 40_000
    weights = (probs * 3).expand(n, -1)  # any scale
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    counts = torch.bincount(draw_tokens(weights, uniforms), minlength=5).double()
    assert counts[1] == 0  # a zero-probability token has an empty interval
    expected = n * probs.double()
    seen = expected > 0
    chi2 = float((((counts - expected) ** 2)[seen] / expected[seen]).sum())
    assert chi2 < 18.5  # chi-square, 3 degrees of freedom: p = 0.0003


def test_the_two_level_search_equals_one_cumulative_sum() -> None:
    """Over a vocabulary of many blocks (and a partial last one), with zero-mass stretches, the
    drawn token is the one a single float64 cumulative sum over the whole row gives."""
    gen = torch.Generator().manual_seed(3)
    weights = torch.rand(200, 3000, generator=gen) ** 8  # peaked rows
    weights[:, 256:700] = 0.0  # whole blocks and parts of blocks without mass
    weights[::7, :] *= (torch.arange(3000) % 5 == 0).float()  # scattered zeros
    uniforms = torch.rand(200, generator=gen, dtype=torch.float64)
    cdf = weights.double().cumsum(-1)
    expected = torch.searchsorted(cdf, (uniforms * cdf[:, -1])[:, None], right=True).squeeze(1)
    drawn = draw_tokens(weights, uniforms)
    assert torch.equal(drawn, expected)
    assert bool((weights.gather(1, drawn[:, None]) > 0).all())


def test_the_interval_edges_pick_the_token_that_owns_them() -> None:
    weights = torch.tensor([[0.25, 0.0, 0.25, 0.5]]).expand(5, -1)
    uniforms = torch.tensor([0.0, 0.2499, 0.25, 0.5, 1.0 - 2**-53], dtype=torch.float64)
    # [0, .25) -> 0; token 1 has no mass; [.25, .5) -> 2; [.5, 1) -> 3, even for u next to 1
    assert draw_tokens(weights, uniforms).tolist() == [0, 0, 2, 3, 3]


def test_the_nucleus_bounds_every_draw() -> None:
    logits = torch.tensor([[4.0, 3.0, 1.0, 0.0, -1.0, -2.0]]).expand(300, -1)
    params = [
        SamplingParams(max_new_tokens=5, temperature=1.0, top_p=0.7, seed=s) for s in range(300)
    ]
    rngs = [seeded_rng(p.seed) for p in params]
    sampled: list[list[int]] = [[] for _ in params]
    logprobs: list[list[float]] = [[] for _ in params]
    pick_tokens(logits, params, rngs, sampled, logprobs, [None] * len(params))
    nucleus = top_p_logprobs(torch.log_softmax(logits[0], -1), 0.7)
    assert {row[0] for row in sampled} == {0, 1}  # 0.69 + 0.25 of the mass: the top two
    for row, values in zip(sampled, logprobs, strict=True):
        assert math.isclose(values[0], float(nucleus[row[0]]), rel_tol=1e-6)


def test_a_row_draws_the_same_alone_or_beside_others_and_greedy_takes_the_argmax() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 50) * 3

    def run(rows: list[int]) -> list[list[int]]:
        params = [
            SamplingParams(max_new_tokens=3, temperature=0.0 if row == 2 else 0.8, seed=row)
            for row in rows
        ]
        rngs = [seeded_rng(p.seed) for p in params]
        sampled: list[list[int]] = [[] for _ in rows]
        finish = [None] * len(rows)
        for _ in range(3):
            pick_tokens(logits[rows], params, rngs, sampled, [[] for _ in rows], finish)
        return sampled

    together = run([0, 1, 2, 3])
    assert [run([row])[0] for row in range(4)] == together
    assert together[2] == [int(logits[2].argmax())] * 3
    assert len({tuple(ids) for ids in together}) > 1  # the seeds differ, so do the draws


def test_non_finite_logits_are_refused_in_one_line() -> None:
    logits = torch.randn(3, 600)
    logits[1] = float("nan")
    params = [SamplingParams(max_new_tokens=4, temperature=1.0, seed=s) for s in range(3)]
    rngs = [seeded_rng(p.seed) for p in params]
    with pytest.raises(ValueError, match=r"non-finite next-token logits in rows \[1\] of 3"):
        pick_tokens(logits, params, rngs, [[], [], []], [[], [], []], [None] * 3)
