"""End of speech to first reply audio: WebRTC against the WebSocket, the same engine, in one run.

One gateway (``echo``, in real time) takes turns from two callers in alternation: an aiortc
caller on ``POST /v1/realtime/calls`` and a Realtime WebSocket client, both saying the same
sentence in real time with the microphone left open after it. For each turn the time runs from
when the caller's last frame of speech went out to when the caller first *hears* the reply
(the echo of its own first word, so both paths measure the same sound):

* WebRTC: the arrival of the first loud 20 ms frame on the remote track;
* WebSocket: a player that starts with the first audio delta and plays on without a gap reaches
  the first loud sample (a delta's audio plays from its arrival, or from the end of the one
  before, whichever is later).

The issue's bound: the WebRTC median within 40 ms of the WebSocket's.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import statistics
from typing import Any

import numpy as np
import pytest

from tests.e2e.helpers import Gateway, ws_connect
from tests.e2e.webrtc_client import RATE, Caller, speech
from tests.fixtures import SPEECH_END_MS

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

#: The issue's bound: WebRTC's median may be this much later than the WebSocket's.
BOUND_MS = 40.0
TURNS = 4
#: A sample this loud (PCM16) is the reply being heard; the echoed sentence peaks near 23,000.
LOUD = 1000
WS_RATE = 24_000
FRAME_MS = 20


def _first_loud(pcm: bytes) -> int | None:
    """The index of the first loud sample in ``pcm`` (PCM16), or None."""
    loud = np.flatnonzero(np.abs(np.frombuffer(pcm, "<i2").astype(np.int32)) > LOUD)
    return int(loud[0]) if loud.size else None


async def _webrtc_turn(caller: Caller, speech: bytes) -> float:
    mark, heard_mark = len(caller.events), len(caller.heard)
    said = len(caller.mic.said_at)
    caller.mic.say(speech)
    await caller.wait_for("output_audio_buffer.started", after=mark, timeout=20)
    await caller.wait_for("output_audio_buffer.stopped", after=mark, timeout=20)
    speech_end = caller.mic.said_at[said] + SPEECH_END_MS / 1000
    for at, pcm in caller.heard[heard_mark:]:
        if at > speech_end and _first_loud(pcm) is not None:
            return (at - speech_end) * 1000
    raise AssertionError("no loud reply frame on the track")


async def _websocket_turn(ws: Any, speech: bytes) -> float:
    loop = asyncio.get_running_loop()
    step = WS_RATE * FRAME_MS // 1000 * 2
    deltas: list[tuple[float, bytes]] = []
    done = asyncio.Event()
    speech_end: float | None = None

    async def read() -> None:
        async for message in ws:
            event = json.loads(message)
            if event.get("type") == "response.output_audio.delta":
                deltas.append((loop.time(), base64.b64decode(event["delta"])))
            elif event.get("type") == "response.done":
                done.set()
                return

    reader = asyncio.create_task(read())
    start = loop.time()
    frames = [speech[i : i + step] for i in range(0, len(speech), step)]
    end_frame = SPEECH_END_MS // FRAME_MS
    sent = 0
    try:
        while not done.is_set():
            chunk = frames[sent] if sent < len(frames) else bytes(step)
            await ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
            )
            if sent == end_frame:
                speech_end = loop.time()
            sent += 1
            await asyncio.sleep(max(0.0, start + sent * FRAME_MS / 1000 - loop.time()))
            assert loop.time() - start < 30, "no reply"
    finally:
        reader.cancel()
    assert speech_end is not None
    cursor: float | None = None
    for arrival, pcm in deltas:
        begin = arrival if cursor is None else max(arrival, cursor)
        index = _first_loud(pcm)
        if index is not None and begin + index / WS_RATE > speech_end:
            return (begin + index / WS_RATE - speech_end) * 1000
        cursor = begin + len(pcm) / 2 / WS_RATE
    raise AssertionError("no loud reply audio")


async def test_webrtc_first_audio_is_within_40_ms_of_the_websocket(webrtc_gateway: Gateway) -> None:
    gateway = webrtc_gateway
    caller = Caller(gateway.base_url)
    webrtc: list[float] = []
    websocket: list[float] = []
    try:
        await caller.connect()
        await caller.wait_for("session.created")
        async with ws_connect(gateway) as ws:
            for _ in range(TURNS):
                webrtc.append(await _webrtc_turn(caller, speech(RATE)))
                websocket.append(await _websocket_turn(ws, speech(WS_RATE)))
    finally:
        await caller.close()
    rtc_ms, ws_ms = statistics.median(webrtc), statistics.median(websocket)
    logger.info(
        "end of speech -> first audio heard, median: WebRTC %.0f ms %s, WebSocket %.0f ms %s",
        rtc_ms,
        [round(v) for v in webrtc],
        ws_ms,
        [round(v) for v in websocket],
    )
    assert rtc_ms <= ws_ms + BOUND_MS, (webrtc, websocket)
