"""Unit tests of the output collector (pure; no kernel).

Run: python -m pytest tests/sandbox/test_output.py
"""

from __future__ import annotations

from sandbox.output import OutputCollector, clean_text, cut_text, truncation_notice


def test_streams_results_and_errors_keep_notebook_order() -> None:
    out = OutputCollector(max_chars=1000)
    out.add("stream", {"name": "stdout", "text": "hello\n"})
    out.add("stream", {"name": "stderr", "text": "warn\n"})
    out.add("display_data", {"data": {"text/plain": "<Figure>"}})
    out.add("execute_result", {"data": {"text/plain": "42"}})
    out.add("status", {"execution_state": "idle"})
    assert out.text() == "hello\nwarn\n<Figure>\n42\n"
    assert out.error is None


def test_error_sets_type_and_message_and_shows_traceback() -> None:
    out = OutputCollector(max_chars=1000)
    out.add(
        "error", {"ename": "KeyError", "evalue": "'x'", "traceback": ["Traceback", "KeyError: 'x'"]}
    )
    assert out.error == "KeyError: 'x'"
    assert out.text() == "Traceback\nKeyError: 'x'\n"


def test_output_past_the_limit_is_cut_with_the_dropped_count() -> None:
    out = OutputCollector(max_chars=10)
    out.add("stream", {"text": "0123456789abcdef"})
    out.add("stream", {"text": "ghij"})
    assert out.text() == "0123456789" + truncation_notice(10)
    assert out.kept == 10 and out.dropped == 10


def test_notes_follow_the_output_and_survive_truncation() -> None:
    out = OutputCollector(max_chars=3)
    out.add("stream", {"text": "abcdef"})
    out.note("cell interrupted")
    assert out.text() == "abc" + truncation_notice(3) + "\n[cell interrupted]"
    empty = OutputCollector(max_chars=3)
    empty.note("kernel died")
    assert empty.text() == "[kernel died]"


def test_rich_output_without_text_is_named() -> None:
    out = OutputCollector(max_chars=100)
    out.add("display_data", {"data": {"image/png": "iVBOR..."}})
    assert out.text() == "<image/png output>\n"


def test_clean_text_drops_ansi_and_control_characters() -> None:
    assert clean_text("\x1b[31mred\x1b[0m\x00\x07 ok\tx\r\nnext\rover") == "red ok\tx\nnext\nover"


def test_a_huge_error_line_is_cut_with_the_count() -> None:
    out = OutputCollector(max_chars=20)
    out.add("error", {"ename": "Exception", "evalue": "x" * 1000, "traceback": []})
    assert out.error == "Exception: " + "x" * 9 + "... [991 characters cut]"
    assert cut_text("short", 20) == "short"


def test_the_reply_gives_the_error_when_no_error_message_came() -> None:
    out = OutputCollector(max_chars=100)
    out.add_reply({"status": "error", "ename": "ValueError", "evalue": "bad"})
    assert out.error == "ValueError: bad"
    out.add_reply({"status": "error", "ename": "Other", "evalue": "ignored"})
    assert out.error == "ValueError: bad"  # the first error stands


def test_content_of_any_shape_is_taken_without_raising() -> None:
    out = OutputCollector(max_chars=100)
    out.add("display_data", {"data": "not a dict"})
    out.add("stream", {"text": 123})
    out.add("error", {"ename": 5, "traceback": "not a list"})
    assert out.text() == "1235: \n" and out.error == "5: "
