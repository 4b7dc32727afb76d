"""The official ``openai`` SDK's realtime client against a real gateway.

``AsyncOpenAI(websocket_base_url="ws://127.0.0.1:PORT/v1").realtime.connect(model=...)``
connects to ``/v1/realtime``. Events are read as raw bytes (``recv_bytes``) so the
gateway's ``server_event_seq`` extension can be checked, and each one is validated,
exactly as received, against the SDK's server-event models in strict mode (the SDK's
own ``parse_event`` accepts any type at all, so it proves nothing).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
from openai import AsyncOpenAI
from openai.types.realtime import ResponseAudioDeltaEvent, ResponseDoneEvent

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    duration_ms,
    load_speech,
    speech_turn,
    stream_audio,
)
from tests.sdk_models import validate_server_event

pytestmark = pytest.mark.e2e

MODEL = "gpt-realtime"


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 100}},
        },
        name="sdk",
    )


class SdkSession:
    """An SDK connection plus a background reader of its raw events."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.log = EventLog(conn.recv_bytes)
        self.parsed: list[Any] = []

    def check_parsed(self) -> None:
        """Every raw event validates strictly as one of the SDK's server events."""
        for raw in self.log.events[len(self.parsed) :]:
            self.parsed.append(validate_server_event(raw))


@pytest.fixture
async def sdk(gateway: Gateway) -> AsyncIterator[SdkSession]:
    client = AsyncOpenAI(api_key="test", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with asyncio.timeout(10):
        manager = client.realtime.connect(model=MODEL)
        conn = await manager.__aenter__()
    session = SdkSession(conn)
    try:
        yield session
    finally:
        await session.log.aclose()
        async with asyncio.timeout(10):
            await manager.__aexit__(None, None, None)
        await client.close()
        await gateway.wait_sessions(0)


def _assert_seq(events: list[dict[str, Any]]) -> None:
    seqs = [e.get("server_event_seq") for e in events]
    assert all(isinstance(s, int) for s in seqs), seqs
    assert seqs == list(range(1, len(seqs) + 1)), f"server_event_seq not 1, 2, 3, ...: {seqs[:50]}"
    ids = [e.get("event_id") for e in events]
    assert len(set(ids)) == len(ids), "event_id values repeat"


async def test_server_vad_turn_then_cancelled_turn(sdk: SdkSession, gateway: Gateway) -> None:
    conn, log = sdk.conn, sdk.log
    _, created = await log.wait_for("session.created", 5)
    assert created["session"]["type"] == "realtime"

    # -- (a) one caller turn found by server VAD, echoed back in full -----------------------
    await conn.session.update(
        session={
            "type": "realtime",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}},
            },
        }
    )
    _, updated = await log.wait_for("session.updated", 5)
    assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"

    turn = speech_turn(before_ms=1000, after_ms=1000)
    # The first 1.5 s go out at once (half the 3 s burst allowance), the rest at 1.4x real time.
    await stream_audio(conn, turn, frame_ms=20, speed=1.4, lead_ms=1500, timeout=20)
    i_start, started = await log.wait_for("input_audio_buffer.speech_started", 5)
    i_stop, stopped = await log.wait_for("input_audio_buffer.speech_stopped", 5, start=i_start)
    i_commit, committed = await log.wait_for("input_audio_buffer.committed", 5, start=i_stop)
    assert started["item_id"] == stopped["item_id"] == committed["item_id"]
    assert 500 <= started["audio_start_ms"] < stopped["audio_end_ms"] <= duration_ms(turn)
    i_created, resp_created = await log.wait_for("response.created", 5, start=i_commit)
    response_id = resp_created["response"]["id"]
    i_done, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id, 15, start=i_created
    )
    assert done["response"]["status"] == "completed", done
    # As vLLM-Omni's server does, rate_limits.updated follows response.done at once.
    i_limits, _ = await log.wait_for("rate_limits.updated", 5, start=i_done)
    assert i_limits == i_done + 1

    sdk.check_parsed()
    deltas = [m for m in sdk.parsed[i_created:i_done] if isinstance(m, ResponseAudioDeltaEvent)]
    assert len(deltas) >= 10
    assert all(d.response_id == response_id for d in deltas)
    echoed_ms = sum(duration_ms(base64.b64decode(d.delta)) for d in deltas)
    turn_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
    assert abs(echoed_ms - turn_ms) <= 600, (echoed_ms, turn_ms)
    # The fixture holds ≈4.4 s of audio, most of it speech.
    assert 2500 <= echoed_ms <= 5500, echoed_ms
    parsed_done = sdk.parsed[i_done]
    assert isinstance(parsed_done, ResponseDoneEvent)
    assert parsed_done.response.status == "completed"
    order = log.types()
    assert order.index("response.created") < order.index("response.output_audio.delta") < i_done

    # -- (b) client-committed turn, cancelled mid-reply -----------------------------------------
    mark = len(log.events)
    await conn.session.update(session={"type": "realtime", "audio": {"input": {"turn_detection": None}}})
    _, updated = await log.wait_for("session.updated", 5, start=mark)
    assert updated["session"]["audio"]["input"]["turn_detection"] is None

    speech = load_speech()[: 24000 * 2 * 2]  # 2 s: well within the burst allowance
    for offset in range(0, len(speech), 4800):  # 100 ms frames
        await conn.input_audio_buffer.append(audio=b64(speech[offset : offset + 4800]))
    await conn.input_audio_buffer.commit()
    i_commit, _ = await log.wait_for("input_audio_buffer.committed", 5, start=mark)
    await conn.response.create()
    i_created, resp_created = await log.wait_for("response.created", 5, start=i_commit)
    response_id = resp_created["response"]["id"]

    def is_delta(e: dict[str, Any]) -> bool:
        return e["type"] == "response.output_audio.delta" and e["response_id"] == response_id

    index = i_created
    for _ in range(3):
        index, _ = await log.wait_for(is_delta, 5, start=index)
        index += 1
    await conn.response.cancel()
    i_done, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response_id"] == response_id, 5, start=i_created
    )
    assert done["response"]["status"] == "cancelled", done
    assert (done["response"]["status_details"] or {}).get("reason") == "client_cancelled", done
    i_limits, _ = await log.wait_for("rate_limits.updated", 5, start=i_done)
    assert i_limits == i_done + 1
    heard = sum(
        duration_ms(base64.b64decode(e["delta"])) for e in log.events[i_created:i_done] if is_delta(e)
    )
    assert heard < 1500, f"the reply was not cut short ({heard} ms of 2000 ms)"

    # At pace 1.0 the echo would still be talking for ≈1.5 s: nothing of it may arrive now.
    await asyncio.sleep(1.2)
    late = [e["type"] for e in log.events[i_done + 1 :] if e.get("response_id") == response_id]
    assert not [t for t in late if "delta" in t], (
        f"events of the cancelled response after response.done: {late}"
    )

    # The session still answers, and every event so far carried server_event_seq 1, 2, 3 ...
    await conn.send({"type": "input_audio_buffer.clear"})
    await log.wait_for("input_audio_buffer.cleared", 5, start=i_done)
    sdk.check_parsed()
    _assert_seq(log.events)


async def test_sdk_cancel_without_response_is_an_error_and_session_survives(sdk: SdkSession) -> None:
    conn, log = sdk.conn, sdk.log
    await log.wait_for("session.created", 5)
    await conn.response.cancel(event_id="evt_cancel_1")
    _, err = await log.wait_for("error", 5)
    assert err["error"]["code"] == "response_cancel_not_active"
    assert err["error"]["event_id"] == "evt_cancel_1"
    sdk.check_parsed()
    await conn.input_audio_buffer.commit(event_id="evt_commit_1")
    _, err = await log.wait_for(
        lambda e: e["type"] == "error" and e["error"]["event_id"] == "evt_commit_1", 5
    )
    assert err["error"]["code"] == "input_audio_buffer_commit_empty"
    # Clearing output audio with no reply in progress changes nothing: OpenAI's
    # output_audio_buffer.cleared must name a reply, so none is sent.
    mark = len(log.events)
    await conn.output_audio_buffer.clear(event_id="evt_clear_1")
    await conn.input_audio_buffer.clear()
    await log.wait_for("input_audio_buffer.cleared", 5, start=mark)
    assert log.types(mark) == ["input_audio_buffer.cleared"], log.types(mark)
    sdk.check_parsed()
    _assert_seq(log.events)
