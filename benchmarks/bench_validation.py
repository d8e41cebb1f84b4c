"""What checking a server's answer costs (loop/generators/validate.py), per generation.

Run: python benchmarks/bench_validation.py            (about 30 s on 2 cores)
     python benchmarks/bench_validation.py --generations 50 --tokens 500   (a shorter pass)

N realistic generations of T tokens each (slices of this repository's Python source, tokenised
with SmolLM2-135M-Instruct's tokenizer, 49,152 ids, ending in its EOS as a stop id, with
log-probs), as vLLM's token mode answers them (JSON). Measured per generation, medians over
`--repeats` passes: reading the answer's JSON (what the client paid before the checks), the
checks without a tokenizer (ids' types and range, log-probs, length, finish reason), and with
one (plus decoding the ids and comparing the text). The share of a turn's decode time uses the
decode steps measured in benchmarks/README.md: 34.3 ms a step at 32 rows on an H100 (the hf
engine, Qwen2.5-7B) and 231 ms a step at 24 rows on 2 CPU cores (the quickstart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformers import AutoTokenizer

from loop.generators.base import SamplingParams
from loop.generators.tokenizer import special_texts
from loop.generators.validate import Answer, Vocabulary, check_answer
from loop.model.aliases import resolve_model

ROOT = Path(__file__).resolve().parents[1]
DECODE_STEPS = {  # (seconds a decode step, rows a step): benchmarks/README.md
    "H100, 7B, 32 rows": (34.3e-3, 32),
    "2 CPU cores, quickstart, 24 rows": (231e-3, 24),
}


def answers(tokenizer, count: int, tokens: int) -> list[str]:
    """`count` answer bodies of `tokens` ids each, the last one EOS, as JSON."""
    source = "\n".join(p.read_text() for p in sorted((ROOT / "loop").rglob("*.py")))
    ids = tokenizer.encode(source, add_special_tokens=False)
    step = max(1, (len(ids) - tokens) // count)
    bodies = []
    for n in range(count):
        sampled = [*ids[n * step : n * step + tokens - 1], tokenizer.eos_token_id]
        text = tokenizer.decode(sampled)
        logprobs = [-0.25 - (i % 7) / 10 for i in sampled]
        choice = {"text": text, "token_ids": sampled, "finish_reason": "stop"}
        choice["logprobs"] = {"token_logprobs": logprobs}
        bodies.append(json.dumps({"model": "policy", "choices": [choice]}))
    return bodies


def per_generation(work, bodies: list[str], repeats: int) -> float:
    """Median seconds of `work(body)` per generation over `repeats` passes of every body."""
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        for body in bodies:
            work(body)
        passes.append((time.perf_counter() - start) / len(bodies))
    return statistics.median(passes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generations", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    vocab = Vocabulary.of(tokenizer, special_texts(tokenizer))
    params = SamplingParams(args.tokens, stop_token_ids=(tokenizer.eos_token_id,))
    bodies = answers(tokenizer, args.generations, args.tokens)
    parsed = {body: json.loads(body)["choices"][0] for body in bodies}

    def check(body: str, with_vocab: Vocabulary | None) -> None:
        choice = parsed[body]
        logprobs = choice["logprobs"]["token_logprobs"]
        answer = Answer("bench", choice["text"], choice["token_ids"], logprobs, "stop")
        check_answer(answer, params, with_vocab, server_stops=False)

    figures = {
        "reading the JSON answer (before)": per_generation(json.loads, bodies, args.repeats),
        "checks without a tokenizer": per_generation(
            lambda b: check(b, None), bodies, args.repeats
        ),
        "checks with the tokenizer (decode + text)": per_generation(
            lambda b: check(b, vocab), bodies, args.repeats
        ),
    }
    print(f"{args.generations} generations of {args.tokens} tokens, {args.repeats} passes")
    for name, seconds in figures.items():
        print(f"  {name:44s} {seconds * 1e6:9.1f} us a generation")
    full = figures["checks with the tokenizer (decode + text)"]
    for machine, (step_s, rows) in DECODE_STEPS.items():
        turn_s = step_s * args.tokens
        print(
            f"  share of a turn's decode on {machine}: {full / turn_s:.2e} of the turn's "
            f"{turn_s:.1f} s wall, {full / (turn_s / rows):.2e} of its {turn_s / rows:.2f} s "
            "of engine time per row"
        )


if __name__ == "__main__":
    main()
