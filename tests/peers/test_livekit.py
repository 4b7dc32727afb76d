"""LiveKit Agents' OpenAI realtime plugin at its defaults against a real gateway (no LiveKit server).

``RealtimeModel(base_url=...).session()`` opens its own WebSocket. LiveKit filters some
errors by OpenAI's words: a ``response.cancel`` that crosses the server's own cancel of
a reply (a barge-in) is expected to be answered "Cancellation failed: ...", and any
other error is logged at ERROR and raised as a session error. Its default turn
detection is ``semantic_vad`` with ``eagerness: "medium"``, which ``session.updated``
echoes as sent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "livekit.plugins.openai",
    reason="LiveKit's plugin runs in .venv-peers (make test runs it there, where it must be installed)",
)

from livekit import rtc
from livekit.plugins.openai.realtime import RealtimeModel

from tests.e2e.helpers import Gateway, GatewayFactory, load_speech, speech_turn

pytestmark = pytest.mark.e2e

RATE = 24_000
FRAME_MS = 20
TIMEOUT_S = 30.0


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def livekit_errors() -> Iterator[list[logging.LogRecord]]:
    """What LiveKit Agents logs at ERROR while the test runs."""
    handler = _Records()
    logger = logging.getLogger("livekit")
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start({"server": {"web_demo": False}}, name="livekit-echo")


def _frames(pcm: bytes) -> Iterator[rtc.AudioFrame]:
    step = RATE * FRAME_MS // 1000 * 2
    for offset in range(0, len(pcm) - step + 1, step):
        yield rtc.AudioFrame(
            data=pcm[offset : offset + step], sample_rate=RATE, num_channels=1, samples_per_channel=step // 2
        )


async def _speak_live(session: Any, pcm: bytes) -> None:
    """Push ``pcm`` as a microphone does, one frame every FRAME_MS."""
    for frame in _frames(pcm):
        session.push_audio(frame)
        await asyncio.sleep(FRAME_MS / 1000)


async def _wait_for(events: list[dict[str, Any]], kind: str, after: int = 0) -> dict[str, Any]:
    """The first server event of type ``kind`` LiveKit received past index ``after``."""
    try:
        async with asyncio.timeout(TIMEOUT_S):
            while True:
                for event in events[after:]:
                    if event["type"] == kind:
                        return event
                await asyncio.sleep(0.02)
    except TimeoutError:
        seen = [event["type"] for event in events[after:] if event["type"] != "response.output_audio.delta"]
        raise AssertionError(f"no {kind} in {TIMEOUT_S:g} s; LiveKit received {seen}") from None


async def test_a_cancel_that_crosses_the_gateways_barge_in_is_no_error(
    gateway: Gateway, livekit_errors: list[logging.LogRecord]
) -> None:
    model = RealtimeModel(base_url=f"{gateway.base_url}/v1", api_key="sk-test")
    session = model.session()
    received: list[dict[str, Any]] = []
    session_errors: list[object] = []
    session.on("openai_server_event_received", received.append)
    session.on("error", session_errors.append)
    # What LiveKit's AgentActivity does when the caller starts speaking over the agent: it
    # interrupts the reply, and the plugin sends response.cancel while the reply is its own.
    session.on("input_speech_started", lambda _: session.interrupt())
    try:
        await _wait_for(received, "session.updated")
        # The caller's first turn; the echo engine answers by saying it back (seconds long).
        for frame in _frames(speech_turn(RATE)):
            session.push_audio(frame)
        await _wait_for(received, "response.output_audio.delta")
        mark = len(received)
        # The caller talks over the reply, live: the gateway cancels it the moment it hears speech.
        talking = asyncio.create_task(_speak_live(session, load_speech(RATE)))
        try:
            await _wait_for(received, "input_audio_buffer.speech_started", mark)
            cancelled = await _wait_for(received, "response.done", mark)
            assert cancelled["response"]["status"] == "cancelled"
            # LiveKit's cancel arrived after the gateway's own: OpenAI's answer, in OpenAI's words
            # (LiveKit has handled it by the time it is seen here: it reports each event, then
            # handles it, in one step).
            answer = await _wait_for(received, "error", mark)
        finally:
            talking.cancel()
    finally:
        await session.aclose()
        await model.aclose()
    assert [r.getMessage() for r in livekit_errors] == []
    assert session_errors == []
    assert answer["error"]["code"] == "response_cancel_not_active"
    assert answer["error"]["message"].startswith("Cancellation failed: no active response found")


async def test_semantic_vad_eagerness_is_echoed_as_livekit_sent_it(
    gateway: Gateway, livekit_errors: list[logging.LogRecord]
) -> None:
    model = RealtimeModel(base_url=f"{gateway.base_url}/v1", api_key="sk-test")
    session = model.session()
    sent: list[dict[str, Any]] = []
    received: list[dict[str, Any]] = []
    session.on("openai_client_event_queued", sent.append)
    session.on("openai_server_event_received", received.append)
    try:
        updated = await _wait_for(received, "session.updated")
    finally:
        await session.aclose()
        await model.aclose()
    update = next(event for event in sent if event["type"] == "session.update")
    asked = update["session"]["audio"]["input"]["turn_detection"]
    assert (asked["type"], asked["eagerness"]) == ("semantic_vad", "medium")  # LiveKit's default
    echoed = updated["session"]["audio"]["input"]["turn_detection"]
    assert {key: echoed[key] for key in asked} == asked
    assert [r.getMessage() for r in livekit_errors] == []
