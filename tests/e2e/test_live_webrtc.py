"""OpenAI's Live API over WebRTC on a real gateway: the ``openai`` SDK opens the session, aiortc calls.

The caller makes its offer (the microphone's track and a data channel whose label the Live API
leaves free), ``client.live.create`` posts it to ``POST /v1/live/sessions`` with the session at
the SDK's defaults, and the caller sets the answer. The Live events then come on the data
channel, the echoed reply on the gateway's track; every packet stays on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import typing
from collections.abc import AsyncIterator
from typing import Annotated, Any

import pytest
from openai import AsyncOpenAI
from openai.types.live import LiveCreateResponse, MediaSessionConfigParam, ServerEvent
from pydantic import Field, TypeAdapter

from tests.e2e.helpers import Gateway, GatewayFactory, recv_until, ws_connect
from tests.e2e.webrtc_client import Caller, offer_loopback, speech
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

#: OpenAI names no label for the Live events' channel: any will do.
LABEL = "live"
#: What ``client.live.create`` needs at the least.
SESSION: MediaSessionConfigParam = {"model": "gpt-live-1"}
#: The Live API's server events, discriminated by ``type`` as a strict client reads them.
_EVENTS: TypeAdapter[Any] = TypeAdapter(
    Annotated[typing.get_args(ServerEvent)[0], Field(discriminator="type")]
)
#: Speech over a reply stops its audio this soon (the Live WebSocket's bound).
BARGE_IN_BOUND_S = 0.5
#: ... and the track is silent this soon after the gateway cut the reply (the Realtime call's bound).
CUT_BOUND_S = 0.3


@contextlib.asynccontextmanager
async def _live_call(gateway: Gateway) -> AsyncIterator[tuple[Caller, str]]:
    """A Live WebRTC session opened with the SDK: the caller, and the session's id."""
    caller = Caller(gateway.base_url)
    client = AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-any", max_retries=0)
    try:
        offer = await caller.offer(label=LABEL)
        raw = await client.live.with_raw_response.create(
            session=SESSION,
            transport={"type": "webrtc", "sdp": offer},
        )
        assert raw.status_code == 201, raw.text
        # The answer as the SDK's own model has it, every field required present (nothing filled in).
        answer = LiveCreateResponse.model_validate(json.loads(raw.text), strict=True)
        assert answer == raw.parse()
        assert answer.transport.type == "webrtc" and answer.transport.sdp.startswith("v=0")
        await caller.answered(answer.transport.sdp)
        yield caller, answer.session.id
    finally:
        await caller.close()
        await client.close()


def _loud_runs(caller: Caller, start: float, end: float, gap_s: float = 0.3) -> list[tuple[float, float]]:
    """The stretches of sound the caller heard between ``start`` and ``end`` (frames ``gap_s`` apart or less)."""
    runs: list[tuple[float, float]] = []
    for at in caller.loud_frames(start, end):
        if runs and at - runs[-1][1] <= gap_s:
            runs[-1] = (runs[-1][0], at)
        else:
            runs.append((at, at))
    return runs


async def test_the_sdk_opens_a_live_session_and_its_reply_plays_on_the_track(webrtc_gateway: Gateway) -> None:
    async with _live_call(webrtc_gateway) as (caller, session_id):
        _, started = await caller.wait_for("session.started")
        assert started["session"]["id"] == session_id
        assert started["session"]["model"] == "gpt-live-1"
        # The session is the POST's: a session.start on the channel finds it started.
        caller.send({"type": "session.start", "event_id": "again", "session": SESSION})
        _, refused = await caller.wait_for("error")
        assert refused["error"]["code"] == "session_already_started"
        assert refused["error"]["client_event_id"] == "again"
        # A Realtime sideband watches the call by its session id, and steers none of it: its events
        # are the Realtime API's, not the Live API's.
        async with ws_connect(webrtc_gateway, f"/v1/realtime?call_id={session_id}") as sideband:
            await recv_until(sideband, "session.created")
            update = {"type": "session.update", "session": {"type": "realtime", "instructions": "Hi."}}
            await sideband.send(json.dumps(update))
            read_only, _ = await recv_until(sideband, "error")
            assert "read-only" in read_only["error"]["message"]
        mark = len(caller.events)
        said = asyncio.get_running_loop().time()
        caller.mic.say(speech())
        reply_at, words = await caller.wait_for("session.output_transcript.delta", after=mark, timeout=20)
        assert "echo" in words["delta"]
        await caller.wait_for("session.usage.updated", after=mark, timeout=20)
        await asyncio.sleep(0.5)
        loud = caller.loud_frames(said + SPEECH_END_MS / 1000, reply_at + 10)
        speech_s = (SPEECH_END_MS - SPEECH_START_MS) / 1000
        assert len(loud) * 0.02 > 0.6 * speech_s, len(loud)
        types = caller.types()
        assert "session.output_audio.delta" not in types, "reply audio goes on the track, not the channel"
        for _, event in caller.events:
            _EVENTS.validate_python(event, strict=True)

        # OpenAI's hang-up, by the session's id.
        client = AsyncOpenAI(base_url=f"{webrtc_gateway.base_url}/v1", api_key="sk-any", max_retries=0)
        async with client:
            await client.live.sessions.hangup(session_id)
        _, closed = await caller.wait_for("session.closed", timeout=5)
        assert closed["reason"] == "remote_hangup"
        _EVENTS.validate_python(closed, strict=True)
        await webrtc_gateway.wait_sessions(0)


@pytest.mark.parametrize("pace", [1.0, 20.0], ids=["made_as_it_plays", "made_ahead"])
async def test_speaking_over_the_reply_stops_the_track_and_the_session_keeps_what_was_played(
    pace: float, gateway_factory: GatewayFactory
) -> None:
    """``echo`` in real time (the session cancels the reply it is making) and 20 times faster (the
    reply is made before it plays: the dialect cuts what the track is playing). A Realtime observer
    of the session sees the reply's item truncated at what the track played."""
    offer_loopback()
    gateway = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"echo": {"pace": pace}},
            "webrtc": {"host_addresses": ["127.0.0.1"]},
        },
        name="live-webrtc-barge-in",
    )
    loop = asyncio.get_running_loop()
    async with _live_call(gateway) as (caller, session_id):
        await caller.wait_for("session.started")
        async with ws_connect(gateway, f"/v1/realtime?call_id={session_id}") as observer:
            await recv_until(observer, "session.created")
            sentence = speech()
            caller.mic.say(sentence)
            reply_at, _ = await caller.wait_for("session.output_transcript.delta", timeout=20)
            # The caller speaks again a second into the reply (the clip opens with 0.5 s of silence).
            await asyncio.sleep(0.5)
            said = len(caller.mic.said_at)
            caller.mic.say(sentence)
            while len(caller.mic.said_at) <= said:
                await asyncio.sleep(0.005)
            onset = caller.mic.said_at[said] + SPEECH_START_MS / 1000
            truncated, _ = await recv_until(observer, "conversation.item.truncated", timeout=10)
            cut_at = loop.time()  # a loopback WebSocket's delivery after the cut: a millisecond or two
            await asyncio.sleep(1.0)
    runs = _loud_runs(caller, reply_at - 0.1, onset + 1.5)
    assert runs and runs[0][0] < onset, ("the reply was not playing when the caller spoke", runs)
    stopped = runs[0][1]
    # What the caller heard of the reply: from its start (its words come as its audio starts) to
    # its last sound on the track.
    heard_ms = (stopped - reply_at) * 1000
    logger.info(
        "live webrtc barge-in (pace %g): the track stopped %.0f ms after the onset, %+.0f ms from the cut;"
        " truncated at %d ms, heard %.0f ms",
        pace,
        (stopped - onset) * 1000,
        (stopped - cut_at) * 1000,
        truncated["audio_end_ms"],
        heard_ms,
    )
    assert stopped - onset < BARGE_IN_BOUND_S, stopped - onset
    assert stopped <= cut_at + CUT_BOUND_S, stopped - cut_at
    # What the conversation keeps is what the track played (a frame and the gaps between words either way).
    assert abs(truncated["audio_end_ms"] - heard_ms) < 200, (truncated, heard_ms)
    errors = [e for _, e in caller.events if e["type"] == "error"]
    assert errors == [], errors


async def test_a_live_call_that_never_connects_is_reaped(gateway_factory: GatewayFactory) -> None:
    offer_loopback()
    gateway = gateway_factory.start(
        {"server": {"web_demo": False}, "webrtc": {"host_addresses": ["127.0.0.1"], "connect_timeout_s": 1}},
        name="live-webrtc-reaper",
    )
    caller = Caller(gateway.base_url)
    try:
        offer = await caller.offer(label=LABEL)
        async with AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="sk-any", max_retries=0) as client:
            await client.live.create(session=SESSION, transport={"type": "webrtc", "sdp": offer})
        # The answer is never set: no connectivity check ever comes back. The POST started the
        # session; the reaper ends it and releases its engine session.
        await gateway.wait_sessions(1)
        await gateway.wait_sessions(0, timeout=5)
    finally:
        await caller.close()
