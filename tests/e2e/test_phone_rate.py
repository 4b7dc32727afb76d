"""Phone-rate callers through a real gateway with the embedded engine hear as well as the model itself.

Each caller speaks 8 kHz audio over the Realtime WebSocket, as a phone bridge would
(PCM16 at 8 kHz, or G.711 μ-law), in real time on a line with a little hiss; server VAD
finds the turn. The same audio, resampled offline and given to the same Whisper model in
this process, is the yardstick: the gateway may lose no more words than the model does on
the file. Both sides run the same int8 kernels of this CPU, so the bound holds on any of
them; the inputs include turns with a pause inside (two phrases) and the question that
came back garbled ("what time is it").
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from duplex_gateway.engine.embedded.asr import FinalRecognizer
from duplex_gateway.engine.embedded.tts import PiperSynthesizer, voice_sample_rate
from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, decode, encode, stream_audio, ws_connect
from tests.fixtures import PHRASES
from tests.wer import corpus_wer, wer

pytestmark = pytest.mark.e2e

PHONE_RATE = 8_000
WIRE_TYPE = {"pcm16": {"type": "audio/pcm", "rate": PHONE_RATE}, "g711_ulaw": {"type": "audio/pcmu"}}
#: How many more word errors in a hundred the gateway may make than the model on the same audio.
#: Measured: none (0 % more, over the inputs below); the margin absorbs the turn's edges, which
#: the gateway's VAD places and the file does not have.
_WER_MARGIN = 0.08


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    config: dict[str, Any] = {
        "server": {"web_demo": False},
        "engine": {"name": "embedded"},
        "limits": {"max_sessions": 4},
    }
    return module_gateway_factory.start(config, name="phone-rate")


def _hiss(seconds: float, rng: np.random.Generator) -> npt.NDArray[np.float32]:
    """A phone line's noise floor, some 50 dB below the speech: a line is never digital silence."""
    return (rng.standard_normal(int(PHONE_RATE * seconds)) * 0.002).astype(np.float32)


def _piper(text: str) -> npt.NDArray[np.float32]:
    """``text`` in the embedded engine's own Piper voice (22.05 kHz), taken down to the phone's rate."""
    voice = PiperSynthesizer.shared(threads=2)
    pcm = np.frombuffer(voice.synthesize(text), dtype="<i2").astype(np.float32) / 32768.0
    return np.asarray(soxr.resample(pcm, voice_sample_rate(), PHONE_RATE, quality="VHQ"), dtype=np.float32)


def _callers() -> list[tuple[str, str, npt.NDArray[np.float32]]]:
    """(what is said, wire format, 8 kHz float samples with the line around it) for each caller."""
    rng = np.random.default_rng(8)
    spoken: list[tuple[str, npt.NDArray[np.float32]]] = [
        ("What time is it?", _piper("What time is it?")),
        ("Can you call me a taxi to the airport?", _piper("Can you call me a taxi to the airport?")),
        (PHRASES[5].text, PHRASES[5].load(PHONE_RATE)),
        (PHRASES[9].text, PHRASES[9].load(PHONE_RATE)),
        # A pause inside the turn (shorter than the VAD's silence): one turn, two phrases.
        (
            f"{PHRASES[1].text} {PHRASES[14].text}",
            np.concatenate([PHRASES[1].load(PHONE_RATE), _hiss(0.3, rng), PHRASES[14].load(PHONE_RATE)]),
        ),
        (PHRASES[12].text, PHRASES[12].load(PHONE_RATE)),
    ]
    callers = []
    for index, (text, speech) in enumerate(spoken):
        fmt = "pcm16" if index % 2 == 0 else "g711_ulaw"
        line = np.concatenate([_hiss(0.6, rng), speech, _hiss(1.2, rng)])
        callers.append((text, fmt, np.clip(line, -1.0, 1.0).astype(np.float32)))
    return callers


def _offline(recognizer: FinalRecognizer, wire: bytes, fmt: str) -> str:
    """What the model hears in the very bytes a caller sent, resampled as the gateway does (soxr HQ)."""
    samples = decode(wire, fmt)
    return recognizer.transcribe(
        np.asarray(soxr.resample(samples, PHONE_RATE, 16_000, quality="HQ"), np.float32)
    )


async def _through_gateway(gateway: Gateway, wire: bytes, fmt: str, slots: asyncio.Semaphore) -> str:
    async with slots, ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await ws.send(
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {
                            "input": {"format": WIRE_TYPE[fmt], "transcription": {"model": "whisper-1"}},
                        },
                    },
                }
            )
        )
        await log.wait_for("session.updated")
        await stream_audio(ws, wire, rate=PHONE_RATE, fmt=fmt, realtime=True)
        _, done = await log.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed", done
        finals = [
            e["transcript"]
            for e in log.events
            if e["type"] == "conversation.item.input_audio_transcription.completed"
        ]
        assert len(finals) == 1, f"the caller's one turn was heard as {len(finals)}: {finals}"
        await log.aclose()
        return str(finals[0])


async def test_phone_rate_callers_lose_no_more_words_than_the_model_on_the_file(gateway: Gateway) -> None:
    callers = [(text, fmt, encode(samples, fmt)) for text, fmt, samples in _callers()]
    recognizer = FinalRecognizer.shared(cpu_threads=2)
    offline = [_offline(recognizer, wire, fmt) for _, fmt, wire in callers]
    slots = asyncio.Semaphore(2)  # two callers at a time: the gateway's engine shares the CPU
    heard = await asyncio.gather(*(_through_gateway(gateway, wire, fmt, slots) for _, fmt, wire in callers))
    texts = [text for text, _, _ in callers]
    gateway_wer = corpus_wer(zip(texts, heard, strict=True))
    offline_wer = corpus_wer(zip(texts, offline, strict=True))
    report = "\n".join(
        f"  {fmt:9} gateway {wer(text, got):4.0%} {got!r}\n  {'':9} offline {wer(text, ref):4.0%} {ref!r}"
        for (text, fmt, _), got, ref in zip(callers, heard, offline, strict=True)
    )
    print(f"\n8 kHz: gateway WER {gateway_wer:.1%}, offline WER {offline_wer:.1%}\n{report}")
    assert gateway_wer <= offline_wer + _WER_MARGIN, report
    # No caller's turn is lost or garbled whole where the model on the file got it.
    assert all(
        wer(text, got) <= wer(text, ref) + 0.5 for text, got, ref in zip(texts, heard, offline, strict=True)
    ), report
