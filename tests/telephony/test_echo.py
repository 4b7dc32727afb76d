"""Speakerphone echo: the reply coming back into the caller's microphone must not barge in.

Measured on real speech over a telephone echo path (delay, attenuation, a low-pass
filter and μ-law both ways): how much quieter the echo comes out (ERLE), that the
gateway's own VAD no longer hears speech in it, and that the caller's voice talking
over the echo still comes through.
"""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from duplex_gateway.audio import codec
from duplex_gateway.audio.vad import SileroVadStream
from duplex_gateway.telephony.echo import EchoSuppressor
from duplex_gateway.vocabulary.formats import Encoding
from tests.fixtures import PHRASES, load_speech

RATE = 8_000
PIECE = 160  # 20 ms


def _ulaw(samples: np.ndarray) -> np.ndarray:
    return codec.decode(codec.encode(samples, Encoding.G711_ULAW), Encoding.G711_ULAW)


def _echo_path(reply: np.ndarray, delay_ms: float, gain: float) -> np.ndarray:
    """What a speakerphone sends back: the reply, later, quieter, band-limited, μ-law coded."""
    delayed = np.concatenate([np.zeros(int(RATE * delay_ms / 1000), np.float32), reply])
    smoothed = np.convolve(delayed, np.array([0.25, 0.5, 0.25], np.float32), mode="same")
    return _ulaw(gain * smoothed)


def _run(reply: np.ndarray, mic: np.ndarray, lead_ms: float = 100.0) -> tuple[np.ndarray, EchoSuppressor]:
    """Play ``reply`` and feed ``mic`` through the suppressor, 20 ms at a time, on one clock."""
    echo = EchoSuppressor(RATE)
    out = []
    for index in range(0, len(mic), PIECE):
        now = index / RATE
        # The reply goes out ahead of real time by the lead, as the playout sends it.
        ahead = index + int(RATE * lead_ms / 1000)
        piece = reply[ahead : ahead + PIECE]
        if piece.size:
            echo.played(now + (lead_ms / 1000) + piece.size / RATE, _ulaw(piece))
        out.append(echo.process(now, mic[index : index + PIECE]))
    return np.concatenate(out), echo


def _speech_ms(samples: np.ndarray) -> float:
    """How much of ``samples`` the gateway's VAD (Silero) takes for speech."""
    windows = SileroVadStream().process(soxr.resample(samples, RATE, 16_000).astype(np.float32))
    return float(sum(1 for w in windows if w.probability > 0.5)) * 32.0  # 32 ms windows


def _longest_speech_ms(samples: np.ndarray) -> float:
    windows = SileroVadStream().process(soxr.resample(samples, RATE, 16_000).astype(np.float32))
    longest = run = 0
    for window in windows:
        run = run + 1 if window.probability > 0.5 else 0
        longest = max(longest, run)
    return longest * 32.0


@pytest.mark.parametrize(("delay_ms", "gain"), [(60, 0.6), (150, 0.4), (300, 0.8)])
def test_echo_of_the_reply_is_taken_out(delay_ms: float, gain: float) -> None:
    reply = np.concatenate([load_speech(RATE), load_speech(RATE)])
    mic = _echo_path(reply, delay_ms, gain)[: len(reply)]
    cleaned, echo = _run(reply, mic)
    assert echo.stats.suppressed > 0.6 * echo.stats.pieces, echo.stats
    assert echo.stats.erle_db >= 10.0, echo.stats.erle_db
    # The VAD heard seconds of "speech" in the raw echo and next to none after.
    assert _speech_ms(mic) > 1000
    assert _speech_ms(cleaned) < 0.1 * _speech_ms(mic), (_speech_ms(cleaned), _speech_ms(mic))


def test_the_callers_voice_over_the_echo_comes_through() -> None:
    reply = np.concatenate([load_speech(RATE), load_speech(RATE)])
    caller = np.zeros_like(reply)
    words = PHRASES[-1].load(RATE)  # a different voice, saying something else
    start = RATE  # the caller starts talking 1 s into the reply
    caller[start : start + len(words)] = words[: len(caller) - start]
    mic = _echo_path(reply, 150, 0.4)[: len(reply)] + _ulaw(caller)
    cleaned, _ = _run(reply, mic)
    span = slice(start, start + len(words))
    kept = float(np.corrcoef(cleaned[span], caller[span])[0, 1])
    assert kept > 0.8, kept
    # Where the echo drowns the caller, the piece goes; what remains is still a barge-in:
    # the VAD hears well over its 250 ms of speech in a row.
    assert _longest_speech_ms(cleaned[span]) >= 500, _longest_speech_ms(cleaned[span])
    assert _speech_ms(cleaned[span]) > 0.4 * _speech_ms(caller[span])


def test_no_reply_no_work() -> None:
    echo = EchoSuppressor(RATE)
    piece = np.ones(PIECE, np.float32) * 0.1
    assert echo.process(0.0, piece) is piece
    assert echo.stats.pieces == 0


@pytest.mark.parametrize("overlap_ms", [500, 1000, 1500])
def test_a_callers_voice_with_no_echo_is_left_as_it_is(overlap_ms: int) -> None:
    """A handset, not a speakerphone: the caller talks over the reply's end, and no echo comes back.

    A 20 ms piece of one voice resembles some 20 ms of another somewhere in a second of it
    by chance; taking each such likeness for echo cut the caller's own words by 5-13 dB,
    and the recognizer heard what was left. The reply is in the embedded engine's voice
    (Piper), the callers in another (espeak-ng), as a caller's and an engine's differ.
    """
    reply = np.concatenate([PHRASES[12].load(RATE), PHRASES[15].load(RATE)])
    looked = touched = 0
    for phrase in PHRASES[:12]:
        words = _ulaw(phrase.load(RATE))
        mic = np.concatenate([np.zeros(len(reply) - RATE * overlap_ms // 1000, np.float32), words])
        cleaned, echo = _run(reply, mic)
        looked, touched = looked + echo.stats.pieces, touched + echo.stats.suppressed
        error = cleaned - mic
        snr_db = 10 * np.log10(float(np.sum(mic**2)) / max(float(np.sum(error**2)), 1e-12))
        assert snr_db >= 15.0, (phrase.text, snr_db, echo.stats)
    assert looked > 1000  # the reply was recent: the suppressor looked at the caller's pieces
    assert touched <= 0.01 * looked, (touched, looked)
