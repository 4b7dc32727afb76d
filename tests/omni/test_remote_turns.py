"""Every caller turn reaches a vLLM-Omni backend whole, behind engine ``remote`` (run under ``.venv-omni``).

The ``openai`` SDK at its defaults talks to a gateway running ``--engine remote``
in front of vLLM-Omni's own ``/v1/realtime`` server over the fake stage (see
:mod:`tests.omni.backend_server`). The caller sends each turn as a burst of appends
(or paced as it speaks), then ``input_audio_buffer.commit`` and ``response.create``,
waits for ``response.done``, and speaks again, in a session without turn detection
and in the session as the SDK opens it (server VAD). What the backend's model stage
received for each committed turn (its own record, not the gateway's) must be that
turn's audio, all of it where the client commits: each commit reaches the backend
after all of its turn's audio and before any of the next turn's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")
pytest.importorskip("openai", reason="the openai SDK is a test dependency")

from openai import AsyncOpenAI

from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, b64, load_speech
from tests.omni.conftest import Backend, read_calls, start_backend, stop_backends, wait_healthy

pytestmark = pytest.mark.e2e

#: The gateway's and the backend's input rate (the remote engine's default), and the caller's.
ENGINE_RATE = 16_000
CLIENT_RATE = 24_000
#: One turn: 3.96 s of the speech fixture, sent as appends of 100 ms (the last one shorter).
TURN_MS = 3_960
APPEND_MS = 100
TURNS = 3


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    # Replies of about a second, so that a caller can talk over one.
    started = start_backend(tmp_path_factory.mktemp("omni-turns"), "omni", chunks=8, chunk_delay_ms=150)
    try:
        wait_healthy([started])
        yield started
    finally:
        stop_backends([started])


@pytest.fixture(scope="module")
def front(module_gateway_factory: GatewayFactory, backend: Backend) -> Gateway:
    config = {
        "server": {"web_demo": False},
        "engine": {"name": "remote", "remote": {"backends": [{"url": backend.url, "max_sessions": 4}]}},
    }
    return module_gateway_factory.start(config, name="front-turns")


@pytest.fixture
async def sdk(front: Gateway) -> AsyncIterator[tuple[Any, EventLog]]:
    client = AsyncOpenAI(api_key="test", websocket_base_url=f"ws://127.0.0.1:{front.port}/v1")
    async with asyncio.timeout(20):
        manager = client.realtime.connect(model="gpt-realtime")
        conn = await manager.__aenter__()
    log = EventLog(conn.recv_bytes)
    try:
        await log.wait_for("session.created", timeout=20)
        yield conn, log
    finally:
        await log.aclose()
        async with asyncio.timeout(10):
            await manager.__aexit__(None, None, None)
        await client.close()
        await front.wait_sessions(0, timeout=10)


def _turn_audio() -> bytes:
    return load_speech(CLIENT_RATE)[: CLIENT_RATE * TURN_MS // 1000 * 2]


#: One turn's audio as the backend takes it: the same samples, at the engine's rate.
TURN_SAMPLES = ENGINE_RATE * TURN_MS // 1000


def _stage_requests(backend: Backend) -> set[str]:
    return {c["request_id"] for c in read_calls(backend.calls) if c.get("call") == "stage.add_request"}


def _committed_turns(backend: Backend, before: set[str]) -> list[int]:
    """The audio (samples) of each turn the backend's model stage took, in order, from its own record."""
    samples: dict[str, int] = {}
    finished: list[str] = []
    for call in read_calls(backend.calls):
        if call.get("call") != "stage.add_request" or call["request_id"] in before:
            continue
        rid = call["request_id"]
        samples[rid] = samples.get(rid, 0) + int(call["samples"])
        if not call["resumable"]:  # the turn's input is complete
            finished.append(rid)
    return [samples[rid] for rid in finished]


async def _wait_turns(backend: Backend, before: set[str], count: int) -> list[int]:
    """The backend's committed turns once it has ``count`` (or what it has after a while)."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):
            while len(_committed_turns(backend, before)) < count:
                await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # one turn more than asked for would show up by now
    return _committed_turns(backend, before)


async def _speak(conn: Any, pcm: bytes, pace: float) -> None:
    """The turn as ``input_audio_buffer.append``s of ``APPEND_MS``, at ``pace`` x real time (0: at once)."""
    step = CLIENT_RATE * APPEND_MS // 1000 * 2
    for offset in range(0, len(pcm), step):
        await conn.input_audio_buffer.append(audio=b64(pcm[offset : offset + step]))
        if pace:
            await asyncio.sleep(APPEND_MS / 1000 * pace)


@pytest.mark.parametrize("pace", [0.0, 0.25, 1.0], ids=["at-once", "4x", "real-time"])
async def test_each_commit_reaches_the_backend_with_exactly_its_own_turn(
    sdk: tuple[Any, EventLog], backend: Backend, pace: float
) -> None:
    """Turns the client commits itself: each backend turn holds exactly the audio sent for it."""
    conn, log = sdk
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await log.wait_for("session.updated", timeout=10)
    before = _stage_requests(backend)
    pcm = _turn_audio()
    for _ in range(TURNS):
        mark = len(log.events)
        await _speak(conn, pcm, pace)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        _, created = await log.wait_for("response.created", start=mark, timeout=30)
        rid = created["response"]["id"]
        _, done = await log.wait_for(
            lambda e, rid=rid: e["type"] == "response.done" and e["response"]["id"] == rid,
            start=mark,
            timeout=30,
        )
        assert done["response"]["status"] == "completed", done
    assert [e for e in log.events if e["type"] == "error"] == []
    assert await _wait_turns(backend, before, TURNS) == [TURN_SAMPLES] * TURNS


@pytest.mark.parametrize("pace", [0.0, 1.0], ids=["at-once", "real-time"])
async def test_server_vad_turns_each_reach_the_backend_once_and_whole(
    sdk: tuple[Any, EventLog], backend: Backend, pace: float
) -> None:
    """The session as the SDK opens it (server VAD): it commits, asks for a reply, waits, and again.

    The gateway's VAD ends each turn at its pause; the client's own commit and
    ``response.create`` come after that one (OpenAI answers them with errors of its
    own). Every turn reaches the backend once, none of it in another turn, and the
    session goes on.
    """
    conn, log = sdk
    before = _stage_requests(backend)
    pcm = _turn_audio()
    for _ in range(TURNS):
        mark = len(log.events)
        await _speak(conn, pcm, pace)
        await conn.input_audio_buffer.commit()
        await conn.response.create()
        await log.wait_for("response.done", start=mark, timeout=30)
        await log.wait_for("input_audio_buffer.committed", start=mark, timeout=30)
    turns = await _wait_turns(backend, before, TURNS)
    assert len(turns) == TURNS, turns
    assert all(TURN_SAMPLES // 2 < samples <= TURN_SAMPLES for samples in turns), turns
    engine_errors = [e for e in log.events if e["type"] == "error" and e["error"]["code"] == "engine_error"]
    assert not [e for e in engine_errors if "input_audio_buffer" in e["error"]["message"]], engine_errors
    assert log.ended is None  # still open


@pytest.mark.parametrize("cancel", [False, True], ids=["over-the-reply", "after-a-cancel"])
async def test_a_turn_spoken_while_a_reply_streams_reaches_the_backend_whole(
    sdk: tuple[Any, EventLog], backend: Backend, cancel: bool
) -> None:
    """The caller speaks while the reply is still streaming (cancelling it first, or not)."""
    conn, log = sdk
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    await log.wait_for("session.updated", timeout=10)
    before = _stage_requests(backend)
    pcm = _turn_audio()
    await _speak(conn, pcm, 0.0)
    await conn.input_audio_buffer.commit()
    await conn.response.create()
    _, first = await log.wait_for("response.output_audio.delta", timeout=30)
    mark = len(log.events)
    if cancel:
        await conn.response.cancel()
    await _speak(conn, pcm, 1.0)
    _, done = await log.wait_for("response.done", timeout=30)
    assert done["response"]["id"] == first["response_id"]
    assert done["response"]["status"] == ("cancelled" if cancel else "completed")
    await conn.input_audio_buffer.commit()
    await conn.response.create()
    _, created = await log.wait_for("response.created", start=mark, timeout=30)
    rid = created["response"]["id"]
    _, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, start=mark, timeout=30
    )
    assert done["response"]["status"] == "completed", done
    assert [e for e in log.events if e["type"] == "error"] == []
    assert await _wait_turns(backend, before, 2) == [TURN_SAMPLES] * 2
