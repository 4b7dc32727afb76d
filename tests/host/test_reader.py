"""The read loop against a fake host: how a socket's time ends, and what it asks of its host."""

from __future__ import annotations

import asyncio
from collections.abc import MutableMapping, Sequence
from typing import Any

from duplex_gateway.config import load_settings
from duplex_gateway.dialects.realtime import RealtimeDialect
from duplex_gateway.engine import port
from duplex_gateway.host.closing import Failure
from duplex_gateway.host.reader import Outcome, Reader
from duplex_gateway.host.transport import Attachment
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.recording import NO_RECORDER
from duplex_gateway.ops.session_stats import SessionStats
from duplex_gateway.session.machine import Handshake, Output, Session, UpdateEngine
from duplex_gateway.vocabulary.commands import SessionResume
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.session_config import SessionConfig

RATE = 24_000


class Socket:
    """Hands out ``messages``, then waits for ever (a client that went quiet)."""

    def __init__(self, *messages: MutableMapping[str, Any]) -> None:
        self.messages = list(messages)

    async def receive(self) -> MutableMapping[str, Any]:
        if self.messages:
            return self.messages.pop(0)
        await asyncio.Event().wait()
        return {}

    async def send_text(self, data: str) -> None:
        pass

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        pass


class Host:
    """Records what the reader asks of it."""

    def __init__(self, deadline: float = 1e12) -> None:
        self.closed_by_server = False
        self.deadline = deadline
        self.applied: list[Sequence[Output]] = []
        self.errors: list[ProtocolError] = []
        self.expired: list[Failure] = []
        self.failed: list[Failure] = []

    def apply(self, outputs: Sequence[Output]) -> None:
        self.applied.append(outputs)

    def send_error(self, exc: ProtocolError) -> None:
        self.errors.append(exc)

    def fail(self, failure: Failure, message: str, *, param: str | None = None) -> None:
        self.failed.append(failure)

    def expire(self, failure: Failure, message: str) -> None:
        self.expired.append(failure)
        self.closed_by_server = True

    def delegate(self) -> None:
        pass

    async def hand_over(self, command: SessionResume) -> bool:
        return False

    async def open_engine(self, config: SessionConfig) -> None:
        pass

    async def engine_caught_up(self) -> None:
        pass


def _reader(host: Host, **limits: Any) -> Reader:
    settings = load_settings(None, **{f"limits.{key}": value for key, value in limits.items()})
    session = Session(
        session_id="sess_1",
        capabilities=port.EngineCapabilities(name="test", input_rate=RATE, output_rate=RATE),
        defaults=SessionConfig(turn_detection=None),
        handshake=Handshake.REALTIME,
    )
    dialect = RealtimeDialect(session_id="sess_1", beta=False, duplex=False, max_message_bytes=1 << 20)
    return Reader(
        host,
        session,
        dialect,
        limits=settings.limits,
        input_rate=RATE,
        vad=None,
        stats=SessionStats(GatewayMetrics("test"), started_at=0.0),
        recorder=NO_RECORDER,
        pacer=None,
    )


def _attachment(socket: Socket) -> Attachment:
    return Attachment(socket, high_water=100, stall_timeout_s=5.0, on_stalled=lambda: None, name="t")


async def test_a_client_that_closes_on_purpose_is_done_and_one_that_drops_may_come_back() -> None:
    for code, outcome, why in [
        (1000, Outcome.CLOSED, "client_closed"),
        (1006, Outcome.DROPPED, "client_dropped"),
    ]:
        reader = _reader(Host())
        socket = Socket({"type": "websocket.disconnect", "code": code})
        assert await reader.run(_attachment(socket)) is outcome
        assert reader.client_close == (why, code) and reader.task is None


async def test_a_bad_message_costs_that_message_and_a_good_one_is_decided_on() -> None:
    host = Host()
    reader = _reader(host)
    socket = Socket(
        {"type": "websocket.receive", "text": "not json"},
        {"type": "websocket.receive", "text": '{"type": "input_audio_buffer.clear"}'},
        {"type": "websocket.disconnect", "code": 1000},
    )
    assert await reader.run(_attachment(socket)) is Outcome.CLOSED
    assert [e.code for e in host.errors] == [ErrorCode.INVALID_JSON]
    assert len(host.applied) == 1


async def test_a_quiet_client_is_expired_for_idling() -> None:
    host = Host()
    reader = _reader(host, idle_timeout_s=0.05)
    assert await reader.run(_attachment(Socket())) is Outcome.CLOSED
    assert host.expired == [Failure.IDLE]


async def test_a_session_past_its_deadline_is_expired_for_its_duration() -> None:
    host = Host(deadline=asyncio.get_running_loop().time())
    reader = _reader(host)
    assert await reader.run(_attachment(Socket())) is Outcome.CLOSED
    assert host.expired == [Failure.MAX_DURATION]


async def test_stop_ends_a_read_that_waits_for_ever() -> None:
    reader = _reader(Host())
    task = asyncio.create_task(reader.run(_attachment(Socket())))
    await asyncio.sleep(0.01)
    reader.stop()
    assert await task is Outcome.CLOSED


async def test_a_superseded_reader_reports_the_session_replaced() -> None:
    reader = _reader(Host())
    attachment = _attachment(Socket())
    task = asyncio.create_task(reader.run(attachment))
    await asyncio.sleep(0.01)
    reader.supersede(attachment)
    assert await task is Outcome.REPLACED
    assert reader.superseded == {task: attachment}


async def test_an_unanswered_update_is_told_after_its_bound() -> None:
    host = Host()
    reader = _reader(host, engine_timeout_s=0.02)
    reader.update_sent()
    await reader.settle_updates()
    assert host.failed == [Failure.ENGINE_UPDATE_UNANSWERED]
    reader.update_refused(UpdateEngine(config=SessionConfig(), previous=SessionConfig()), TimeoutError())
    (told,) = host.applied  # the session tells the client of the refusal
    assert "no answer in 0.02 s" in str(told)
    await reader.settle_updates()  # settled: no wait, nothing told
    assert host.failed == [Failure.ENGINE_UPDATE_UNANSWERED]
