"""The outbox: numbering, rendering, the resume journal, observers and delivery of a session's events."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from typing import Any

import pytest

from duplex_gateway.audio.stage import OutputStage
from duplex_gateway.engine import port
from duplex_gateway.host.observers import Observers
from duplex_gateway.host.outbox import Outbox
from duplex_gateway.host.resumption import Journal
from duplex_gateway.host.transport import Attachment
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.recording import NO_RECORDER
from duplex_gateway.ops.session_stats import SessionStats
from duplex_gateway.session.machine import Handshake, Session
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import SessionConfig

RATE = 24_000


class WireDialect:
    """Renders ``<seq> <type>``; has no form for ``rate_limits.updated`` (as some dialects have none)."""

    def parse(self, frame: Frame) -> Sequence[Command]:
        return ()

    def render(self, event: ev.ServerEvent, *, seq: int) -> Frame | None:
        return None if event.type == "rate_limits.updated" else f"{seq} {event.type}"

    def render_unsequenced(self, event: ev.ServerEvent) -> Frame:
        return event.type


class Socket:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def receive(self) -> MutableMapping[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send_text(self, data: str) -> None:
        self.sent.append(data)

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        pass


def _outbox(journal: Journal | None) -> Outbox:
    session = Session(
        session_id="sess_1",
        capabilities=port.EngineCapabilities(name="test", input_rate=RATE, output_rate=RATE),
        defaults=SessionConfig(turn_detection=None),
        handshake=Handshake.REALTIME,
    )
    return Outbox(
        session,
        WireDialect(),
        output=OutputStage(RATE),
        journal=journal,
        stats=SessionStats(GatewayMetrics("test"), started_at=0.0),
        recorder=NO_RECORDER,
        pacer=None,
    )


def _attach(outbox: Outbox) -> tuple[Attachment, Socket]:
    socket = Socket()
    outbox.attachment = Attachment(
        socket, high_water=100, stall_timeout_s=5.0, on_stalled=lambda: None, name="t"
    )
    return outbox.attachment, socket


async def _written(attachment: Attachment) -> None:
    await attachment.finish(None, 1.0)


async def test_events_are_numbered_in_order_and_journaled_for_a_resume() -> None:
    journal = Journal(max_events=100, max_bytes=100_000)
    outbox = _outbox(journal)
    attachment, socket = _attach(outbox)
    outbox.emit(ev.ResponseDone(response_id="resp_1", status="completed"))
    outbox.emit(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="x"))
    await asyncio.sleep(0)
    await _written(attachment)
    # response.done is followed by rate_limits.updated, which this dialect has no form for: it takes no number.
    assert socket.sent == ["1 response.done", "2 error"]
    assert journal.head == 2 and journal.after(1) == ["2 error"]


async def test_a_detached_session_journals_what_it_would_have_sent() -> None:
    journal = Journal(max_events=100, max_bytes=100_000)
    outbox = _outbox(journal)
    outbox.emit(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="missed"))
    attachment, socket = _attach(outbox)
    outbox.replay(attachment, 0)
    await asyncio.sleep(0)
    await _written(attachment)
    assert socket.sent == ["1 error"]


async def test_without_a_journal_nothing_is_kept_and_acks_trim_nothing() -> None:
    outbox = _outbox(None)
    attachment, socket = _attach(outbox)
    outbox.emit(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="x"))
    outbox.acknowledge(99)  # no journal: nothing to check the number against
    outbox.replay(attachment, 0)  # and nothing to replay
    await asyncio.sleep(0)
    await _written(attachment)
    assert socket.sent == ["1 error"]


async def test_an_ack_of_an_event_never_sent_is_refused() -> None:
    journal = Journal(max_events=100, max_bytes=100_000)
    outbox = _outbox(journal)
    outbox.emit(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="x"))
    outbox.acknowledge(1)
    assert journal.after(0) == []
    with pytest.raises(ProtocolError) as refused:
        outbox.acknowledge(2)
    assert refused.value.code is ErrorCode.INVALID_VALUE


async def test_observers_see_observed_events_only() -> None:
    outbox = _outbox(None)
    observers = outbox.observers = Observers(
        "sess_1", max_message_bytes=1 << 20, send_queue_size=100, send_timeout_s=1.0
    )
    watcher = Socket()
    watching = observers.attach(watcher, ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="hello"))
    assert watching is not None
    outbox.emit(ev.ErrorEvent(code=ErrorCode.INVALID_VALUE, message="seen"))
    outbox.emit_raw(ev.SessionClosing(reason="server_shutdown", grace_s=1.0), observed=False)
    await asyncio.sleep(0)
    await observers.finish(watching, "observer_left")
    assert len(watcher.sent) == 2 and all('"type":"error"' in sent.replace(" ", "") for sent in watcher.sent)


async def test_a_paced_frame_goes_to_the_socket_only_when_attached() -> None:
    outbox = _outbox(None)
    outbox.send_frame("dropped")  # detached: a paced frame is not journaled
    attachment, socket = _attach(outbox)
    outbox.send_frame("paced")
    await asyncio.sleep(0)
    await _written(attachment)
    assert socket.sent == ["paced"]
