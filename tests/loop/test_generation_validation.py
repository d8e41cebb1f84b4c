"""Malformed answers from an OpenAI-compatible server are refused, each with its rule named.

A stub server on 127.0.0.1 answers whatever the test sets (`LyingServer.answer`); the real
`OpenAIGenerator` reads it over HTTP and must turn every malformed answer into an
`InvalidGenerationError` naming the server, the rule and the value (loop/generators/validate.py),
while a well-formed one passes with its ids and log-probs unchanged. Last, a lying server
played through the rollout collection on the synthetic word suite: its garbage rollout ends
`invalid_generation`, is excluded from the advantages and counted, and the others are trained.

Run: python -m pytest tests/loop/test_generation_validation.py -q   (fast; no model, no sandbox)
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from loop.algo.credit import assign_credit
from loop.config import AgentConfig
from loop.generators.base import InvalidGenerationError, SamplingParams
from loop.generators.openai import Mode, OpenAIGenerator
from loop.rollout.collect import RolloutJob, by_group, collect_rollouts
from loop.run.metrics import iteration_metrics
from tests.loop.conftest import EOS_ID, tiny_tokenizer
from tests.loop.synthetic import NoSandboxPool, WordSuite, code_word_tokenizer
from tests.loop.test_openai_generator import served

PARAMS = SamplingParams(max_new_tokens=16, stop_token_ids=(EOS_ID,))
IDS = [7, 8, 9, EOS_ID]
LOGPROBS = [-0.5, -1.25, -2.0, -0.125]
HELLO = [{"role": "user", "content": "hi"}]
Answer = dict[str, Any]


def well_formed(model: str = "m") -> Answer:
    """vLLM's token-mode answer: ids, `token_id:N` log-prob tokens, the text with the stop."""
    choice = {
        "index": 0,
        "text": "w7 w8 w9</s>",
        "token_ids": list(IDS),
        "logprobs": {"tokens": [f"token_id:{t}" for t in IDS], "token_logprobs": list(LOGPROBS)},
        "finish_reason": "stop",
    }
    return {"id": "cmpl-1", "object": "text_completion", "model": model, "choices": [choice]}


class LyingServer(ThreadingHTTPServer):
    """Answers every POST with `answer(request body)`; keeps the bodies."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.answer: Callable[[dict[str, Any]], Answer] = lambda body: well_formed(body["model"])
        self.bodies: list[dict[str, Any]] = []

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class Handler(BaseHTTPRequestHandler):
    server: LyingServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        data = json.dumps(self.server.answer(body)).encode()  # NaN and Infinity as JS writes them
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server() -> Iterator[LyingServer]:
    with served(LyingServer()) as stub:
        yield stub


def ask(server: LyingServer, answer: Answer, *, model: str = "m", mode: Mode = "completions"):
    """The Generation (or error) the client makes of `answer`, asking for `model`."""
    server.answer = lambda body: answer
    generator = OpenAIGenerator(server.base_url, model, tokenizer=tiny_tokenizer(), mode=mode)

    async def once():
        try:
            return await generator.generate([5, 6], PARAMS, messages=HELLO)
        finally:
            await generator.close()

    return asyncio.run(once())


def with_ids(ids: list[Any], text: str | None = None, logprobs: list[Any] | None = None) -> Answer:
    answer = well_formed()
    choice = answer["choices"][0]
    choice["token_ids"] = ids
    choice["logprobs"]["tokens"] = [f"token_id:{t}" for t in ids]
    choice["logprobs"]["token_logprobs"] = [-0.5] * len(ids) if logprobs is None else logprobs
    if text is not None:
        choice["text"] = text
    return answer


def with_logprobs(values: list[Any]) -> Answer:
    return with_ids(list(IDS), logprobs=values)


def with_choice(**fields: Any) -> Answer:
    answer = well_formed()
    answer["choices"][0].update(fields)
    return answer


def with_model(model: Any) -> Answer:
    answer = well_formed()
    if model is None:
        del answer["model"]
    else:
        answer["model"] = model
    return answer


def ended(ids: list[int], finish_reason: str) -> Answer:
    answer = with_ids(ids, " ".join(f"w{t}" for t in ids))
    answer["choices"][0]["finish_reason"] = finish_reason
    return answer


def token_strings(tokens: list[str]) -> Answer:
    """Ids given only as log-prob tokens (no `token_ids` field), one not written token_id:N."""
    answer = well_formed()
    del answer["choices"][0]["token_ids"]
    answer["choices"][0]["logprobs"]["tokens"] = tokens
    return answer


MALFORMED = {  # name: (answer, rule, the offending value the error carries)
    "id outside the vocabulary": (with_ids([7, 300, 9, EOS_ID], "w7 w8 w9"), "id_range", 300),
    "negative id": (with_ids([7, -1, 9, EOS_ID], "w7 w9"), "id_range", -1),
    "string id": (with_ids([7, "8", 9, EOS_ID]), "id_type", "8"),
    "float id": (with_ids([7, 8.0, 9, EOS_ID]), "id_type", 8.0),
    "bool id": (with_ids([7, True, 9, EOS_ID]), "id_type", True),
    "id token not token_id:N": (
        token_strings(["token_id:7", "token_id:-8", "token_id:9", "token_id:2"]),
        "id_type",
        "token_id:-8",
    ),
    "text other than the ids": (with_choice(text="w7 w8 w10</s>"), "text", "w7 w8 w10</s>"),
    "text with more than the ids": (with_choice(text="w7 w8 w9 w9"), "text", "w7 w8 w9 w9"),
    "positive log-prob": (with_logprobs([-0.5, 5.0, -2.0, -0.1]), "logprob_value", 5.0),
    "bool log-prob": (with_logprobs([-0.5, False, -2.0, -0.1]), "logprob_value", False),
    "string log-prob": (with_logprobs([-0.5, "-1", -2.0, -0.1]), "logprob_value", "-1"),
    "NaN log-prob": (with_logprobs([-0.5, math.nan, -2.0, -0.1]), "logprob_value", math.nan),
    "inf log-prob": (with_logprobs([-0.5, math.inf, -2.0, -0.1]), "logprob_value", math.inf),
    "-inf log-prob": (with_logprobs([-0.5, -math.inf, -2.0, -0.1]), "logprob_value", -math.inf),
    "log-prob past a float": (with_logprobs([-0.5, 10**400, -2.0, -0.1]), "logprob_value", 10**400),
    "log-prob below a float": (
        with_logprobs([-0.5, -(10**400), -2.0, -0.1]),
        "logprob_value",
        -(10**400),
    ),
    "too few log-probs": (with_logprobs([-0.5, -1.0, -2.0]), "logprob_count", 3),
    "too many log-probs": (with_logprobs([-0.5] * 5), "logprob_count", 5),
    "no log-probs": (with_choice(logprobs=None), "logprob_count", 0),
    "more tokens than max_new_tokens": (with_ids([7] * 500 + [EOS_ID], "w7 " * 500), "length", 501),
    "stop without a stop id": (ended([7, 8, 9], "stop"), "finish_reason", "stop"),
    "length before the limit": (ended([7, 8, 9], "length"), "finish_reason", "length"),
    "ids that are no list": (with_choice(token_ids={"0": 7}), "id_type", {"0": 7}),
    "text that is no string": (with_choice(text=7), "text", 7),
    "log-probs of the wrong shape": (with_choice(logprobs="-0.5"), "shape", None),
    "another model": (with_model("other-adapter"), "model", "other-adapter"),
    "no model": (with_model(None), "model", None),
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_a_malformed_answer_is_refused_with_its_rule(server: LyingServer, name: str) -> None:
    answer, rule, value = MALFORMED[name]
    with pytest.raises(InvalidGenerationError) as caught:
        ask(server, answer)
    error = caught.value
    assert error.rule == rule and error.server == server.base_url, str(error)
    assert error.value == value or (value != value and error.value != error.value)  # NaN
    assert f"({rule})" in str(error) and server.base_url in str(error)


def test_a_well_formed_answer_passes_with_the_text_its_ids_print(server: LyingServer) -> None:
    result = ask(server, well_formed())
    assert (result.token_ids, result.logprobs) == (IDS, LOGPROBS)
    assert all(type(t) is int for t in result.token_ids)
    assert (result.finish_reason, result.prompt_as) == ("stop", "token_ids") and result.token_exact
    assert result.text == "w7 w8 w9"  # the ids decoded as the hf backend decodes them


@pytest.mark.parametrize(
    "variant",
    [
        {"text": "w7 w8 w9"},  # vLLM leaves a stop id's text out
        {"text": "w7 w8 w9 </s>"},  # spaces between special tokens
        {"text": "w7 w8 w9</s>", "logprobs": {"token_logprobs": [-0.5, 5e-5, -2.0, 0]}},
    ],
)
def test_what_detokenisers_and_rounding_differ_by_passes(server: LyingServer, variant) -> None:
    result = ask(server, with_choice(**variant))
    assert result.token_ids == IDS and result.text == "w7 w8 w9"


def test_the_answer_may_name_a_dated_snapshot_of_the_model(server: LyingServer) -> None:
    assert ask(server, with_model("gpt-4o-2024-08-06"), model="gpt-4o").token_ids == IDS
    with pytest.raises(InvalidGenerationError, match=r"\(model\)"):
        ask(server, with_model("gpt-4o-mini"), model="gpt-4o")


def test_chat_answers_are_held_to_the_same_rules(server: LyingServer) -> None:
    content = [{"token": f"token_id:{t}", "logprob": p} for t, p in zip(IDS, LOGPROBS, strict=True)]
    content[1]["logprob"] = 5.0
    choice = {"message": {"content": "w7 w8 w9"}, "logprobs": {"content": content}}
    answer = {"model": "m", "choices": [choice | {"finish_reason": "stop"}]}
    with pytest.raises(InvalidGenerationError, match=r"\(logprob_value\)"):
        ask(server, answer, mode="chat")
    content[1]["logprob"] = -1.25
    assert ask(server, answer, mode="chat").logprobs == LOGPROBS
    with pytest.raises(InvalidGenerationError, match=r"\(model\)"):
        ask(server, answer | {"model": "another"}, mode="chat")


# -- a lying server cannot get a garbage rollout trained on -----------------------------------


def honest_or_garbage(tokenizer: Any, garbage_seed: int) -> Callable[[dict[str, Any]], Answer]:
    """Words w10 w20 and the stop id, truthfully; the request seeded `garbage_seed` gets ids
    past the vocabulary with positive log-probs, under a text that pays (low words)."""

    def answer(body: dict[str, Any]) -> Answer:
        ids = [10, 20, body["stop_token_ids"][0]]
        logprobs: list[float] = [-0.5, -0.5, -0.5]
        text = tokenizer.decode(ids)
        if body["seed"] == garbage_seed:
            ids, logprobs = [10, 99_999, body["stop_token_ids"][0]], [-0.5, 5.0, -0.5]
        choice = {"text": text, "token_ids": ids, "finish_reason": "stop",
                  "logprobs": {"token_logprobs": logprobs}}  # fmt: skip
        return {"model": body["model"], "choices": [choice]}

    return answer


def test_a_lying_server_cannot_get_a_garbage_rollout_trained(server: LyingServer) -> None:
    tokenizer, suite = code_word_tokenizer(), WordSuite()
    task = suite.tasks("train")[0]
    jobs = [RolloutJob(task, k, seed=100 * k) for k in range(4)]
    server.answer = honest_or_garbage(tokenizer, garbage_seed=100)  # rollout k=1
    generator = OpenAIGenerator(server.base_url, "policy", tokenizer=tokenizer)
    settings = AgentConfig(max_turns=1, max_new_tokens=6, max_context_tokens=4000)

    async def collect():
        try:
            return await collect_rollouts(
                jobs, suite=suite, pool=NoSandboxPool(), generator=generator,
                tokenizer=tokenizer, settings=settings, example=[], max_concurrent=4,
            )  # fmt: skip
        finally:
            await generator.close()

    trajs = asyncio.run(collect())
    bad = trajs[1]
    assert bad.status == "invalid_generation" and bad.infra_failure
    assert bad.error and "(id_range)" in bad.error and "99999" in bad.error
    assert server.base_url in bad.error
    assert not any(bad.is_output) and bad.reward is None  # nothing of it reached the tokens
    assert [t.status for t in trajs[:1] + trajs[2:]] == ["ok"] * 3
    assert all(t.reward == 1.0 and t.token_exact for t in trajs[:1] + trajs[2:])
    groups = by_group(trajs)
    credit = assign_credit(groups, method="loo", reward="fraction", threshold=0.0)
    assert credit.present == [True, False, True, True] and credit.excluded == 1
    assert not credit.keep[1]
    metrics = iteration_metrics(groups, credit, 0, [], credit.keep)
    assert metrics["rollout/status/invalid_generation"] == 1
    assert metrics["rollout/infra_failures"] == 1
