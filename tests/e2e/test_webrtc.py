"""OpenAI's WebRTC interface on a real gateway: an aiortc caller doing what OpenAI's guide describes.

The caller posts its SDP offer to ``/v1/realtime/calls``, talks on its audio track and reads the
events on ``oai-events``; every packet stays on 127.0.0.1.
"""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.webrtc_client import RATE, Caller, offer_loopback
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS, load_speech

pytestmark = pytest.mark.e2e


def _speech48() -> bytes:
    samples = soxr.resample(load_speech(16_000), 16_000, RATE)
    return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()


@pytest.fixture
def echo_gateway(gateway_factory: GatewayFactory) -> Gateway:
    offer_loopback()
    return gateway_factory.start(
        {"server": {"web_demo": False}, "webrtc": {"host_addresses": ["127.0.0.1"]}}, name="webrtc-echo"
    )


async def test_a_caller_is_answered_on_the_track(echo_gateway: Gateway) -> None:
    caller = Caller(echo_gateway.base_url)
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        caller.mic.say(_speech48())
        _, created = await caller.wait_for("response.created", timeout=20)
        started_at, started = await caller.wait_for("output_audio_buffer.started", timeout=10)
        _, done = await caller.wait_for("response.done", timeout=20)
        stopped_at, stopped = await caller.wait_for("output_audio_buffer.stopped", timeout=20)
        types = caller.types()
        assert "response.output_audio.delta" not in types, "reply audio goes on the track, not the channel"
        assert started["response_id"] == stopped["response_id"] == created["response"]["id"]
        loud = caller.loud_frames(started_at - 0.1, stopped_at + 0.5)
        speech_s = (SPEECH_END_MS - SPEECH_START_MS) / 1000
        assert len(loud) * 0.02 > 0.6 * speech_s, (len(loud), types)
        assert done["response"]["status"] == "completed"
    finally:
        await caller.close()
