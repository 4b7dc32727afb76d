"""Engine events reach the session where the engine makes them, in order, and never inside a step."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.echo import EchoEngine, EchoSession
from duplex_gateway.engine.event_queue import EngineEventStream
from duplex_gateway.host.connection import Connection
from duplex_gateway.session.machine import Session
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.host.test_connection import (
    FRAME_20MS,
    RATE,
    FakeSocket,
    Harness,
    audio_of,
    done_of,
    reply_to_turn,
    speech_like,
)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.aclose()


@pytest.fixture
def streamed(monkeypatch: pytest.MonkeyPatch) -> list[port.EngineEvent]:
    """Every engine event that reached a session through the pump's stream (not taken at once)."""
    seen: list[port.EngineEvent] = []
    read = EngineEventStream.__anext__

    async def counted(self: EngineEventStream) -> port.EngineEvent:
        event = await read(self)
        seen.append(event)
        return event

    monkeypatch.setattr(EngineEventStream, "__anext__", counted)
    return seen


async def test_reply_chunks_are_taken_where_the_engine_makes_them(
    harness: Harness, streamed: list[port.EngineEvent]
) -> None:
    """A whole reply reaches the client, in order, with no wake-up of the pump per chunk."""
    socket = FakeSocket()
    engine = EchoEngine(rate=RATE, pace=0.0, chunk_ms=20)
    await engine.start()
    harness.connect(socket, engine)
    audio = speech_like(1.0)
    for offset in range(0, len(audio), FRAME_20MS):
        socket.append(audio[offset : offset + FRAME_20MS])
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    assert audio_of(socket, response_id) == audio
    assert socket.errors() == []
    chunks = [e for e in streamed if isinstance(e, port.EngineAudio)]
    assert chunks == [], f"{len(chunks)} of 50 reply chunks went through the pump"


class EventfulAppends(EchoEngine):
    """The echo engine, its appends (made at once, inside the session's steps) each making an event."""

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        session = await super().open_session(session_id, config)
        assert isinstance(session, EchoSession)
        take = session.append_audio

        async def eventful(
            pcm: bytes,
            *,
            is_speech: bool | None = None,
            hints: Mapping[str, object] | None = None,
            video_frames: Sequence[str] = (),
        ) -> None:
            session._events.offer(port.EngineTimings(response_id="resp_none", stages=(("append", 0.0),)))
            await take(pcm, is_speech=is_speech, hints=hints, video_frames=video_frames)

        session.append_audio = eventful  # type: ignore[method-assign]
        return session


async def test_an_event_made_inside_a_step_waits_for_the_step(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, streamed: list[port.EngineEvent]
) -> None:
    """Taking it at once would run a second step inside the first: it goes through the pump."""
    socket = FakeSocket()
    engine = EventfulAppends(rate=RATE, pace=0.0, chunk_ms=20)
    await engine.start()
    connection: Connection = harness.connect(socket, engine)
    depth = 0
    nested: list[Any] = []
    apply = connection.apply
    engine_event = Session.engine_event

    def counted_apply(outputs: Any) -> None:
        nonlocal depth
        depth += 1
        try:
            apply(outputs)
        finally:
            depth -= 1

    def watched(self: Session, event: port.EngineEvent, **kwargs: Any) -> Any:
        if depth:
            nested.append(event)
        return engine_event(self, event, **kwargs)

    monkeypatch.setattr(connection, "apply", counted_apply)
    monkeypatch.setattr(Session, "engine_event", watched)
    await socket.wait_for("session.created")
    audio = speech_like(0.4)
    for offset in range(0, len(audio), FRAME_20MS):
        # One frame at a time, the engine's pump idle in between: each append is made at once.
        socket.append(audio[offset : offset + FRAME_20MS])
        await asyncio.sleep(0.002)
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    assert audio_of(socket, response_id) == audio
    timings = [e for e in streamed if isinstance(e, port.EngineTimings)]
    assert len(timings) == len(audio) // FRAME_20MS, "each append's event went through the pump"
    assert nested == []
