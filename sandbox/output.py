"""What the agent sees of one cell: Jupyter iopub messages turned into bounded, printable text.

The order is the notebook's: stdout and stderr as they stream, display outputs, the repr of a
trailing expression, then a traceback. ANSI escapes and other control characters are dropped
(binary output must not reach a tokenizer raw), and past `max_chars` the text is cut with a
visible notice saying how much was left out. The error line ("ExceptionType: message") is cut
at `max_chars` too, with the count of characters cut, so a huge exception message cannot
bloat the rollout record.

Two layers keep this bounded. The kernel stops sending past the same limit
(`sandbox/kernel_boot.py`: output, and error messages and tracebacks) and reports only how much
it dropped, as a display message of type DROPPED_MIME that is counted here, never shown. That
layer is agent-reachable, so the guarantee is the host's: every message is size-checked as it
is received (`sandbox/channel.py`), and this collector keeps at most `max_chars` of it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # keeps \t and \n
DROPPED_MIME = "application/x-loop-dropped"  # the kernel's count of characters it did not send


def clean_text(text: str) -> str:
    """Printable text: no ANSI escapes, carriage returns as newlines, no control characters."""
    text = ANSI.sub("", text).replace("\r\n", "\n").replace("\r", "\n")
    return CONTROL.sub("", text)


def truncation_notice(dropped: int) -> str:
    """The line appended when output was cut."""
    return f"\n[output truncated: {dropped} more characters not shown]"


def loss_notes(dropped: int, resets: int, *, message_limit: int) -> list[str]:
    """Notices of what the host dropped from the kernel during a cell (sandbox/channel.py)."""
    limit = f"{message_limit:,} bytes"
    notes = []
    if dropped:
        notes.append(f"{dropped} message(s) from the kernel dropped: over {limit} or malformed")
    if resets:
        notes.append(
            f"the kernel sent a message over {limit}: its channel was reset {resets} time(s) "
            "and output sent meanwhile is lost"
        )
    return notes


def budget_notice(output_mb: int) -> str:
    """The notice of every cell once the episode's output budget is spent."""
    return (
        f"the kernel has sent the {output_mb} MiB the host reads in one episode: its output is "
        "no longer shown"
    )


def cut_text(text: str, limit: int) -> str:
    """`text` if at most `limit` characters, else its first `limit` and how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} characters cut]"


@dataclass
class OutputCollector:
    """Accumulates one cell's iopub messages into at most `max_chars` characters of text."""

    max_chars: int
    parts: list[str] = field(default_factory=list)
    kept: int = 0
    dropped: int = 0
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    def add(self, msg_type: str, content: dict[str, Any]) -> None:
        """Take one iopub message of the cell (others, like status, are ignored). Its content is
        the kernel's, so untrusted: any JSON shape is taken without raising."""
        if msg_type == "stream":
            self._append(str(content.get("text", "")))
        elif msg_type in ("execute_result", "display_data"):
            data = content.get("data")
            data = data if isinstance(data, dict) else {}
            if DROPPED_MIME in data:
                count = str(data[DROPPED_MIME])
                self.dropped += int(count) if count.isdigit() and len(count) < 19 else 0
                return
            text = data.get("text/plain")
            if text is None and data:
                text = f"<{', '.join(sorted(data))} output>"
            if text is not None:
                self._append(_ensure_newline(str(text)))
        elif msg_type == "error":
            self.error = self._error_line(content)
            traceback = content.get("traceback", [])
            traceback = "\n".join(map(str, traceback)) if isinstance(traceback, list) else ""
            self._append(_ensure_newline(traceback or self.error))

    def add_reply(self, content: dict[str, Any]) -> None:
        """Take the cell's execute_reply: its error counts when no error message came."""
        if content.get("status") == "error" and self.error is None:
            self.error = self._error_line(content)

    def note(self, text: str) -> None:
        """Add a notice of ours (timeout, crash): shown after the output, never truncated away."""
        self.notes.append(text)

    def text(self) -> str:
        """The cell's output as the agent reads it."""
        out = "".join(self.parts)
        if self.dropped:
            out += truncation_notice(self.dropped)
        for note in self.notes:
            out = f"{_ensure_newline(out)}[{note}]" if out else f"[{note}]"
        return out

    def _error_line(self, content: dict[str, Any]) -> str:
        line = f"{content.get('ename', 'Error')}: {content.get('evalue', '')}"
        return cut_text(line, self.max_chars)

    def _append(self, text: str) -> None:
        text = clean_text(text)
        room = self.max_chars - self.kept
        if len(text) > room:
            self.dropped += len(text) - max(room, 0)
            text = text[: max(room, 0)]
        if text:
            self.parts.append(text)
            self.kept += len(text)


def _ensure_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"
