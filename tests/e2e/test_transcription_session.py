"""Transcription sessions (``session.type: "transcription"``) on the embedded engine, over the wire.

The caller's turns are found by the gateway's VAD and transcribed by the embedded
engine's recognizers; no reply is ever made. Every event is validated strictly
against the ``openai`` SDK's models, as a strict client would.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    load_speech,
    silence,
    stream_audio,
    ws_connect,
)
from tests.sdk_models import validate_server_event
from tests.wer import wer

pytestmark = pytest.mark.e2e

#: The fixture sentence the turns speak.
SAID = "Please send me the weather report for Tuesday morning."


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    config = {"server": {"web_demo": False}, "engine": {"name": "embedded"}, "limits": {"max_sessions": 2}}
    return module_gateway_factory.start(config, name="embedded-transcription")


async def _speak_two_turns(ws: Any, log: EventLog) -> list[str]:
    """Two spoken turns in real time; the final transcripts, one per turn."""
    turn = silence(300) + load_speech() + silence(900)
    await stream_audio(ws, turn + turn, realtime=True)
    finals: list[str] = []
    start = 0
    for _ in range(2):
        start, event = await log.wait_for(
            "conversation.item.input_audio_transcription.completed", 30, start=start
        )
        finals.append(event["transcript"])
        start += 1
    return finals


def _check_no_reply_and_strict(log: EventLog) -> None:
    kinds = [e["type"] for e in log.events]
    assert not [k for k in kinds if k.startswith("response.")], kinds
    assert "error" not in kinds, [e for e in log.events if e["type"] == "error"]
    for event in log.events:
        validate_server_event(event)


async def test_a_transcription_session_opened_by_intent(gateway: Gateway) -> None:
    async with ws_connect(gateway, "/v1/realtime?intent=transcription") as ws:
        log = EventLog(ws.recv)
        _, created = await log.wait_for("session.created", 5)
        assert created["session"]["type"] == "transcription"
        assert created["session"]["audio"]["input"]["transcription"] is not None
        finals = await _speak_two_turns(ws, log)
        assert all(wer(SAID, final) <= 0.25 for final in finals), finals
        await asyncio.sleep(1.0)  # a reply, were one made, would have started by now
        _check_no_reply_and_strict(log)
        # Asking for a reply is refused with a reason; the session goes on.
        await ws.send(json.dumps({"type": "response.create", "event_id": "evt_reply"}))
        _, error = await log.wait_for("error", 5)
        assert error["error"]["code"] == "invalid_event" and error["error"]["event_id"] == "evt_reply"
        await log.aclose()


async def test_a_transcription_session_by_session_update_echoes_its_settings(gateway: Gateway) -> None:
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        _, created = await log.wait_for("session.created", 5)
        assert created["session"]["type"] == "realtime"
        # A session's type is set once; a realtime session cannot become a transcription one.
        await ws.send(json.dumps({"type": "session.update", "session": {"type": "transcription"}}))
        _, error = await log.wait_for("error", 5)
        assert error["error"]["param"] == "session.type"
        await log.aclose()

    async with ws_connect(gateway, "/v1/realtime?intent=transcription") as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created", 5)
        asked = {"model": "gpt-4o-transcribe", "language": "en", "prompt": "weather, Tuesday"}
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "transcription",
                        "audio": {
                            "input": {
                                "format": {"type": "audio/pcmu"},
                                "transcription": asked,
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                            }
                        },
                    },
                }
            )
        )
        _, updated = await log.wait_for("session.updated", 5)
        assert updated["session"]["audio"]["input"]["transcription"] == asked
        # Telephone-band μ-law, as a phone bridge would send it.
        turn = (
            silence(600, 8000, "g711_ulaw")
            + load_speech(8000, "g711_ulaw")
            + silence(1000, 8000, "g711_ulaw")
        )
        await stream_audio(ws, turn, realtime=True, rate=8000, fmt="g711_ulaw")
        _, event = await log.wait_for("conversation.item.input_audio_transcription.completed", 30)
        assert wer(SAID, event["transcript"]) <= 0.3, event["transcript"]
        await asyncio.sleep(1.0)
        _check_no_reply_and_strict(log)
        await log.aclose()
