"""Demonstrations: gold solutions played as agent episodes through the real loop and sandbox.

A demonstration must be exactly what a rollout of the same task would be: the prompt is the
episode's encoded opening messages, each turn's output span decodes to the scripted message and
ends with the template's stop id, `is_output` marks exactly those spans, and the environment's
own tests give it reward 1.0. Replaying its messages gives the same tokens and the same score.

Run: python -m pytest tests/loop/test_demos.py -q     (about a minute on 2 cores)
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import pytest

from loop.config import AgentConfig
from loop.demos import (
    PAPER_OBSERVATION,
    DemonstrationError,
    Mistake,
    assistant_messages,
    demo_settings,
    describe,
    episode_cells,
    gold_scripts,
    naming_words,
    play,
    statements,
)
from loop.rollout.agent import encode_prompt
from loop.rollout.prompt import build_messages
from sandbox import KernelPool

pytestmark = pytest.mark.slow
SETTINGS = AgentConfig(max_turns=2, max_new_tokens=400, max_context_tokens=4096)


@pytest.fixture(scope="module")
def pool() -> Iterator[KernelPool]:
    with KernelPool(size=2, timeout_s=10) as kernel_pool:
        yield kernel_pool


def run(scripts: list, suite: Any, pool: KernelPool, tokenizer: Any, **kwargs: Any) -> list:
    return asyncio.run(play(
        scripts, suite=suite, pool=pool, tokenizer=tokenizer,
        settings=demo_settings(SETTINGS, scripts), example=[], max_concurrent=2, **kwargs,
    ))  # fmt: skip


def test_gold_demonstrations_are_token_exact_episodes_that_score_1(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    tasks = [suite.task("music_count_playlists_5"), suite.task("phone_add_contact_1")]
    scripts = [(task, gold_scripts(suite, task)) for task in tasks]
    demos = run(scripts, suite, pool, tokenizer)
    stop = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for demo, task in zip(demos, tasks, strict=True):
        assert demo.status == "ok" and demo.reward == 1.0 and demo.success, demo.task_id
        assert len(demo.turns) == len(suite.gold_solution(task))  # one turn per gold cell
        opening = demo.messages[:3]  # system, instructions, the task (no worked example here)
        context = opening[2]["content"].split("\n\n", 1)[1]
        assert task.instruction in context and opening == build_messages(context, [])
        assert demo.tokens[: demo.prompt_length] == encode_prompt(tokenizer, opening)
        sampled = set()
        for turn, cell in zip(demo.turns, episode_cells(suite.gold_solution(task)), strict=True):
            span = demo.tokens[turn.output_start : turn.output_end]
            assert span[-1] == stop  # the stop id is part of the demonstration, as sampled
            assert tokenizer.decode(span, skip_special_tokens=True) == turn.text
            assert turn.code == cell.strip("\n") and turn.text.index("```python") > 0
            sampled |= set(range(turn.output_start, turn.output_end))
        assert {i for i, out in enumerate(demo.is_output) if out} == sampled
        assert all(math.isnan(x) for x in demo.sampler_logprobs)  # no sampler: no log-probs
    last = demos[0].turns[-1].text  # a question: the last thought quotes the printed answer
    answer = demos[0].turns[-2].observation
    assert f"The output is {answer}, which answers the task." in last


def test_a_replayed_demonstration_is_identical_and_scores_1(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    task = suite.task("email_count_from_sender_2")
    [demo] = run([(task, gold_scripts(suite, task))], suite, pool, tokenizer)
    [again] = run([(task, assistant_messages(demo))], suite, pool, tokenizer)
    assert again.tokens == demo.tokens and again.is_output == demo.is_output
    assert again.reward == 1.0


def test_the_papers_variant_shows_execution_successful_and_still_solves(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    task = suite.task("payments_balance_1")
    scripts = gold_scripts(suite, task, "paper")
    assert len(scripts) > len(suite.gold_solution(task))  # one message per statement
    [demo] = run([(task, scripts)], suite, pool, tokenizer, paper_observations=True)
    assert demo.reward == 1.0
    assert {t.observation for t in demo.turns[:-1]} == {PAPER_OBSERVATION}


def test_the_careful_variant_reads_the_doc_recovers_and_trains_only_the_recovery(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    reads, recovers = suite.task("music_like_song_10"), suite.task("payments_balance_10")
    plain = {t.id: len(gold_scripts(suite, t)) for t in (reads, recovers)}
    scripts = [(t, gold_scripts(suite, t, "careful")) for t in (reads, recovers)]
    assert [len(m) for _, m in scripts] == [plain[reads.id] + 1, plain[recovers.id] + 2]
    assert not any(isinstance(m, Mistake) for m in scripts[0][1])
    assert isinstance(scripts[1][1][1], Mistake) and "payments.get_balance" in scripts[1][1][1]
    reading, recovering = run(scripts, suite, pool, tokenizer)
    for demo in (reading, recovering):
        assert demo.reward == 1.0 and demo.success, demo.task_id  # the same final state
    doc = reading.turns[1]
    assert 'show_api_doc(app_name="music", api_name="search_songs")' in doc.code
    assert doc.error is None and "search_songs" in doc.observation
    wrong, read = recovering.turns[1], recovering.turns[2]
    assert wrong.error is not None and "get_balance" in wrong.observation  # it failed, shown
    assert "That call failed" in read.text and "show_balance" in read.code
    untrained = range(wrong.output_start, wrong.output_end)
    assert not any(recovering.is_output[i] for i in untrained)  # seen, never trained
    assert all(recovering.is_output[i] for i in range(read.output_start, read.output_end))


def test_the_lookup_variant_lists_each_apps_apis_then_reads_the_chosen_ones_doc(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    task = suite.task("payments_remind_roommates_1")  # phone, then payments
    plain = gold_scripts(suite, task)
    messages = gold_scripts(suite, task, "lookup")
    mistakes = [m for m in messages if isinstance(m, Mistake)]
    assert mistakes and len(mistakes) < 2  # this task guesses wrong for phone only
    # per app: a list and a documentation read, a wrong guess first in some (task, app) pairs
    assert len(messages) == len(plain) + 2 * 2 + len(mistakes)
    [demo] = run([(task, messages)], suite, pool, tokenizer)
    assert demo.reward == 1.0 and demo.success  # the same final state as the gold solution
    codes = [turn.code for turn in demo.turns]
    for app, api in (("phone", "search_contacts"), ("payments", "show_sent_payment_requests")):
        listed = codes.index(f'print(apis.api_docs.show_api_descriptions(app_name="{app}"))')
        read = demo.turns[listed + 1]
        assert f'show_api_doc(app_name="{app}", api_name="{api}")' in read.code
        assert api in demo.turns[listed].observation  # the name is copied from the list
        assert f"{app}.{api} is the API for this step" in read.text
        before = [c for t in demo.turns[:listed] for c in t.api_calls if c["app"] == app]
        assert all(c["api"] == "login" or not c["ok"] for c in before)  # a guess at most
    for turn in demo.turns:  # each wrong guess failed, was shown and not trained on
        if turn.code.startswith("print(apis.") and "api_docs" not in turn.code:
            assert turn.error is not None
            assert not any(demo.is_output[turn.output_start : turn.output_end])
    careful = gold_scripts(suite, task, "careful")  # one read, for the first app only
    assert sum("show_api_doc(" in m for m in careful if isinstance(m, str)) == 1


def test_a_careful_wrong_call_that_succeeds_is_refused(
    suite: Any, pool: KernelPool, tokenizer: Any
) -> None:
    task = suite.task("payments_balance_10")
    messages = gold_scripts(suite, task, "careful")
    messages[1] = Mistake(messages[3])  # a "wrong" call that is the right one
    with pytest.raises(DemonstrationError, match="wrong call did not fail"):
        run([(task, messages)], suite, pool, tokenizer)


def test_statements_keep_loops_whole_and_use_comments_as_thoughts() -> None:
    cell = "# read the balance\nx = 1\nfor i in range(3):\n    x += i\n\nprint(x)"
    steps = statements(cell)
    assert [code for _, code in steps] == ["x = 1", "for i in range(3):\n    x += i", "print(x)"]
    assert steps[0][0] == "read the balance"
    assert describe("apis.supervisor.complete_task(answer=len(songs))").endswith(
        "`len(songs)`, so I pass it to complete_task."
    )
    assert "log in to music" in describe('apis.music.login(username="a", password="b")')


def test_a_helper_is_written_in_the_turn_that_first_uses_it() -> None:
    helper = "def pages(api):\n    return api()"
    cells = [f"x = 1\n\n{helper}\n\nlogin()", "y = 2", "items = pages(apis.a.b)\nprint(items)"]
    moved = episode_cells(cells)
    assert moved == [
        "x = 1\n\nlogin()",
        "y = 2",
        f"{helper}\n\nitems = pages(apis.a.b)\nprint(items)",
    ]
    assert episode_cells(["def unused():\n    pass\nz = 3"]) == ["z = 3"]  # used nowhere: dropped
    kept = ["def f():\n    return 1\nprint(f())"]  # used where it is defined: stays
    assert episode_cells(kept) == kept
    assert "every page of music.show_playlists" in describe(
        moved[2].replace("a.b", "music.show_playlists")
    )


def test_the_lookup_choice_quotes_the_words_that_name_the_api(suite: Any) -> None:
    """What ties a task to one name in an app's API list: the name's words the task says."""
    assert naming_words("show_liked_songs", "How many songs have I liked?") == ["liked", "songs"]
    assert naming_words("search_contacts", "Add Ann as a contact") == ["contacts"]  # singular
    assert naming_words("show_balance", "How much money do I have?") == []
    messages = gold_scripts(suite, suite.task("music_count_playlists_10"), "lookup")
    said = 'The task says "playlists": music.show_playlists is the API for this step'
    assert any(isinstance(m, str) and said in m for m in messages)


def test_a_read_fraction_reads_in_that_share_of_the_pairs_and_plays_the_rest_straight(
    suite: Any,
) -> None:
    """`warm_start.read_fraction`: a policy that reads sometimes, so that RL can find where
    reading pays; the pairs that do not read are the `episode` style's turns unchanged."""
    tasks = suite.tasks("easy") + suite.tasks("lookup_warm")

    def reads(fraction: float) -> list[int]:
        counts = []
        for task in tasks:
            messages = gold_scripts(suite, task, "lookup", read_fraction=fraction)
            counts.append(
                sum(isinstance(m, str) and "show_api_descriptions(" in m for m in messages)
            )
        return counts

    everyone, half, none = reads(1.0), reads(0.5), reads(0.0)
    assert all(n >= 1 for n in everyone) and not any(none)
    assert all(h <= e for h, e in zip(half, everyone, strict=True))
    assert 0.35 < sum(half) / sum(everyone) < 0.65  # a stable hash: about half the pairs

    def texts(
        task: Any, *style: Any, **fraction: float
    ) -> list[str]:  # the last thought: a function
        return [
            m if isinstance(m, str) else "" for m in gold_scripts(suite, task, *style, **fraction)
        ]

    for task in tasks:
        assert texts(task, "lookup", read_fraction=0.0) == texts(task)
        assert texts(task, "lookup", read_fraction=1.0) == texts(task, "lookup")
