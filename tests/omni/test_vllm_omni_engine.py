"""Engine ``vllm-omni``: native duplex sessions of a real ``DuplexOmni``, behind a real gateway.

The gateway process runs ``serve --engine vllm-omni --omni-factory
tests.omni.fake_stage:duplex_omni``: vLLM-Omni's DuplexOmni, session manager and
runner, orchestrator thread and output processor, with a fake model stage that
echoes each committed turn back in chunks with a transcript. Clients are
vLLM-Omni's own ``DuplexClient`` and the ``openai`` SDK.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from openai import AsyncOpenAI
from vllm_omni.clients.duplex import AudioFormat, DuplexClient, ResponseHandle, SessionConfig

from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, load_speech, speech_turn, stream_audio
from tests.omni.conftest import CHUNK_DELAY_MS, CHUNKS, read_calls, start_omni_gateway, wait_calls

pytestmark = pytest.mark.e2e

MODEL = "fake-echo"
TURN_S = 1.5


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory, calls_path: Path) -> Gateway:
    return start_omni_gateway(
        module_gateway_factory,
        engine="vllm-omni",
        omni_factory="tests.omni.fake_stage:duplex_omni",
        calls=calls_path,
        name="vllm-omni",
        # Turns are sent faster than real time to keep the tests short.
        config={"limits": {"input_rate_factor": 50, "input_burst_ms": 60_000}},
    )


def _speech(seconds: float, rate: int) -> bytes:
    speech = load_speech(rate)
    start = int(0.5 * rate) * 2  # the fixture's speech starts ≈0.5 s in
    return speech[start : start + int(seconds * rate) * 2]


def _as_float(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0


def _similarity(a: np.ndarray, b: np.ndarray) -> float:
    n = min(a.size, b.size)
    a, b = a[:n], b[:n]
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))


class Duplex:
    """A ``DuplexClient`` session plus every event it received, in order."""

    def __init__(self, client: DuplexClient) -> None:
        self.client = client
        self.events: list[dict[str, Any]] = []
        self._responses = client.responses()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.client.events():
            self.events.append(event.raw)

    async def turn(self, pcm: bytes) -> ResponseHandle:
        """Send one committed caller turn and ask for a reply; its response handle."""
        await self.client.stream_pcm(pcm, chunk_ms=100, realtime=False)
        # The commit's response_create asks the gateway for the reply.
        await self.client.commit(create_response=True)
        return await asyncio.wait_for(anext(self._responses), 10)

    async def wait_done(self, response_id: str, timeout: float = 10) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.events:
                    if event.get("type") == "response.done" and event["response"]["id"] == response_id:
                        return event
                await asyncio.sleep(0.02)

    def index(self, match: Any) -> int:
        return next(i for i, e in enumerate(self.events) if match(e))

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def duplex_client(gateway: Gateway) -> AsyncIterator[Duplex]:
    config = SessionConfig(
        input_audio=AudioFormat("pcm16", 16_000),
        output_audio=AudioFormat("pcm16", 24_000),
        turn_detection=None,
        auto_response=False,
    )
    async with DuplexClient(
        gateway.ws_url, model=MODEL, config=config, reconnect=None, heartbeat_interval_s=None
    ) as client:
        session = Duplex(client)
        try:
            yield session
        finally:
            await session.aclose()


async def _audio_of(handle: ResponseHandle) -> bytes:
    chunks = [chunk async for chunk in handle.audio()]
    return b"".join(chunks)


async def _settle(duplex: Duplex, calls_path: Path, aborts_before: int) -> None:
    """After a reply is stopped: wait until the stage has aborted it, then for any chunk in flight."""
    await wait_calls(calls_path, lambda c: c["call"] == "stage.abort", count=aborts_before + 1)
    # Deliberately let time pass: a chunk produced before the abort may still be on its way
    # through vLLM-Omni; none may reach the client.
    await asyncio.sleep(2 * CHUNK_DELAY_MS / 1000)
    # Everything the gateway sent before it answers this heartbeat is in duplex.events.
    start = len(duplex.events)
    await duplex.client.send({"type": "session.heartbeat"})
    async with asyncio.timeout(5):
        while "session.heartbeat_ack" not in [e.get("type") for e in duplex.events[start:]]:
            await asyncio.sleep(0.02)


async def test_duplex_client_turns_cancel_barge_in_and_close(gateway: Gateway, calls_path: Path) -> None:
    opened_before = len([c for c in read_calls(calls_path) if c["call"] == "open_session"])
    pcm = _speech(TURN_S, 16_000)
    async with duplex_client(gateway) as duplex:
        assert duplex.client.session_id
        # -- three consecutive turns: the first one's playback reported by the client, the
        #    second one never reported; the third is answered all the same.
        for turn in range(3):
            handle = await duplex.turn(pcm)
            audio = await _audio_of(handle)
            await handle.wait(5)
            assert (
                handle.done_event is not None and handle.done_event.raw["response"]["status"] == "completed"
            )
            assert handle.transcript == f"(echo of {TURN_S:.1f} s of your audio)", handle.transcript
            # The echo of the caller's turn, at 24 kHz: same length, same sound.
            assert abs(len(audio) / 2 / 24_000 - TURN_S) < 0.05, len(audio)
            expected = _as_float(_speech(TURN_S, 24_000))
            assert _similarity(_as_float(audio), expected) > 0.9
            deltas = [
                e
                for e in duplex.events
                if e.get("type") == "response.output_audio.delta"
                and e.get("response_id") == handle.response_id
            ]
            assert len(deltas) == CHUNKS, "each engine chunk is its own audio delta"
            if turn == 0:
                await duplex.client.ack_playback(handle.played_ms, response_id=handle.response_id)

        # -- a reply cancelled mid-way: nothing of it after its response.done
        handle = await duplex.turn(pcm)
        first = await anext(handle.audio())
        assert first
        aborts = len([c for c in read_calls(calls_path) if c["call"] == "stage.abort"])
        await duplex.client.cancel_response(handle.response_id)
        done = await duplex.wait_done(str(handle.response_id))
        assert done["response"]["status"] == "cancelled", done
        await _settle(duplex, calls_path, aborts)
        i_done = duplex.index(lambda e: e is done)
        late = [e["type"] for e in duplex.events[i_done + 1 :] if e.get("response_id") == handle.response_id]
        assert not late, f"events of the cancelled response after its response.done: {late}"

        # -- barge-in (vLLM-Omni's ``barge_in`` event) while the next reply plays
        handle = await duplex.turn(pcm)
        assert await anext(handle.audio())
        aborts = len([c for c in read_calls(calls_path) if c["call"] == "stage.abort"])
        await duplex.client.send({"type": "barge_in"})
        done = await duplex.wait_done(str(handle.response_id))
        assert done["response"]["status"] == "cancelled", done
        await _settle(duplex, calls_path, aborts)
        i_done = duplex.index(lambda e: e is done)
        late = [e["type"] for e in duplex.events[i_done + 1 :] if e.get("response_id") == handle.response_id]
        assert not late, f"events of the barged-in response after its response.done: {late}"

        # -- and the session still answers
        handle = await duplex.turn(pcm)
        assert len(await _audio_of(handle)) > 0
        await handle.wait(5)
        errors = [e for e in duplex.events if e.get("type") == "error"]
        assert not errors, errors
        session_id = duplex.client.session_id
        await duplex.client.close()
        assert duplex.events[-1]["type"] == "session.closed", duplex.events[-3:]

    body = await gateway.wait_sessions(0)
    assert body["status"] == "ready"
    # Every engine session the gateway opened was closed again.
    calls = read_calls(calls_path)
    opened = [c["session_id"] for c in calls if c["call"] == "open_session"]
    closed = {c["session_id"] for c in calls if c["call"] == "close_session"}
    assert len(opened) == opened_before + 1, (session_id, opened)
    assert set(opened) <= closed
    # The cancelled and barged-in replies were aborted in the stage, not just hidden.
    assert len([c for c in calls if c["call"] == "stage.abort"]) >= 2


async def test_openai_sdk_server_vad_turns(gateway: Gateway, calls_path: Path) -> None:
    """The gateway's VAD finds the turns; the SDK never reports playback; every turn is answered."""
    client = AsyncOpenAI(api_key="test", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        log = EventLog(conn.recv_bytes)
        try:
            await log.wait_for("session.created", 30)
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["audio"],
                    "audio": {
                        "input": {
                            "format": {"type": "audio/pcm", "rate": 24000},
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 400},
                        },
                        "output": {"format": {"type": "audio/pcm", "rate": 24000}},
                    },
                }
            )
            await log.wait_for("session.updated", 5)
            turn = speech_turn(before_ms=400, after_ms=900)
            for n in range(2):
                mark = len(log.events)
                await stream_audio(conn, turn, frame_ms=20, speed=1.4, lead_ms=1500, timeout=30)
                i_created, resp = await log.wait_for("response.created", 10, start=mark)
                rid = resp["response"]["id"]
                i_done, done = await log.wait_for(
                    lambda e, rid=rid: e["type"] == "response.done" and e["response"]["id"] == rid,
                    15,
                    start=i_created,
                )
                assert done["response"]["status"] == "completed", (n, done)
                audio = b"".join(
                    base64.b64decode(e["delta"])
                    for e in log.events[i_created:i_done]
                    if e["type"] == "response.output_audio.delta"
                )
                assert len(audio) / 2 / 24_000 > 2.0, (n, len(audio))
                transcript = "".join(
                    e["delta"]
                    for e in log.events[i_created:i_done]
                    if e["type"] == "response.output_audio_transcript.delta"
                )
                assert transcript.startswith("(echo of "), transcript
        finally:
            await log.aclose()
    await client.close()
    await gateway.wait_sessions(0)
