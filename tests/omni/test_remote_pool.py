"""Engine ``remote`` in front of two REAL vLLM-Omni duplex servers (run under ``.venv-omni``).

Each backend is ``python -m tests.omni.backend_server``: vLLM-Omni's own
``OmniDuplexSessionHandler`` on ``WS /v1/realtime`` over a ``DuplexOmni`` with the
fake echo stage, one uvicorn worker. A front gateway runs ``--engine remote`` over
both; raw WebSocket clients talk to the front. Sessions spread over the two
servers; one server killed mid-call costs its own callers an error within a
second and leaves the other server's callers alone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    load_speech,
    send_json,
    ws_connect,
)
from tests.omni.conftest import Backend, read_calls, start_backend, stop_backends, wait_healthy

pytestmark = pytest.mark.e2e

#: Each fake answer: 8 chunks 200 ms apart, so a reply is still streaming ~1.5 s after it starts.
CHUNKS = 8
CHUNK_DELAY_MS = 200
CAP = 2
TURN_S = 1.0


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Backend]]:
    tmp = tmp_path_factory.mktemp("omni-backends")
    started = [
        start_backend(tmp, f"omni{i}", chunks=CHUNKS, chunk_delay_ms=CHUNK_DELAY_MS) for i in range(2)
    ]  # both start at once
    try:
        wait_healthy(started)
        yield started
    finally:
        stop_backends(started)


@pytest.fixture(scope="module")
def front(module_gateway_factory: GatewayFactory, backends: list[Backend]) -> Gateway:
    config = {
        "server": {"web_demo": False},
        "limits": {"input_rate_factor": 50, "input_burst_ms": 60_000},
        "engine": {
            "name": "remote",
            "remote": {
                "health_interval_s": 0.5,
                "backends": [{"url": b.url, "max_sessions": CAP} for b in backends],
            },
        },
    }
    return module_gateway_factory.start(config, name="front")


class Caller:
    """A raw WebSocket client of the front gateway."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.log = EventLog(ws.recv)

    @classmethod
    async def connect(cls, gw: Gateway) -> Caller:
        caller = cls(await ws_connect(gw, "/v1/realtime", close_timeout=1))
        await caller.log.wait_for("session.created")
        await send_json(caller.ws, {"type": "session.update", "session": {"turn_detection": None}})
        await caller.log.wait_for("session.updated")
        return caller

    async def turn(self, seconds: float = TURN_S, *, respond: bool = True) -> None:
        """One caller turn, committed; ``respond``: and a reply asked for (else auto_response answers)."""
        speech = load_speech(24_000)
        start = int(0.5 * 24_000) * 2  # the fixture's speech starts ≈0.5 s in
        pcm = speech[start : start + int(seconds * 24_000) * 2]
        for offset in range(0, len(pcm), 4800):
            await send_json(
                self.ws, {"type": "input_audio_buffer.append", "audio": b64(pcm[offset : offset + 4800])}
            )
        await send_json(self.ws, {"type": "input_audio_buffer.commit"})
        if respond:
            await send_json(self.ws, {"type": "response.create"})

    def audio_s(self, after: int = 0) -> float:
        data = b"".join(
            base64.b64decode(e["delta"])
            for e in self.log.events[after:]
            if e["type"] == "response.output_audio.delta"
        )
        return len(data) / 2 / 24_000

    async def close(self) -> None:
        await self.log.aclose()
        with contextlib.suppress(Exception):
            await self.ws.close()


async def test_sessions_spread_over_both_servers_and_get_their_echo(
    front: Gateway, backends: list[Backend]
) -> None:
    assert front.readyz()["engine"] == "remote"
    before = [b.opened() for b in backends]
    callers = [await Caller.connect(front) for _ in range(2 * CAP)]
    try:
        assert [b.opened() - n for b, n in zip(backends, before, strict=True)] == [CAP, CAP]
        for caller in callers:
            await caller.turn()
        for caller in callers:
            _, done = await caller.log.wait_for("response.done", timeout=20)
            assert done["response"]["status"] == "completed"
            transcript = next(
                e for e in caller.log.events if e["type"] == "response.output_audio_transcript.done"
            )
            assert "echo" in transcript["transcript"]
            assert abs(caller.audio_s() - TURN_S) < 0.1
        # The pool is full: one more caller is turned away, and told why.
        extra = await ws_connect(front, "/v1/realtime", close_timeout=1)
        log = EventLog(extra.recv)
        _, error = await log.wait_for("error", timeout=10)
        assert error["error"]["code"] == "session_limit"
        await asyncio.wait_for(extra.wait_closed(), 5)
        assert extra.close_code == 1013
        await log.aclose()
    finally:
        for caller in callers:
            await caller.close()
    await front.wait_sessions(0, timeout=10)


async def test_a_dropped_backend_socket_is_resumed_with_vllm_omnis_journal(backends: list[Backend]) -> None:
    """The engine driven directly: a socket that drops mid-reply is re-attached with session.resume."""
    from duplex_gateway.engine import port
    from duplex_gateway.engine.remote import BackendKind, BackendSpec, RemoteEngine, RemoteSession
    from duplex_gateway.vocabulary.session_config import SessionConfig

    engine = RemoteEngine([BackendSpec(url=backends[1].url, max_sessions=CAP)], health_timeout_s=5)
    await engine.start()
    events: list[port.EngineEvent] = []
    try:
        session = await engine.open_session("resume", SessionConfig())
        assert (
            isinstance(session, RemoteSession) and session.kind is BackendKind.VLLM_OMNI and session.resumable
        )

        async def read() -> None:
            async for event in session.events():
                events.append(event)  # noqa: PERF401 - read by `until` while the stream runs

        reader = asyncio.create_task(read())

        async def until(match: Any, timeout: float = 20) -> port.EngineEvent:
            async with asyncio.timeout(timeout):
                while not (hits := [e for e in events if match(e)]):
                    await asyncio.sleep(0.01)
            return hits[0]

        pcm = load_speech(16_000)[16_000 : 16_000 + int(TURN_S * 16_000) * 2]
        for turn in range(2):
            mark = len(events)
            for offset in range(0, len(pcm), 3200):
                await session.append_audio(pcm[offset : offset + 3200])
            await session.commit(item_id=f"item_{turn}", response_id=f"resp_{turn}")
            started = await until(lambda e, m=mark: isinstance(e, port.EngineAudio) and e in events[m:])
            if turn == 0:
                old = session._ws
                old.transport.abort()  # the network drops the socket; the server keeps the session
            done = await until(
                lambda e, rid=started.response_id: (
                    isinstance(e, port.EngineResponseDone) and e.response_id == rid
                )  # type: ignore[attr-defined]
            )
            assert done.status == "completed"  # type: ignore[attr-defined]
            audio = b"".join(
                e.pcm
                for e in events[mark:]
                if isinstance(e, port.EngineAudio) and e.response_id == started.response_id  # type: ignore[attr-defined]
            )
            assert abs(len(audio) / 2 / 24_000 - TURN_S) < 0.05  # nothing lost, nothing twice
        assert session._ws is not old
        assert not [e for e in events if isinstance(e, port.EngineError)]
        await session.close("done")
        await asyncio.wait_for(reader, 5)
    finally:
        await engine.shutdown()


async def test_a_server_killed_mid_call_fails_only_its_own_callers(
    front: Gateway, backends: list[Backend]
) -> None:
    before = [b.opened() for b in backends]
    first = await Caller.connect(front)
    on = next(i for i, b in enumerate(backends) if b.opened() > before[i])
    second = await Caller.connect(front)  # the least-loaded server: the other one
    assert [b.opened() - n for b, n in zip(backends, before, strict=True)] == [1, 1]
    doomed, survivor = (first, second) if on == 0 else (second, first)
    try:
        for caller in (doomed, survivor):
            await caller.turn()
        for caller in (doomed, survivor):
            await caller.log.wait_for("response.output_audio.delta", timeout=20)
        backends[0].proc.kill()
        killed_at = time.monotonic()
        _, error = await doomed.log.wait_for("error", timeout=5)
        took = time.monotonic() - killed_at
        assert took < 1.0, f"the caller heard of the failure after {took:.3f} s"
        assert error["error"]["code"] == "engine_error"
        await asyncio.wait_for(doomed.ws.wait_closed(), 5)
        assert doomed.ws.close_code == 4003
        # The other server's caller streams on to the end of its reply.
        mark = len(survivor.log.events)
        _, done = await survivor.log.wait_for("response.done", timeout=20)
        assert done["response"]["status"] == "completed"
        assert survivor.audio_s(mark) > 0  # audio kept coming after the kill
        assert abs(survivor.audio_s() - TURN_S) < 0.1
        assert not [e for e in survivor.log.events if e["type"] == "error"]
        # New callers go to the surviving server, and the survivor's caller takes another turn.
        late = await Caller.connect(front)
        try:
            assert backends[1].opened() - before[1] == 2
            await late.turn(0.5)
            _, done = await late.log.wait_for("response.done", timeout=20)
            assert done["response"]["status"] == "completed"
        finally:
            await late.close()
        mark = len(survivor.log.events)
        await survivor.turn(0.5)
        await survivor.log.wait_for(lambda e: e["type"] == "response.done", timeout=20, start=mark)
        assert front.readyz()["status"] == "ready"
    finally:
        for caller in (doomed, survivor):
            await caller.close()


#: vLLM-Omni session fields a client opens with, and what vLLM-Omni's session config holds for each.
KNOBS: dict[str, Any] = {
    "ref_audio": "data:audio/wav;base64,UklGRg==",
    "temperature": 0.6,
    "max_output_tokens": 128,
    "overlap_policy": "listen_only",
    "overlap_short_ack_ms": 500,
    "overlap_barge_in_ms": 900,
    "overlap_silence_rms": 0.01,
    "idle_timeout_s": 42.0,
    "input_audio_noise_reduction": {"type": "far_field"},
    "initial_user_text": "hello there",
    "voice": "alloy",
    "extra_body": {"force_listen_count": 2, "auto_response": True},
    "turn_detection": None,
}


def _configs(backends: list[Backend]) -> list[dict[str, Any]]:
    return [c["config"] for b in backends for c in read_calls(b.calls) if c["call"] == "session_config"]


async def test_session_fields_reach_the_backend_and_only_changes_are_sent(
    front: Gateway, backends: list[Backend]
) -> None:
    caller = Caller(await ws_connect(front, "/v1/duplex", close_timeout=1))
    ws, log = caller.ws, caller.log
    try:
        await send_json(ws, {"type": "session.update", "session": KNOBS})
        _, created = await log.wait_for("session.created", timeout=20)
        assert created["session"]["temperature"] == 0.6  # echoed
        (opened,) = [c for c in _configs(backends) if c.get("initial_user_text") == "hello there"]
        for key in (
            "ref_audio",
            "temperature",
            "overlap_policy",
            "overlap_short_ack_ms",
            "overlap_barge_in_ms",
            "overlap_silence_rms",
            "idle_timeout_s",
            "initial_user_text",
            "voice",
        ):
            assert opened[key] == KNOBS[key], key
        assert opened["max_tokens"] == 128
        extra = opened["extra_body"]
        # auto_response too: the backend's own turn-taking answers the commits.
        assert extra["force_listen_count"] == 2 and extra["auto_response"] is True
        assert extra["realtime_input_audio_noise_reduction"] == {"type": "far_field"}

        # A reply makes audio; then an update: the voice is not sent again, so the backend takes it.
        await caller.turn(respond=False)
        await log.wait_for("response.done", timeout=20)
        mark = len(log.events)
        await send_json(ws, {"type": "session.update", "session": {**KNOBS, "temperature": 0.9}})
        await log.wait_for("session.updated", start=mark, timeout=10)
        assert [c for c in _configs(backends) if c.get("temperature") == 0.9 and c.get("voice") == "alloy"]
        # A new voice now: the backend refuses it, the client gets an error and no session.updated.
        mark = len(log.events)
        await send_json(ws, {"type": "session.update", "event_id": "evt_v", "session": {"voice": "nova"}})
        _, error = await log.wait_for("error", start=mark, timeout=10)
        assert error["error"]["event_id"] == "evt_v"
        assert "voice_update_after_audio_unsupported" in error["error"]["message"]
        await send_json(ws, {"type": "session.heartbeat"})
        await log.wait_for("session.heartbeat_ack", start=mark, timeout=10)
        assert "session.updated" not in [e["type"] for e in log.events[mark:]]
    finally:
        await caller.close()
    await front.wait_sessions(0, timeout=10)
