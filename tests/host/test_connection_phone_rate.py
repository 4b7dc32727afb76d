"""Phone-rate caller audio reaches the engine exactly as the file resampled offline.

A real :class:`Connection`, :class:`Session` and server VAD, and the real ``echo``
engine at 16 kHz (the embedded engine's rate), which answers a turn with the very
audio it was given: an 8 kHz caller whose turn holds a short pause between two
phrases must get back the offline resampling of what it sent, sample for sample,
whether the client paces its audio or uploads it at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from duplex_gateway.engine import port
from duplex_gateway.engine.echo import EchoEngine
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.fixtures import PHRASES
from tests.host.test_connection import FakeSocket, Harness, audio_of, done_of

PHONE_RATE = 8_000
ENGINE_RATE = 16_000
#: The engine resampler's filter at a turn's end: the committed turn is flushed there, where
#: the offline reference of the whole file goes on into the audio after it.
_END_MS = 40
#: PCM16 rounding of the two sides: a sample or two of difference, nothing more.
_MAX_LSB = 2


class PausingEcho(EchoEngine):
    """The echo engine at 16 kHz, counting the pauses the gateway's turn detection reports."""

    def __init__(self) -> None:
        super().__init__(rate=ENGINE_RATE, pace=0.0, chunk_ms=100)
        self.pauses = 0

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        session = await super().open_session(session_id, config)
        paused = session.caller_paused

        async def counted() -> None:
            self.pauses += 1
            await paused()

        session.caller_paused = counted  # type: ignore[method-assign]
        return session


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = Harness()
    yield h
    await h.aclose()


def _line(seconds: float, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """A phone line's hiss, about 50 dB below speech: a real line is never digital silence."""
    return (rng.standard_normal(int(PHONE_RATE * seconds)) * 0.002).astype(np.float32)


def _caller() -> npt.NDArray[np.int16]:
    """Two phrases 250 ms apart (a pause, not the turn's end) on a hissing line, as PCM16."""
    rng = np.random.default_rng(3)
    first, second = PHRASES[1].load(PHONE_RATE), PHRASES[13].load(PHONE_RATE)
    parts = [_line(0.6, rng), first, _line(0.25, rng), second, _line(1.2, rng)]
    samples = np.concatenate(parts)
    return np.asarray(np.round(np.clip(samples, -1, 1) * 32767), dtype=np.int16)


def _offline(caller: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
    """The whole file resampled to the engine's rate at once, with the gateway's filter (soxr HQ)."""
    x = caller.astype(np.float32) / 32768.0
    y = soxr.resample(x, PHONE_RATE, ENGINE_RATE, quality="HQ")
    return np.asarray(np.round(np.clip(y, -1, 1) * 32767), dtype=np.int16)


def _locate(turn: npt.NDArray[np.int16], reference: npt.NDArray[np.int16]) -> int:
    """Where ``turn`` starts in ``reference`` (the turn starts at its prefix padding, wherever that is)."""
    head = turn[: ENGINE_RATE // 2].astype(np.float64)
    ref = reference.astype(np.float64)
    score = np.correlate(ref, head, "valid")
    return int(np.argmax(score))


async def _turn_echoed(harness: Harness, caller: npt.NDArray[np.int16], *, paced: bool) -> tuple[bytes, int]:
    engine = PausingEcho()
    await engine.start()
    socket = FakeSocket()
    harness.connect(socket, engine, **{"session.turn_detection": "server_vad"})
    await socket.wait_for("session.created")
    socket.push(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    "input": {"format": {"type": "audio/pcm", "rate": PHONE_RATE}},
                    "output": {"format": {"type": "audio/pcm", "rate": ENGINE_RATE}},
                },
            },
        }
    )
    await socket.wait_for("session.updated")
    pcm = caller.astype("<i2").tobytes()
    step = PHONE_RATE * 2 // 50  # 20 ms frames, as a phone sends them
    for offset in range(0, len(pcm), step):
        socket.append(pcm[offset : offset + step])
        if paced:
            await asyncio.sleep(0.001)  # let the connection take each frame on its own
    created = await socket.wait_for("response.created", timeout=30)
    response_id = socket.events[created]["response"]["id"]
    await socket.wait_for(done_of(response_id), timeout=30)
    return audio_of(socket, response_id), engine.pauses


@pytest.mark.parametrize("paced", [True, False], ids=["paced", "uploaded"])
async def test_an_8khz_turn_with_a_pause_reaches_the_engine_as_resampled_offline(
    harness: Harness, paced: bool
) -> None:
    caller = _caller()
    echoed, pauses = await _turn_echoed(harness, caller, paced=paced)
    assert pauses >= 1, "the caller's pause between the phrases was not reported: nothing was tested"
    turn = np.frombuffer(echoed, dtype="<i2")
    reference = _offline(caller)
    start = _locate(turn, reference)
    # The turn holds both phrases whole: from before the first to after the second.
    speech = np.flatnonzero(np.abs(reference.astype(np.int32)) > 3000)
    assert start <= speech[0] and start + turn.size >= speech[-1], (start, turn.size, speech[[0, -1]])
    compared = turn.size - ENGINE_RATE * _END_MS // 1000
    diff = np.abs(turn[:compared].astype(np.int32) - reference[start : start + compared].astype(np.int32))
    worst = int(np.argmax(diff))
    assert diff[worst] <= _MAX_LSB, (
        f"the turn differs from the offline resampling by {diff[worst]} LSB at {worst / 16:.1f} ms "
        f"into the turn ({int(np.sum(diff > _MAX_LSB))} samples off)"
    )
