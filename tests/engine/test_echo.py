"""The echo engine behind the engine port, driven directly."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from duplex_gateway.engine import port
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.typed import narrow

RATE = 16_000


async def collect(session: port.EngineSession, until: type, timeout: float = 5.0) -> list[port.EngineEvent]:
    seen: list[port.EngineEvent] = []

    async def run() -> None:
        async for event in session.events():
            seen.append(event)
            if isinstance(event, until):
                return

    await asyncio.wait_for(run(), timeout)
    return seen


async def started_engine(**kw: Any) -> EchoEngine:
    engine = EchoEngine(rate=RATE, chunk_ms=50, **kw)
    await engine.start()
    return engine


async def test_commit_echoes_the_turn_in_chunks() -> None:
    engine = await started_engine(pace=0)
    session = await engine.open_session("s1", SessionConfig())
    turn = bytes(range(256)) * 25  # 6400 bytes = 200 ms
    await session.append_audio(turn[:3000])
    await session.append_audio(turn[3000:])
    await session.commit(item_id="i1", response_id="resp_for_i1")
    events = await collect(session, port.EngineResponseDone)
    assert isinstance(events[0], port.EngineResponseStarted)
    assert isinstance(events[1], port.EngineTranscript) and "0.2 s" in events[1].delta
    chunks = [e.pcm for e in events if isinstance(e, port.EngineAudio)]
    assert len(chunks) == 4 and b"".join(chunks) == turn
    assert events[-1] == port.EngineResponseDone(response_id=events[0].response_id, status="completed")
    await session.close("done")
    assert engine.active_sessions == 0


async def test_create_response_repeats_last_turn_with_given_id() -> None:
    engine = await started_engine(pace=0)
    session = await engine.open_session("s1", SessionConfig())
    await session.append_audio(bytes(3200))
    await session.commit(item_id="i1", response_id=None)
    await session.create_response(response_id="resp_x", instructions=None)
    events = await collect(session, port.EngineResponseDone)
    assert events[0] == port.EngineResponseStarted(response_id="resp_x")
    assert sum(len(e.pcm) for e in events if isinstance(e, port.EngineAudio)) == 3200


@pytest.mark.parametrize("how", ["cancel", "barge_in"])
async def test_reply_stops_mid_way(how: str) -> None:
    engine = await started_engine(pace=1.0)
    session = await engine.open_session("s1", SessionConfig())
    await session.append_audio(bytes(RATE * 2 * 2))  # 2 s
    await session.commit(item_id="i1", response_id="resp_for_i1")
    events: list[port.EngineEvent] = []
    iterator = session.events().__aiter__()
    while sum(isinstance(e, port.EngineAudio) for e in events) < 2:
        events.append(await asyncio.wait_for(iterator.__anext__(), 2))
    rid = narrow(events[0], port.EngineResponseStarted).response_id
    if how == "cancel":
        await session.cancel_response(rid)
    else:
        await session.barge_in()
    rest = []
    while True:
        event = await asyncio.wait_for(iterator.__anext__(), 2)
        rest.append(event)
        if isinstance(event, port.EngineResponseDone):
            break
    assert rest[-1] == port.EngineResponseDone(response_id=rid, status="cancelled")
    audio_ms = sum(len(e.pcm) for e in events + rest if isinstance(e, port.EngineAudio)) / (RATE * 2) * 1000
    assert audio_ms < 1000  # far less than the 2 s turn


async def test_session_limit_and_unavailable() -> None:
    engine = EchoEngine(rate=RATE, max_sessions=1)
    with pytest.raises(port.EngineUnavailable):
        await engine.open_session("s0", SessionConfig())
    await engine.start()
    assert engine.ready
    first = await engine.open_session("s1", SessionConfig())
    with pytest.raises(port.EngineSessionLimit):
        await engine.open_session("s2", SessionConfig())
    await first.close("bye")
    await first.close("again")  # idempotent
    await engine.open_session("s3", SessionConfig())
    await engine.shutdown()
    assert engine.active_sessions == 0 and not engine.ready


async def test_long_monologue_keeps_bounded_memory() -> None:
    engine = await started_engine(pace=0, max_turn_s=1.0)
    session = await engine.open_session("s1", SessionConfig())
    for _ in range(50):
        await session.append_audio(bytes(RATE * 2 // 10))  # 5 s in total
    await session.commit(item_id="i1", response_id="resp_for_i1")
    events = await collect(session, port.EngineResponseDone)
    assert sum(len(e.pcm) for e in events if isinstance(e, port.EngineAudio)) == RATE * 2


async def test_close_ends_the_event_stream() -> None:
    engine = await started_engine()
    session = await engine.open_session("s1", SessionConfig())
    await session.close("client_close")
    events = await collect(session, port.EngineClosed)
    assert events == [port.EngineClosed(reason="client_close")]
