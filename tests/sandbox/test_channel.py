"""The host's end of a kernel's channels, against a fake kernel's sockets (no real kernel).

Each test plays one thing a hostile kernel can send, and checks the host's bound holds: the
message is dropped and counted, later messages still arrive, and nothing is read past the
episode's byte budget or while no cell runs.

Run: python -m pytest tests/sandbox/test_channel.py
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from jupyter_client.session import Session

from sandbox.channel import MAX_FRAMES, ByteBudget, KernelChannels, Message, message_limit

LIMIT = 10_000  # bytes per message in these tests


@dataclass
class FakeKernel:
    """A kernel's iopub (PUB) and shell (ROUTER) sockets, driven by the test."""

    iopub: zmq.Socket[Any]
    shell: zmq.Socket[Any]
    session: Session

    def publish(self, msg_type: str, content: dict[str, Any], **kwargs: Any) -> None:
        self.session.send(self.iopub, msg_type, content, parent={"msg_id": "cell"}, **kwargs)

    def answer(self, msg_type: str = "kernel_info_reply", **content: Any) -> None:
        """Reply to the next shell request."""
        assert self.shell.poll(5000), "no request came"
        ident, *_ = self.shell.recv_multipart()
        self.session.send(self.shell, msg_type, content, parent={"msg_id": "cell"}, ident=ident)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[FakeKernel, KernelChannels]]:
    context = zmq.Context()
    urls = {name: f"ipc://{tmp_path}/{name}" for name in ("shell", "iopub", "control")}
    fake = FakeKernel(context.socket(zmq.PUB), context.socket(zmq.ROUTER), Session(key=b"k"))
    fake.iopub.bind(urls["iopub"])
    fake.shell.bind(urls["shell"])
    channels = KernelChannels(urls, Session(key=b"k"), LIMIT, ByteBudget(1_000_000))
    channels.open()
    try:
        yield fake, channels
    finally:
        channels.close()
        context.destroy(linger=0)


def receive_published(fake: FakeKernel, channels: KernelChannels, text: str) -> Message:
    """Publish `text` until the host receives it (a SUB misses what precedes its subscription)."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        fake.publish("stream", {"name": "stdout", "text": text})
        message = channels.receive(0.05)
        while message is not None and message.content.get("text") != text:
            message = channels.receive(0.05)
        if message is not None:
            return message
    raise AssertionError(f"{text!r} never arrived")


def test_a_message_within_the_limit_arrives_whole(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    message = receive_published(fake, channels, "hello")
    assert (message.channel, message.msg_type, message.parent_id) == ("iopub", "stream", "cell")
    assert channels.dropped == channels.resets == 0


def test_a_frame_over_the_limit_resets_the_channel_and_later_output_arrives(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    receive_published(fake, channels, "subscribed")
    fake.publish("stream", {"name": "stdout", "text": "x" * 10 * LIMIT})
    assert channels.receive(0.5) is None  # libzmq refused it before allocating it
    assert channels.resets == 1
    assert receive_published(fake, channels, "after").content["text"] == "after"


def test_frames_over_the_limit_together_are_dropped_and_counted(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    receive_published(fake, channels, "subscribed")
    fake.publish("stream", {"text": "a"}, buffers=[b"y" * (LIMIT // 4)] * 5)  # each frame fits
    fake.publish("stream", {"text": "b"}, buffers=[b"z"] * MAX_FRAMES)  # not a Jupyter message
    assert channels.receive(0.5) is None
    assert channels.dropped == 2
    assert receive_published(fake, channels, "after").content["text"] == "after"


def test_malformed_content_is_dropped_not_raised(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    receive_published(fake, channels, "subscribed")
    fake.iopub.send_multipart([b"topic", b"<IDS|MSG>", b"bad signature", b"{", b"{}", b"{}", b"{}"])
    fake.iopub.send_multipart([b"no delimiter at all"])
    assert channels.receive(0.5) is None
    assert channels.dropped == 2


def test_nothing_sent_while_closed_is_received(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    receive_published(fake, channels, "subscribed")
    channels.close()
    for _ in range(100):  # a thread left printing between cells
        fake.publish("stream", {"name": "stdout", "text": "between cells"})
    channels.open()
    message = receive_published(fake, channels, "next cell")
    assert message.content["text"] == "next cell"
    assert channels.receive(0.2) is None
    assert channels.budget.used < 10 * LIMIT  # the 100 messages were never read


def test_a_spent_budget_stops_output_but_not_replies(
    kernel: tuple[FakeKernel, KernelChannels],
) -> None:
    fake, channels = kernel
    receive_published(fake, channels, "subscribed")
    channels.budget.limit = channels.budget.used + 3 * LIMIT
    for _ in range(10):
        fake.publish("stream", {"name": "stdout", "text": "w" * (LIMIT // 2)})
    while channels.receive(0.2) is not None:
        pass
    assert channels.budget.spent and not channels.reading_output
    channels.send("kernel_info_request", {})
    fake.answer()
    reply = channels.receive(2)
    assert reply is not None and (reply.channel, reply.msg_type) == ("shell", "kernel_info_reply")


def test_the_message_limit_holds_what_the_kernel_may_send() -> None:
    # an error's message (half the cap) and traceback (the cap), at 6 bytes a character
    assert message_limit(20_000) >= 6 * (20_000 + 10_000) + 4096
