"""OpenAI's WebRTC interface on a real gateway: an aiortc caller doing what OpenAI's guide describes.

The caller posts its SDP offer to ``/v1/realtime/calls``, talks on its audio track and reads the
events on ``oai-events``; every packet stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import logging

import httpx2
import pytest
from aiortc import RTCPeerConnection

from tests.e2e.helpers import Gateway, GatewayFactory, recv_until, ws_connect
from tests.e2e.webrtc_client import Caller, Microphone, offer_loopback, speech
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)


async def test_a_caller_is_answered_on_the_track(webrtc_gateway: Gateway) -> None:
    caller = Caller(webrtc_gateway.base_url)
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        caller.mic.say(speech())
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


#: The issue's bound: the track is silent this soon after the gateway cut the reply.
CUT_BOUND_S = 0.3


@pytest.mark.parametrize("pace", [1.0, 20.0], ids=["made_as_it_plays", "made_ahead"])
async def test_barge_in_stops_the_track_and_truncates_at_what_was_played(
    pace: float, gateway_factory: GatewayFactory
) -> None:
    """``echo`` in real time (the session cuts the reply it is making) and 20 times faster (the
    reply is made before it plays: the dialect cuts what the track is playing)."""
    offer_loopback()
    gateway = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"echo": {"pace": pace}},
            "webrtc": {"host_addresses": ["127.0.0.1"]},
        },
        name="webrtc-echo-barge-in",
    )
    caller = Caller(gateway.base_url)
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        sentence = speech()
        caller.mic.say(sentence)
        started_at, started = await caller.wait_for("output_audio_buffer.started", timeout=20)
        mark = len(caller.events)
        # The caller speaks again a second into the reply (the clip opens with 0.5 s of silence).
        await asyncio.sleep(0.5)
        caller.mic.say(sentence)
        cleared_at, cleared = await caller.wait_for("output_audio_buffer.cleared", after=mark, timeout=10)
        _, truncated = await caller.wait_for("conversation.item.truncated", after=mark, timeout=5)
        await asyncio.sleep(1.0)
        assert cleared["response_id"] == started["response_id"]
        loud = caller.loud_frames(started_at - 0.1, cleared_at + 1.0)
        assert loud, "the reply was heard before the cut"
        assert loud[-1] <= cleared_at + CUT_BOUND_S, (
            f"the track still played {loud[-1] - cleared_at:.3f} s after the cut"
        )
        played_ms = truncated["audio_end_ms"]
        # The reply is the caller's clip: 0.5 s of silence, then speech. What the caller heard, by the
        # track's frames, is what the item keeps (a frame's 20 ms and the jitter either way).
        heard_ms = (cleared_at - started_at) * 1000
        logger.info(
            "cut: last loud frame %+.3f s after it, truncated at %d ms, heard %.0f ms",
            loud[-1] - cleared_at,
            played_ms,
            heard_ms,
        )
        assert abs(played_ms - heard_ms) < 150, (played_ms, heard_ms)
        assert "response.output_audio.delta" not in caller.types()
    finally:
        await caller.close()


async def test_the_session_sent_with_the_offer_applies_before_the_first_event(
    webrtc_gateway: Gateway,
) -> None:
    caller = Caller(webrtc_gateway.base_url)
    try:
        await caller.connect(
            session={"type": "realtime", "instructions": "Be brief.", "audio": {"output": {"voice": "marin"}}}
        )
        _, created = await caller.wait_for("session.created")
        assert created["session"]["instructions"] == "Be brief."
        assert created["session"]["audio"]["output"]["voice"] == "marin"
        # The tracks' audio, decoded to the engine's rate (echo: 24 kHz), whatever a session.update asks for.
        assert created["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
        caller.send(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"output": {"format": {"type": "audio/pcmu"}}}},
            }
        )
        _, updated = await caller.wait_for("session.updated")
        assert updated["session"]["audio"]["output"]["format"] == {"type": "audio/pcm", "rate": 24000}
        assert updated["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
    finally:
        await caller.close()


async def test_a_call_is_hung_up_by_its_id(webrtc_gateway: Gateway) -> None:
    caller = Caller(webrtc_gateway.base_url)
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        await webrtc_gateway.wait_sessions(1)
        assert caller.location is not None and caller.location.startswith("/v1/realtime/calls/rtc_")
        async with httpx2.AsyncClient() as http:
            resp = await http.post(f"{webrtc_gateway.base_url}{caller.location}/hangup")
        assert resp.status_code == 200, resp.text
        await webrtc_gateway.wait_sessions(0)
    finally:
        await caller.close()


@pytest.mark.parametrize(
    ("body", "content_type", "code"),
    [
        (b"", "application/sdp", "invalid_request"),
        (b"hello", "application/sdp", "invalid_request"),
        (b"v=0\r\nnot an offer\r\n", "application/sdp", "invalid_offer"),
        (b"{}", "application/json", "invalid_request"),
    ],
)
async def test_a_bad_offer_is_refused_with_400(
    webrtc_gateway: Gateway, body: bytes, content_type: str, code: str
) -> None:
    async with httpx2.AsyncClient() as http:
        resp = await http.post(
            f"{webrtc_gateway.base_url}/v1/realtime/calls",
            content=body,
            headers={"Content-Type": content_type},
        )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == code
    assert webrtc_gateway.readyz()["sessions"] == 0


async def test_a_call_that_never_connects_is_reaped(gateway_factory: GatewayFactory) -> None:
    offer_loopback()
    gateway = gateway_factory.start(
        {"server": {"web_demo": False}, "webrtc": {"host_addresses": ["127.0.0.1"], "connect_timeout_s": 1}},
        name="webrtc-reaper",
    )
    pc = RTCPeerConnection()
    try:
        pc.addTrack(Microphone())
        pc.createDataChannel("oai-events")
        await pc.setLocalDescription(await pc.createOffer())
        async with httpx2.AsyncClient() as http:
            resp = await http.post(
                f"{gateway.base_url}/v1/realtime/calls",
                content=pc.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
        assert resp.status_code == 201, resp.text
        # The answer is never set: no connectivity check ever comes back.
        await gateway.wait_sessions(1)
        await gateway.wait_sessions(0, timeout=5)
    finally:
        await pc.close()


async def test_a_call_over_the_session_limit_is_refused_before_it_is_answered(
    gateway_factory: GatewayFactory,
) -> None:
    offer_loopback()
    gateway = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "limits": {"max_sessions": 1},
            "webrtc": {"host_addresses": ["127.0.0.1"]},
        },
        name="webrtc-full",
    )
    first = Caller(gateway.base_url)
    second = RTCPeerConnection()
    try:
        await first.connect()
        await first.wait_for("session.created")
        second.addTrack(Microphone())
        second.createDataChannel("oai-events")
        await second.setLocalDescription(await second.createOffer())
        async with httpx2.AsyncClient() as http:
            resp = await http.post(
                f"{gateway.base_url}/v1/realtime/calls",
                content=second.localDescription.sdp,
                headers={"Content-Type": "application/sdp"},
            )
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "session_limit"
    finally:
        await first.close()
        await second.close()


async def test_the_sideband_steers_the_call_and_sees_what_it_says(webrtc_gateway: Gateway) -> None:
    caller = Caller(webrtc_gateway.base_url)
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        call_id = (caller.location or "").rsplit("/", 1)[-1]
        async with ws_connect(webrtc_gateway, f"/v1/realtime?call_id={call_id}") as sideband:
            greeting = json.loads(await asyncio.wait_for(sideband.recv(), 5))
            assert greeting["type"] == "session.created"
            await sideband.send(
                json.dumps(
                    {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}}
                )
            )
            mark = len(caller.events)
            _, updated = await caller.wait_for("session.updated", after=mark)
            assert updated["session"]["instructions"] == "Be brief."
            seen, _ = await recv_until(sideband, "session.updated")
            assert seen["session"]["instructions"] == "Be brief."
            # The call's audio is its track's: the sideband cannot send any.
            await sideband.send(json.dumps({"type": "input_audio_buffer.append", "audio": ""}))
            refused, _ = await recv_until(sideband, "error")
            assert refused["error"]["code"] == "invalid_event"
            await asyncio.sleep(0.3)
            assert "error" not in caller.types()  # told to the sideband alone
    finally:
        await caller.close()
