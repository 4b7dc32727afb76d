"""The connection: read loop, input backpressure, the output fence, admission and every close path.

A real :class:`Session` and the real ``echo`` engine behind a fake socket that the
test feeds and reads; nothing else is faked.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Callable, MutableMapping
from typing import Any

import numpy as np
import pytest

from duplex_gateway.audio.stage import InputStage, ProcessedInput
from duplex_gateway.config import MAX_APPEND_AUDIO_BYTES, MAX_MESSAGE_BYTES, load_settings
from duplex_gateway.dialects.realtime import RealtimeDialect
from duplex_gateway.engine import port
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.host.connection import ENGINE_BACKLOG_MS, INPUT_SLICE_MS, Connection, SessionRegistry
from duplex_gateway.host.engine_link import MAX_MERGED_AUDIO_BYTES
from duplex_gateway.host.resumption import ResumeRegistry
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.server.app import session_defaults
from duplex_gateway.session.machine import Handshake
from duplex_gateway.vocabulary.session_config import SessionConfig

RATE = 24_000
FRAME_20MS = RATE * 2 // 50

Event = dict[str, Any]


class FakeSocket:
    """What the connection sees of a WebSocket: messages the test queues, events it records."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[MutableMapping[str, Any]] = asyncio.Queue()
        self.reads = 0
        self.events: list[Event] = []
        self.close_code: int | None = None
        self.stalled = False  # a client that stopped reading
        self._changed = asyncio.Condition()

    # -- the Socket protocol --

    async def receive(self) -> MutableMapping[str, Any]:
        message = await self.incoming.get()
        self.reads += 1
        return message

    async def send_text(self, data: str) -> None:
        if self.stalled:
            await asyncio.Event().wait()
        async with self._changed:
            self.events.append(json.loads(data))
            self._changed.notify_all()

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        async with self._changed:
            self.close_code = code
            self._changed.notify_all()

    # -- the test's side --

    def push(self, event: Event) -> None:
        self.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps(event)})

    def append(self, audio: bytes) -> None:
        self.push({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})

    def drop(self, code: int = 1006) -> None:
        self.incoming.put_nowait({"type": "websocket.disconnect", "code": code})

    async def wait_for(
        self, match: str | Callable[[Event], bool], start: int = 0, timeout: float = 10
    ) -> int:
        """Index of the first event at or after ``start`` of type ``match`` (or satisfying it)."""
        pred = (lambda e: e["type"] == match) if isinstance(match, str) else match
        async with asyncio.timeout(timeout), self._changed:
            while True:
                for index in range(start, len(self.events)):
                    if pred(self.events[index]):
                        return index
                await self._changed.wait()

    async def wait_closed(self, timeout: float = 10) -> int:
        async with asyncio.timeout(timeout), self._changed:
            await self._changed.wait_for(lambda: self.close_code is not None)
        assert self.close_code is not None
        return self.close_code

    def types(self, start: int = 0) -> list[str]:
        return [e["type"] for e in self.events[start:]]

    def errors(self) -> list[str]:
        return [e["error"]["code"] for e in self.events if e["type"] == "error"]


def deltas_of(socket: FakeSocket, response_id: str, start: int = 0) -> list[int]:
    return [
        i
        for i, e in enumerate(socket.events)
        if i >= start and e["type"] == "response.output_audio.delta" and e["response_id"] == response_id
    ]


def audio_of(socket: FakeSocket, response_id: str) -> bytes:
    return b"".join(base64.b64decode(socket.events[i]["delta"]) for i in deltas_of(socket, response_id))


def done_of(response_id: str) -> Callable[[Event], bool]:
    return lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id


def speech_like(seconds: float) -> bytes:
    """Deterministic audio that is not silence (the echo must return exactly these bytes)."""
    rng = np.random.default_rng(7)
    return (rng.standard_normal(int(RATE * seconds)) * 3000).astype("<i2").tobytes()


class Harness:
    """Builds connections over fake sockets; stops whatever they left running."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def connect(
        self,
        socket: FakeSocket,
        engine: EchoEngine,
        *,
        handshake: Handshake = Handshake.REALTIME,
        registry: SessionRegistry | None = None,
        resumes: ResumeRegistry[Connection] | None = None,
        session_id: str = "sess_test",
        metrics: GatewayMetrics | None = None,
        **overrides: Any,
    ) -> Connection:
        settings = load_settings(None, **{"session.turn_detection": "none", **overrides})
        connection = Connection(
            socket,
            session_id=session_id,
            engine=engine,
            settings=settings,
            defaults=session_defaults(settings),
            registry=registry or SessionRegistry(settings.limits.max_sessions),
            handshake=handshake,
            dialect=RealtimeDialect(
                session_id=session_id,
                beta=False,
                duplex=handshake is Handshake.DUPLEX,
                max_message_bytes=settings.limits.max_message_bytes,
            ),
            resumes=resumes,
            metrics=metrics,
            dialect_name="duplex" if handshake is Handshake.DUPLEX else "realtime",
        )
        self.tasks.append(asyncio.create_task(connection.serve()))
        return connection

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.aclose()


async def echo(pace: float = 0.0, chunk_ms: int = 100, **kwargs: Any) -> EchoEngine:
    engine = EchoEngine(rate=RATE, pace=pace, chunk_ms=chunk_ms, **kwargs)
    await engine.start()
    return engine


class GatedEcho(EchoEngine):
    """The echo engine, its sessions taking caller audio only while the test lets them; records each append."""

    def __init__(self) -> None:
        super().__init__(rate=RATE, pace=0.0, chunk_ms=100)
        self.gate = asyncio.Event()
        self.appends: list[int] = []

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        session = await super().open_session(session_id, config)
        take = session.append_audio

        async def gated(pcm: bytes, **hints: Any) -> None:
            await self.gate.wait()
            self.appends.append(len(pcm))
            await take(pcm, **hints)

        session.append_audio = gated  # type: ignore[method-assign]
        session.appends_without_waiting = False  # type: ignore[misc]  # these appends wait for the gate
        return session


async def reply_to_turn(socket: FakeSocket, start: int = 0) -> str:
    socket.push({"type": "input_audio_buffer.commit"})
    socket.push({"type": "response.create"})
    index = await socket.wait_for("response.created", start)
    return str(socket.events[index]["response"]["id"])


# ---------------------------------------------------------------------------------------
# input: nothing dropped, in order, and a bounded amount held


async def test_audio_sent_at_once_is_all_processed_in_order(harness: Harness) -> None:
    """12 s of 20 ms frames queued at once (far faster than real time) come back byte for byte."""
    socket = FakeSocket()
    engine = await echo()
    harness.connect(socket, engine)
    audio = speech_like(12.0)
    for offset in range(0, len(audio), FRAME_20MS):
        socket.append(audio[offset : offset + FRAME_20MS])
    response_id = await reply_to_turn(socket)
    done = socket.events[await socket.wait_for(done_of(response_id))]
    assert done["response"]["status"] == "completed"
    assert socket.errors() == []
    assert audio_of(socket, response_id) == audio


async def test_the_reader_stops_reading_while_the_engine_is_behind(harness: Harness) -> None:
    """The memory bound: at most ENGINE_BACKLOG_MS of caller audio waits for the engine, plus one message."""
    socket = FakeSocket()
    engine = GatedEcho()
    await engine.start()
    harness.connect(socket, engine)
    frames = 3 * ENGINE_BACKLOG_MS // 20  # three times what may wait
    audio = speech_like(frames * 0.02)
    for offset in range(0, len(audio), FRAME_20MS):
        socket.append(audio[offset : offset + FRAME_20MS])
    await socket.wait_for("session.created")
    for _ in range(200):  # every other task gets to run: the reader must stop on its own
        await asyncio.sleep(0)
    held = ENGINE_BACKLOG_MS // 20
    assert held <= socket.reads <= held + 2, socket.reads
    assert socket.incoming.qsize() == frames - socket.reads
    engine.gate.set()
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    # Nothing was dropped on the way; what waited for the engine went in as few, bounded appends.
    assert audio_of(socket, response_id) == audio
    assert sum(engine.appends) == len(audio)
    assert len(engine.appends) < frames and max(engine.appends) <= MAX_MERGED_AUDIO_BYTES


async def test_a_long_append_goes_through_the_input_stage_in_slices(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    process = InputStage.process

    async def recorded(self: InputStage, data: bytes) -> ProcessedInput:
        sizes.append(len(data))
        return await process(self, data)

    monkeypatch.setattr(InputStage, "process", recorded)
    socket = FakeSocket()
    harness.connect(socket, await echo())
    audio = speech_like(1.05)
    socket.append(audio)
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    slice_bytes = RATE * 2 * INPUT_SLICE_MS // 1000
    assert sizes == [slice_bytes] * 10 + [len(audio) - 10 * slice_bytes]
    assert audio_of(socket, response_id) == audio


def test_the_message_size_limit_holds_an_append_of_15_mib() -> None:
    append = {"type": "input_audio_buffer.append", "event_id": "e" * 64, "audio": ""}
    size = len(json.dumps(append)) + len(base64.b64encode(bytes(MAX_APPEND_AUDIO_BYTES)))
    assert MAX_APPEND_AUDIO_BYTES == 15 * 1024 * 1024
    assert size <= MAX_MESSAGE_BYTES < load_settings(None).limits.hard_max_message_bytes


# ---------------------------------------------------------------------------------------
# output: nothing of a cancelled reply after the cancel, at a resampled rate


@pytest.mark.parametrize("trigger", ["response.cancel", "output_audio_buffer.clear"])
@pytest.mark.parametrize("out_rate", [8000, 16000, 48000])
async def test_a_cancelled_reply_sends_no_resampler_tail(
    harness: Harness, trigger: str, out_rate: int
) -> None:
    socket = FakeSocket()
    # One chunk of 1 s, played at real-time pace: all its audio is out long before it ends.
    engine = await echo(pace=1.0, chunk_ms=1000)
    harness.connect(socket, engine, **{"session.output_rate": out_rate})
    socket.append(speech_like(0.5))
    response_id = await reply_to_turn(socket)
    first = await socket.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    assert socket.events[first]["sample_rate_hz"] == out_rate
    socket.push({"type": trigger})
    done = socket.events[await socket.wait_for(done_of(response_id), first)]
    assert done["response"]["status"] == "cancelled"
    socket.push({"type": "session.heartbeat"})  # all the gateway sent before is in when this is answered
    await socket.wait_for("session.heartbeat_ack", first)
    assert deltas_of(socket, response_id) == [first], socket.types(first)


async def test_a_completed_reply_gets_its_resampler_tail(harness: Harness) -> None:
    socket = FakeSocket()
    harness.connect(socket, await echo(), **{"session.output_rate": 16000})
    socket.append(speech_like(0.5))
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    # 0.5 s at 16 kHz, within a few samples of the resampler's rounding.
    assert abs(len(audio_of(socket, response_id)) / 2 - 8000) <= 4


# ---------------------------------------------------------------------------------------
# admission


async def test_a_duplex_handshake_takes_a_slot_only_when_it_opens_the_engine(harness: Harness) -> None:
    socket = FakeSocket()
    registry = SessionRegistry(1)
    harness.connect(socket, await echo(), handshake=Handshake.DUPLEX, registry=registry)
    socket.push({"type": "session.heartbeat"})
    await socket.wait_for("session.heartbeat_ack")
    assert registry.count == 0
    socket.push({"type": "session.update", "session": {"type": "realtime"}})
    await socket.wait_for("session.created")
    assert registry.count == 1
    socket.drop(1000)
    await socket.wait_closed()
    await asyncio.gather(*harness.tasks)
    assert registry.count == 0


async def test_at_max_sessions_a_new_session_is_refused_1013(harness: Harness) -> None:
    registry = SessionRegistry(1)
    engine = await echo()
    first, second = FakeSocket(), FakeSocket()
    harness.connect(first, engine, registry=registry, session_id="sess_a")
    await first.wait_for("session.created")
    harness.connect(second, engine, registry=registry, session_id="sess_b", handshake=Handshake.DUPLEX)
    second.push({"type": "session.update", "session": {"type": "realtime"}})
    assert await second.wait_closed() == 1013
    assert second.errors() == ["session_limit"]
    await harness.tasks[-1]
    assert registry.count == 1 and engine.active_sessions == 1


async def test_a_resume_takes_over_the_parked_sessions_slot(harness: Harness) -> None:
    registry = SessionRegistry(1)
    resumes: ResumeRegistry[Connection] = ResumeRegistry()
    engine = await echo()
    first = FakeSocket()
    harness.connect(first, engine, registry=registry, resumes=resumes, session_id="sess_a")
    created = first.events[await first.wait_for("session.created")]
    first.drop(1006)
    await asyncio.gather(*harness.tasks)
    assert [c.session_id for c in resumes.parked()] == ["sess_a"] and registry.count == 1
    second = FakeSocket()
    harness.connect(
        second, engine, registry=registry, resumes=resumes, session_id="sess_b", handshake=Handshake.DUPLEX
    )
    second.push(
        {
            "type": "session.resume",
            "session_id": "sess_a",
            "resume_token": created["resume_token"],
            "last_received_server_event_seq": created["server_event_seq"],
        }
    )
    await second.wait_for("session.resumed")
    assert second.errors() == [] and registry.count == 1 and engine.active_sessions == 1
    second.push({"type": "session.close"})
    assert await second.wait_closed() == 1000
    await asyncio.gather(*harness.tasks)
    assert registry.count == 0 and engine.active_sessions == 0


def resume_event(created: Event, token: str, last_seq: int) -> Event:
    return {
        "type": "session.resume",
        "session_id": created["session_id"],
        "resume_token": token,
        "last_received_server_event_seq": last_seq,
    }


async def test_a_session_whose_socket_looks_alive_is_taken_over(harness: Harness) -> None:
    """The client lost a connection the gateway never saw drop: its resume takes the session over."""
    registry, resumes = SessionRegistry(2), ResumeRegistry[Connection]()
    engine = await echo()
    first = FakeSocket()
    harness.connect(first, engine, registry=registry, resumes=resumes, session_id="sess_a")
    created = first.events[await first.wait_for("session.created")]
    first.push({"type": "session.heartbeat"})
    last_seq = first.events[await first.wait_for("session.heartbeat_ack")]["server_event_seq"]
    second = FakeSocket()
    harness.connect(
        second, engine, registry=registry, resumes=resumes, session_id="sess_b", handshake=Handshake.DUPLEX
    )
    second.push(resume_event(created, created["resume_token"], last_seq))
    resumed = second.events[await second.wait_for("session.resumed")]
    # The old socket is told, and closed; it is never read again.
    replaced = first.events[await first.wait_for("session.replaced")]
    assert {k: v for k, v in replaced.items() if k != "event_id"} == {
        "type": "session.replaced",
        "session_id": "sess_a",
        "attachment_generation": 1,
    }
    assert await first.wait_closed() == 1000
    first.push({"type": "session.heartbeat"})
    assert resumed["attachment_generation"] == 2 and "server_event_seq" not in resumed
    assert resumed["resume_token"] != created["resume_token"]
    # The session goes on over the new socket, numbered on from where it was.
    second.push({"type": "session.heartbeat"})
    ack = second.events[await second.wait_for("session.heartbeat_ack")]
    assert ack["server_event_seq"] == last_seq + 1
    assert first.reads == 1 + 0 and first.types().count("session.heartbeat_ack") == 1
    assert registry.count == 1 and engine.active_sessions == 1 and second.errors() == []
    second.push({"type": "session.close"})
    assert await second.wait_closed() == 1000
    await asyncio.gather(*harness.tasks)
    assert registry.count == 0 and engine.active_sessions == 0


async def test_a_session_resumes_again_and_again_with_each_new_token(harness: Harness) -> None:
    resumes = ResumeRegistry[Connection]()
    engine = await echo()
    first = FakeSocket()
    harness.connect(first, engine, resumes=resumes, session_id="sess_a")
    created = first.events[await first.wait_for("session.created")]
    token, last_seq, sockets = created["resume_token"], created["server_event_seq"], [first]
    for n in range(3):
        sockets[-1].drop(1006)
        nxt = FakeSocket()
        harness.connect(nxt, engine, resumes=resumes, session_id=f"sess_{n}", handshake=Handshake.DUPLEX)
        nxt.push(resume_event(created, token, last_seq))
        resumed = nxt.events[await nxt.wait_for("session.resumed")]
        assert nxt.errors() == [] and resumed["attachment_generation"] == n + 2
        assert resumed["resume_token"] != token
        token = resumed["resume_token"]
        nxt.push({"type": "session.heartbeat"})
        last_seq = nxt.events[await nxt.wait_for("session.heartbeat_ack")]["server_event_seq"]
        sockets.append(nxt)
    # A spent token is refused.
    sockets[-1].drop(1006)
    late = FakeSocket()
    harness.connect(late, engine, resumes=resumes, session_id="sess_late", handshake=Handshake.DUPLEX)
    late.push(resume_event(created, created["resume_token"], last_seq))
    await late.wait_for("error")
    assert late.errors() == ["invalid_resume_token"]


async def test_acknowledged_events_are_not_kept_and_a_gap_is_resync_required(harness: Harness) -> None:
    resumes = ResumeRegistry[Connection]()
    engine = await echo()
    first = FakeSocket()
    harness.connect(first, engine, resumes=resumes, session_id="sess_a")
    created = first.events[await first.wait_for("session.created")]
    for _ in range(3):
        first.push({"type": "session.heartbeat"})
    index = 0
    for _ in range(3):
        index = await first.wait_for("session.heartbeat_ack", index + 1)
    head = first.events[index]["server_event_seq"]
    first.push({"type": "session.event_ack", "server_event_seq": head - 1})
    first.push({"type": "session.event_ack", "server_event_seq": head + 5})  # never sent
    await first.wait_for("error")
    assert first.errors() == ["invalid_value"]
    first.drop(1006)
    second = FakeSocket()
    harness.connect(second, engine, resumes=resumes, session_id="sess_b", handshake=Handshake.DUPLEX)
    # Asking for acknowledged events again: the journal no longer covers the gap.
    second.push(resume_event(created, created["resume_token"], head - 2))
    resync = second.events[await second.wait_for("session.resync_required")]
    assert resync["session_id"] == "sess_a" and resync["reason"] == "journal_gap"
    assert "server_event_seq" not in resync and second.errors() == []
    # What was not acknowledged is still there for a resume.
    third = FakeSocket()
    harness.connect(third, engine, resumes=resumes, session_id="sess_c", handshake=Handshake.DUPLEX)
    third.push(resume_event(created, created["resume_token"], head - 1))
    start = await third.wait_for("session.resumed")
    replayed = [e["server_event_seq"] for e in third.events[start + 1 :]]
    assert replayed[:2] == [head, head + 1] and third.events[start + 2]["type"] == "error"


# ---------------------------------------------------------------------------------------
# every way a session ends releases its slot and its engine session


async def assert_released(harness: Harness, registry: SessionRegistry, engine: EchoEngine) -> None:
    await asyncio.gather(*harness.tasks)
    assert registry.count == 0
    assert engine.active_sessions == 0


@pytest.mark.parametrize("code", [1000, 1001, 1006])
async def test_client_close_or_drop_without_resume_ends_the_session(harness: Harness, code: int) -> None:
    socket, registry, engine = FakeSocket(), SessionRegistry(4), await echo()
    harness.connect(socket, engine, registry=registry)
    await socket.wait_for("session.created")
    assert registry.count == 1 and engine.active_sessions == 1
    socket.drop(code)
    await assert_released(harness, registry, engine)


async def test_idle_client_is_closed_4000(harness: Harness) -> None:
    socket, registry, engine = FakeSocket(), SessionRegistry(4), await echo()
    harness.connect(socket, engine, registry=registry, **{"limits.idle_timeout_s": 0.05})
    assert await socket.wait_closed() == 4000
    assert socket.errors() == ["idle_timeout"]
    await assert_released(harness, registry, engine)


async def test_session_past_its_maximum_duration_is_closed_4001(harness: Harness) -> None:
    socket, registry, engine = FakeSocket(), SessionRegistry(4), await echo()
    harness.connect(socket, engine, registry=registry, **{"limits.max_session_s": 0.05})
    assert await socket.wait_closed() == 4001
    assert socket.errors() == ["session_expired"]
    (error,) = [e for e in socket.events if e["type"] == "error"]
    assert error["error"]["message"] == "Your session hit the maximum duration of 0.05 seconds."
    await assert_released(harness, registry, engine)


async def test_client_that_stops_reading_is_closed_4002(harness: Harness) -> None:
    socket, registry, engine = FakeSocket(), SessionRegistry(4), await echo()
    socket.stalled = True
    harness.connect(
        socket, engine, registry=registry, **{"limits.send_queue_size": 16, "limits.send_timeout_s": 0.05}
    )
    for _ in range(40):  # more answers than the send queue holds
        socket.push({"type": "session.heartbeat"})
    assert await socket.wait_closed() == 4002
    await assert_released(harness, registry, engine)


async def test_a_fault_in_the_gateway_closes_1011_and_releases(harness: Harness) -> None:
    socket, registry, engine = FakeSocket(), SessionRegistry(4), await echo()
    harness.connect(socket, engine, registry=registry)
    await socket.wait_for("session.created")
    socket.incoming.put_nowait({})  # a transport message without even a type: a bug, not bad client input
    assert await socket.wait_closed() == 1011
    await assert_released(harness, registry, engine)


async def test_an_engine_that_cannot_open_sessions_closes_1013(harness: Harness) -> None:
    socket, registry = FakeSocket(), SessionRegistry(4)
    engine = EchoEngine(rate=RATE)  # never started: open_session raises EngineUnavailable
    harness.connect(socket, engine, registry=registry)
    assert await socket.wait_closed() == 1013
    assert socket.errors() == ["engine_unavailable"]
    await assert_released(harness, registry, engine)


async def test_an_engine_full_of_sessions_closes_1013_session_limit(harness: Harness) -> None:
    registry = SessionRegistry(4)
    engine = await echo(max_sessions=1)
    first, second = FakeSocket(), FakeSocket()
    harness.connect(first, engine, registry=registry, session_id="sess_a")
    await first.wait_for("session.created")
    harness.connect(second, engine, registry=registry, session_id="sess_b")
    assert await second.wait_closed() == 1013
    assert second.errors() == ["session_limit"]
    await harness.tasks[-1]
    assert registry.count == 1 and engine.active_sessions == 1


async def test_a_bad_message_costs_only_that_message(harness: Harness) -> None:
    socket = FakeSocket()
    harness.connect(socket, await echo())
    socket.incoming.put_nowait({"type": "websocket.receive", "bytes": b"\x00\x01"})
    socket.incoming.put_nowait({"type": "websocket.receive", "text": "{oops"})
    socket.push({"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x00\x01\x02").decode()})
    socket.push({"type": "session.heartbeat"})
    await socket.wait_for("session.heartbeat_ack")
    assert socket.errors() == ["binary_not_supported", "invalid_json", "invalid_audio_length"]
    assert socket.close_code is None


# ---------------------------------------------------------------------------------------
# session.update: the client hears of it once the engine took it


class GatedUpdates(EchoEngine):
    """The echo engine, its sessions taking an update when the test lets them, refusing a voice change."""

    def __init__(self) -> None:
        super().__init__(rate=RATE, pace=0.0, chunk_ms=100)
        self.gate = asyncio.Event()
        self.asked = asyncio.Event()
        self.updates: list[SessionConfig] = []

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        session = await super().open_session(session_id, config)

        async def update(new: SessionConfig) -> None:
            self.asked.set()
            await self.gate.wait()
            self.updates.append(new)
            if new.voice != config.voice:
                raise port.EngineRefused("voice_update_after_audio_unsupported", "too late for a new voice")

        session.update = update  # type: ignore[method-assign]
        return session


async def test_session_updated_follows_the_engine_and_a_refusal_is_an_error(harness: Harness) -> None:
    socket = FakeSocket()
    engine = GatedUpdates()
    await engine.start()
    harness.connect(socket, engine)
    await socket.wait_for("session.created")
    socket.push({"type": "session.update", "session": {"temperature": 0.5}})
    socket.push({"type": "session.heartbeat"})
    await engine.asked.wait()
    await asyncio.sleep(0.05)  # time enough for an answer that does not wait for the engine
    # The engine has not taken the update yet: neither it nor what came after is answered.
    assert "session.updated" not in socket.types() and "session.heartbeat_ack" not in socket.types()
    engine.gate.set()
    index = await socket.wait_for("session.updated")
    assert await socket.wait_for("session.heartbeat_ack") == index + 1
    assert engine.updates[-1].temperature == 0.5
    assert socket.events[index]["session"]["temperature"] == 0.5

    socket.push({"type": "session.update", "event_id": "evt_voice", "session": {"voice": "nova"}})
    error = socket.events[await socket.wait_for("error", index)]
    assert error["error"]["event_id"] == "evt_voice"
    assert "voice_update_after_audio_unsupported" in error["error"]["message"]
    assert socket.types(index + 1).count("session.updated") == 0


async def test_a_response_asked_for_behind_an_update_is_answered_after_it_with_the_updated_session(
    harness: Harness,
) -> None:
    # Pipecat sets up a conversation with session.update and response.create back to back.
    socket = FakeSocket()
    engine = GatedUpdates()
    await engine.start()
    harness.connect(socket, engine)
    await socket.wait_for("session.created")
    socket.push({"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}})
    socket.push({"type": "response.create"})
    await engine.asked.wait()
    await asyncio.sleep(0.05)
    assert "response.created" not in socket.types()
    engine.gate.set()
    created = await socket.wait_for("response.created")
    assert socket.types().index("session.updated") < created
    response_id = socket.events[created]["response"]["id"]
    done = await socket.wait_for(done_of(response_id), created)
    # The reply is in text, as the update said: no audio of it.
    assert "response.output_text.delta" in socket.types(created)[: done - created]
    assert "response.output_audio.delta" not in socket.types(created)
    assert socket.errors() == []


async def test_a_response_asked_for_behind_a_refused_update_is_made_with_the_session_as_it_was(
    harness: Harness,
) -> None:
    socket = FakeSocket()
    engine = GatedUpdates()
    engine.gate.set()
    await engine.start()
    harness.connect(socket, engine)
    await socket.wait_for("session.created")
    socket.push({"type": "session.update", "session": {"type": "realtime", "voice": "nova"}})
    socket.push({"type": "response.create"})
    created = await socket.wait_for("response.created")
    assert "error" in socket.types()[:created]  # the refusal comes first
    assert "session.updated" not in socket.types()


class SilentUpdates(EchoEngine):
    """The echo engine, its sessions never answering an update."""

    def __init__(self) -> None:
        super().__init__(rate=RATE, pace=0.0, chunk_ms=100)

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        session = await super().open_session(session_id, config)

        async def update(new: SessionConfig) -> None:
            await asyncio.Event().wait()

        session.update = update  # type: ignore[method-assign]
        return session


async def test_an_update_the_engine_never_answers_holds_what_follows_for_a_bounded_time(
    harness: Harness,
) -> None:
    socket = FakeSocket()
    engine = SilentUpdates()
    await engine.start()
    harness.connect(socket, engine, **{"limits.engine_timeout_s": 0.2})
    await socket.wait_for("session.created")
    socket.push(
        {"type": "session.update", "event_id": "evt_update", "session": {"instructions": "Be brief."}}
    )
    socket.push({"type": "response.create"})
    created = await socket.wait_for("response.created")
    (error,) = [e for e in socket.events[:created] if e["type"] == "error"]
    assert error["error"]["event_id"] == "evt_update"
    assert "no answer in 0.2 s" in error["error"]["message"]
    assert "session.updated" not in socket.types()


# ---------------------------------------------------------------------------------------
# metrics and the summary line; draining for shutdown


def sample(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


async def test_a_sessions_reply_feeds_the_metrics_and_its_end_the_summary_line(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = GatewayMetrics("echo")
    registry = SessionRegistry(4)
    engine = await echo()
    socket = FakeSocket()
    harness.connect(socket, engine, registry=registry, metrics=metrics)
    await socket.wait_for("session.created")
    assert sample(metrics, "duplex_gateway_sessions_active", dialect="realtime", engine="echo") == 1
    socket.append(speech_like(0.3))
    response_id = await reply_to_turn(socket)
    await socket.wait_for(done_of(response_id))
    with caplog.at_level("INFO", logger="duplex_gateway.host.connection"):
        socket.drop(1000)
        await assert_released(harness, registry, engine)
    assert sample(metrics, "duplex_gateway_first_audio_seconds_count", engine="echo") == 1
    assert sample(metrics, "duplex_gateway_speech_end_to_first_audio_seconds_count", engine="echo") is None
    assert sample(metrics, "duplex_gateway_replies_total", engine="echo", status="completed") == 1
    assert sample(metrics, "duplex_gateway_sessions_active", dialect="realtime", engine="echo") == 0
    assert (
        sample(
            metrics,
            "duplex_gateway_sessions_total",
            dialect="realtime",
            engine="echo",
            reason="client_closed",
        )
        == 1
    )
    assert sample(metrics, "duplex_gateway_engine_call_seconds_count", call="start_response") == 1
    assert sample(metrics, "duplex_gateway_engine_call_seconds_count", call="open_session") == 1
    assert (sample(metrics, "duplex_gateway_output_chunk_gap_seconds_count", engine="echo") or 0) >= 1
    assert (sample(metrics, "duplex_gateway_send_queue_depth_count") or 0) >= len(socket.events)
    assert sample(metrics, "duplex_gateway_input_backpressure_seconds_count") == 3  # append, commit, create
    sent = sum(len(json.dumps(e)) for e in socket.events)
    assert (sample(metrics, "duplex_gateway_client_bytes_total", direction="out") or 0) >= sent * 0.9
    (summary,) = [r for r in caplog.records if getattr(r, "event", None) == "session_summary"]
    assert summary.session_id == "sess_test" and summary.turns == 1 and summary.replies == 1  # type: ignore[attr-defined]
    assert summary.first_audio_ms["count"] == 1 and summary.close_code == 1000  # type: ignore[attr-defined]
    assert summary.close_reason == "client_closed" and summary.bytes_in > 0  # type: ignore[attr-defined]


async def test_draining_a_duplex_session_warns_it_lets_the_reply_finish_then_closes_1001(
    harness: Harness,
) -> None:
    registry = SessionRegistry(4)
    engine = await echo(pace=1.0, chunk_ms=50)
    socket = FakeSocket()
    connection = harness.connect(socket, engine, registry=registry, handshake=Handshake.DUPLEX)
    socket.push({"type": "session.update", "session": {"type": "realtime", "turn_detection": None}})
    await socket.wait_for("session.created")
    socket.append(speech_like(0.6))
    response_id = await reply_to_turn(socket)
    await socket.wait_for("response.output_audio.delta")
    registry.draining = True
    connection.drain(5.0)
    closing = socket.events[await socket.wait_for("session.closing")]
    assert {k: v for k, v in closing.items() if k not in ("event_id", "server_event_seq")} == {
        "type": "session.closing",
        "reason": "server_shutdown",
        "grace_s": 5.0,
    }
    done = socket.events[await socket.wait_for(done_of(response_id))]
    assert done["response"]["status"] == "completed"  # the reply in progress was finished
    assert await socket.wait_closed() == 1001
    assert socket.types()[-2:] == ["rate_limits.updated", "session.closed"]
    socket.drop(1000)  # the client's answer to the close
    await assert_released(harness, registry, engine)


@pytest.mark.parametrize("include", [False, True])
async def test_a_realtime_client_is_warned_only_if_it_asked(harness: Harness, include: bool) -> None:
    engine = await echo()
    socket = FakeSocket()
    connection = harness.connect(socket, engine)
    await socket.wait_for("session.created")
    if include:
        socket.push(
            {"type": "session.update", "session": {"type": "realtime", "include": ["session.closing"]}}
        )
        await socket.wait_for("session.updated")
    connection.drain(5.0)
    assert await socket.wait_closed() == 1001  # nothing in progress: closed at once
    assert ("session.closing" in socket.types()) is include
    assert "session.closed" not in socket.types()  # a vLLM-Omni event, never for a Realtime client


async def test_a_draining_gateway_refuses_new_sessions_1013(harness: Harness) -> None:
    metrics = GatewayMetrics("echo")
    registry = SessionRegistry(4)
    registry.draining = True
    socket = FakeSocket()
    harness.connect(socket, await echo(), registry=registry, metrics=metrics)
    assert await socket.wait_closed() == 1013
    assert socket.types() == ["error"] and socket.errors() == ["server_shutting_down"]
    await asyncio.gather(*harness.tasks)
    assert (
        sample(
            metrics,
            "duplex_gateway_sessions_total",
            dialect="realtime",
            engine="echo",
            reason="server_shutting_down",
        )
        == 1
    )
