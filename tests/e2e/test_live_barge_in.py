"""A Live caller speaking over a reply, on a real gateway.

* Over a reply the engine made long before it plays (``echo`` at 20 times real time, as a model on
  a fast accelerator does): the reply's audio stops within 500 ms of the speech's onset, with no
  error, and the turn spoken over it is answered.
* Over a reply the engine makes as it plays (``echo`` in real time): a backchannel ("uh huh")
  holds the reply while it is judged and the reply then goes on where it paused (a gap, all of
  its audio, no turn for the backchannel); an interruption stops it within 500 ms of its onset.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory, encode, load_speech, ws_connect
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS
from tests.fixtures.overlap_set import BACKCHANNELS, INTERRUPTIONS, Overlap

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

RATE = 24_000
FRAME_MS = 20
#: What Pipecat's OpenAILiveLLMService sends at its defaults.
START = {"type": "session.start", "session": {"model": "gpt-live-1", "delegation": {"type": "client"}}}
#: The issue's bound: the reply stops this soon after the onset of the caller's speech over it.
BARGE_IN_BOUND_S = 0.5
#: No reply audio for this long: the reply has stopped.
QUIET_S = 0.8


@pytest.fixture
def fast_gateway(gateway_factory: GatewayFactory) -> Gateway:
    """``echo`` making each reply 20 times faster than it plays."""
    return gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 20.0}}},
        name="live-echo-fast",
    )


@dataclass
class _Caller:
    """A Live client: a microphone streaming 20 ms frames in real time, and each event with its arrival."""

    ws: Any
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    queued: list[bytes] = field(default_factory=list)
    said_at: list[float] = field(default_factory=list)

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        async for message in self.ws:
            self.received.append((loop.time(), json.loads(message)))

    async def microphone(self) -> None:
        loop = asyncio.get_running_loop()
        step = RATE * FRAME_MS // 1000 * 2
        playing = b""
        next_at = loop.time()
        while True:
            if not playing and self.queued:
                playing = self.queued.pop(0)
                self.said_at.append(loop.time())
            chunk, playing = playing[:step], playing[step:]
            audio = base64.b64encode(chunk.ljust(step, b"\x00")).decode()
            await self.ws.send(json.dumps({"type": "session.input_audio.append", "audio": audio}))
            next_at += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.received if e["type"] == kind]

    async def until(self, kind: str, timeout: float, after: float = 0.0) -> float:
        async with asyncio.timeout(timeout):
            while not (times := [t for t, _ in self.of(kind) if t >= after]):
                await asyncio.sleep(0.01)
        return times[0]


@contextlib.asynccontextmanager
async def _live_session(gateway: Gateway) -> AsyncIterator[_Caller]:
    async with ws_connect(gateway, "/v1/live/sessions") as ws:
        caller = _Caller(ws)
        tasks = [asyncio.create_task(caller.read())]
        try:
            await ws.send(json.dumps(START))
            await caller.until("session.started", 15)
            tasks.append(asyncio.create_task(caller.microphone()))
            yield caller
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    await gateway.wait_sessions(0, timeout=15)


async def test_speaking_over_a_reply_made_faster_than_it_plays_stops_it_within_500_ms(
    fast_gateway: Gateway, record_property: Any
) -> None:
    speech = load_speech(RATE)
    async with _live_session(fast_gateway) as caller:
        caller.queued.append(speech)
        first = await caller.until("session.output_audio.delta", 30)
        await asyncio.sleep(0.5)  # the caller hears the start of the reply, then speaks over it
        caller.queued.append(speech)
        while len(caller.said_at) < 2:  # the microphone takes it up at its next frame
            await asyncio.sleep(0.01)
        onset = caller.said_at[1] + SPEECH_START_MS / 1000
        # The reply to the turn spoken over it.
        second = await caller.until(
            "session.output_audio.delta", 30, after=onset + (SPEECH_END_MS - SPEECH_START_MS) / 1000
        )
        errors = [e for _, e in caller.of("error")]
        assert errors == [], errors

    deltas = [t for t, _ in caller.of("session.output_audio.delta")]
    assert any(onset - 0.3 < t <= onset for t in deltas), "the reply was not playing when the caller spoke"
    last = onset
    for t in (t for t in deltas if t > onset):
        if t - last > QUIET_S:
            break  # the next reply's audio
        last = t
    stopped = last - onset
    record_property("barge_in_stop_ms", round(stopped * 1000))
    logger.info(
        "live barge-in over a reply already made (echo): stopped %.0f ms after the onset", stopped * 1000
    )
    assert stopped < BARGE_IN_BOUND_S, stopped
    # The first reply was made whole well before the caller spoke: only its start was played.
    played_s = sum(
        len(base64.b64decode(e["delta"])) / 2 / RATE
        for t, e in caller.of("session.output_audio.delta")
        if t < second
    )
    assert played_s < (SPEECH_END_MS - SPEECH_START_MS) / 1000, played_s
    assert first < onset < second


@pytest.fixture
def real_time_gateway(gateway_factory: GatewayFactory) -> Gateway:
    """``echo`` making each reply as fast as it plays: the reply is still being made while it is heard."""
    return gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo"}}, name="live-echo-real-time"
    )


#: No reply audio for this long: the reply has ended (longer than a backchannel's hold).
REPLY_QUIET_S = 1.5
#: How far into the reply's audio the caller speaks over it.
INTO_REPLY_S = 0.8
#: A resumed reply's audio may differ from the reply alone by this much (VAD windows' alignment).
REPLY_TOLERANCE_MS = 120


@dataclass(frozen=True)
class _Reply:
    """One reply as the Live client got it: each delta's arrival and length (ms)."""

    chunks: list[tuple[float, float]]

    @property
    def audio_ms(self) -> float:
        return sum(ms for _, ms in self.chunks)

    def last_before(self, t: float) -> float:
        return max(at for at, _ in self.chunks if at <= t)

    def longest_gap(self, after: float) -> float:
        """The longest wait between deltas from the last one before ``after`` on."""
        times = [at for at, _ in self.chunks if at >= self.last_before(after)]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def _reply(caller: _Caller, after: float) -> _Reply:
    """The reply whose first audio comes after ``after``, up to its first quiet of :data:`REPLY_QUIET_S`."""
    await caller.until("session.output_audio.delta", 30, after=after)
    loop = asyncio.get_running_loop()
    while True:
        deltas = [t for t, _ in caller.of("session.output_audio.delta") if t >= after]
        if loop.time() - deltas[-1] > REPLY_QUIET_S:
            break
        await asyncio.sleep(0.05)
    chunks: list[tuple[float, float]] = []
    for t, e in caller.of("session.output_audio.delta"):
        if t < after:
            continue
        if chunks and t - chunks[-1][0] > REPLY_QUIET_S:
            break
        chunks.append((t, len(base64.b64decode(e["delta"])) / 2 / RATE * 1000))
    return _Reply(chunks)


async def _over_reply(caller: _Caller, clip: Overlap | None) -> tuple[_Reply, float | None]:
    """Ask (the speech fixture), then say ``clip`` :data:`INTO_REPLY_S` into the reply: the reply, and the onset."""
    asked = asyncio.get_running_loop().time()
    caller.queued.append(load_speech(RATE))
    first = await caller.until("session.output_audio.delta", 30, after=asked)
    onset = None
    if clip is not None:
        await asyncio.sleep(INTO_REPLY_S)
        said = len(caller.said_at)
        caller.queued.append(encode(clip.load(RATE)))
        while len(caller.said_at) <= said:  # the microphone takes it up at its next frame
            await asyncio.sleep(0.005)
        onset = caller.said_at[said]  # the clip is the speech alone: its first frame is its onset
    return await _reply(caller, first - 0.001), onset


async def test_a_backchannel_over_a_live_reply_pauses_it_and_it_goes_on_an_interruption_stops_it(
    real_time_gateway: Gateway, record_property: Any
) -> None:
    backchannels = (BACKCHANNELS[1], next(b for b in BACKCHANNELS if b.speaker == "espeak"))
    async with _live_session(real_time_gateway) as caller:
        alone, _ = await _over_reply(caller, None)
        for clip in backchannels:
            reply, onset = await _over_reply(caller, clip)
            assert onset is not None
            # All of the reply reached the caller, after a gap where it was held.
            assert abs(reply.audio_ms - alone.audio_ms) <= REPLY_TOLERANCE_MS, (clip.text, reply, alone)
            gap = reply.longest_gap(after=onset)
            logger.info("live backchannel %r: held %.0f ms, then resumed", clip.text, gap * 1000)
            assert gap >= 0.15, (clip.text, gap)
            # ... and the backchannel was no turn: nothing answered it.
            ended = reply.chunks[-1][0]
            await asyncio.sleep(1.0)
            assert not [t for t, _ in caller.of("session.output_audio.delta") if t > ended], clip.text
        interruption = INTERRUPTIONS[0]
        reply, onset = await _over_reply(caller, interruption)
        assert onset is not None
        stopped = reply.last_before(onset + REPLY_QUIET_S) - onset
        record_property("live_interruption_stop_ms", round(stopped * 1000))
        logger.info(
            "live interruption %r: the reply stopped %.0f ms after its onset",
            interruption.text,
            stopped * 1000,
        )
        assert stopped < BARGE_IN_BOUND_S, stopped
        assert reply.audio_ms < alone.audio_ms - 500
        errors = [e for _, e in caller.of("error")]
        assert errors == [], errors
