"""What a WebRTC caller hears: the reply on the track, transcribed back, on a clean and a lossy network.

An aiortc caller (:mod:`tests.e2e.webrtc_client`) says recorded phrases on its track in real time,
one turn each, and records the gateway's track. What it heard between
``output_audio_buffer.started`` and ``stopped`` goes through the embedded engine's own Whisper, and
the words are held to what the reply says: for ``echo`` the caller's own phrase (so it crossed the
network twice, as Opus both ways), for ``embedded`` the reply's transcript on the data channel.

The lossy runs put :class:`~tests.e2e.lossy_relay.LossyRelay` between the two peers: 5 % of the
media dropped at random each way (audio packets, and the SCTP packets of the data channel). The
call must go on through every turn (each reply started, stopped and done in bounded time: nothing
stalls) and the words must stay within the bound.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import soxr

from duplex_gateway.engine.embedded.asr import FinalRecognizer
from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.lossy_relay import LossyRelay
from tests.e2e.webrtc_client import RATE, Caller, offer_loopback, pcm16
from tests.fixtures import PHRASES
from tests.wer import corpus_wer, wer

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

#: The issue's network: 5 % random loss each way.
LOSS = 0.05
#: Phrases said, one turn each: espeak-ng's robotic voice and Piper's.
SAID = (PHRASES[1], PHRASES[5], PHRASES[9], PHRASES[12], PHRASES[14])
#: Word error rate over the turns, of what was heard against what the reply says (and for embedded,
#: of what it restates against what was said), on a clean network and on a lossy one. Measured on
#: loopback: echo 2-4 % clean, 0-9 % at 5 % loss (which words a lost packet hits varies run to
#: run); embedded 3-8 % heard, 6 % understood. With aiortc's own jitter buffer in the receivers
#: (before :mod:`duplex_gateway.server.webrtc_jitter`), echo at 5 % loss was 68 %.
WER_BOUND = {0.0: 0.10, LOSS: 0.20}
#: A turn's reply starts, plays and ends within this (the phrase is 2-3 s; echo plays it back).
TURN_S = 20.0


@dataclass(frozen=True)
class Turn:
    #: What the caller said, what the reply says, and what the caller heard of it.
    said: str
    reference: str
    heard: str
    status: str


def _silence(seconds: float) -> bytes:
    return bytes(int(RATE * seconds) * 2)


async def _converse(caller: Caller, recognizer: FinalRecognizer, engine: str) -> list[Turn]:
    await caller.connect()
    await caller.wait_for("session.created")
    turns = []
    for phrase in SAID:
        mark = len(caller.events)
        said = _silence(0.3) + pcm16(phrase.load())
        caller.mic.say(said)
        # When the caller stops talking, by the microphone's own real-time clock.
        spoken_until = asyncio.get_running_loop().time() + len(said) / (2 * RATE)
        started_at, started = await caller.wait_for("output_audio_buffer.started", after=mark, timeout=TURN_S)
        response_id = started["response_id"]
        stopped_at, _ = await caller.wait_for("output_audio_buffer.stopped", after=mark, timeout=TURN_S)
        _, done = await caller.wait_for("response.done", after=mark, timeout=TURN_S)
        assert done["response"]["id"] == response_id
        # The track carries nothing but the reply after the caller has spoken. The events that frame
        # it can come late, when a lost packet of the data channel is sent again (SCTP waits about a
        # second for that): the track's own frames do not wait for them, so the window opens when
        # the caller is done, however late `started` came.
        heard_from = min(started_at - 0.1, spoken_until)
        heard = np.frombuffer(caller.heard_between(heard_from, stopped_at + 0.3), "<i2")
        words = recognizer.transcribe(soxr.resample(heard.astype(np.float32) / 32768, RATE, 16_000))
        reference = _reference(caller, mark, response_id, phrase.text, engine)
        turns.append(Turn(phrase.text, reference, words, done["response"]["status"]))
    return turns


def _reference(caller: Caller, mark: int, response_id: str, said: str, engine: str) -> str:
    """What the reply says: the caller's phrase for echo, the reply's own transcript otherwise."""
    if engine == "echo":
        return said
    spoken = [
        str(e["transcript"])
        for _, e in caller.events[mark:]
        if e.get("type") == "response.output_audio_transcript.done" and e.get("response_id") == response_id
    ]
    assert spoken, "the reply's transcript never came on the data channel"
    return " ".join(spoken)


@pytest.fixture(scope="module")
def recognizer() -> FinalRecognizer:
    return FinalRecognizer.shared(cpu_threads=2)


@pytest.mark.parametrize(
    ("engine", "loss"),
    [("echo", 0.0), ("echo", LOSS), ("embedded", LOSS)],
    ids=["echo-clean", "echo-5pct-loss", "embedded-5pct-loss"],
)
async def test_the_reply_on_the_track_is_understood(
    engine: str, loss: float, gateway_factory: GatewayFactory, recognizer: FinalRecognizer
) -> None:
    offer_loopback()
    config: dict[str, Any] = {
        "server": {"web_demo": False},
        "engine": {"name": engine},
        "webrtc": {"host_addresses": ["127.0.0.1"]},
    }
    gateway: Gateway = gateway_factory.start(config, name=f"webrtc-{engine}")
    relay = LossyRelay(loss)
    await relay.start()
    caller = Caller(gateway.base_url, relay=relay)
    try:
        turns = await _converse(caller, recognizer, engine)
    finally:
        await caller.close()
        relay.close()
    pairs = [(t.reference, t.heard) for t in turns]
    score = corpus_wer(pairs)
    lost = [d.dropped / max(1, d.dropped + d.passed) for d in (relay.to_gateway, relay.to_caller)]
    logger.info(
        "%s over %.0f %% loss (dropped %.1f %% / %.1f %%): WER %.1f %%\n%s",
        engine,
        loss * 100,
        lost[0] * 100,
        lost[1] * 100,
        score * 100,
        "\n".join(f"  {wer(ref, hyp):.0%} {ref!r} -> {hyp!r}" for ref, hyp in pairs),
    )
    assert [t.status for t in turns] == ["completed"] * len(SAID)
    assert score <= WER_BOUND[loss], pairs
    assert all(wer(ref, hyp) < 0.5 for ref, hyp in pairs), pairs
    if engine == "embedded":
        # The way in too: the engine restates what its recognizer heard of the caller's track.
        understood = [(f"You said: {t.said}", t.reference) for t in turns]
        assert corpus_wer(understood) <= WER_BOUND[loss], understood
    if loss:
        # The relay did lose what it was asked to, each way (a few hundred packets a direction).
        assert all(0.5 * loss <= share <= 2 * loss for share in lost), lost
    else:
        assert relay.to_gateway.dropped == relay.to_caller.dropped == 0
    errors = [e for _, e in caller.events if e.get("type") == "error"]
    assert not errors, errors
