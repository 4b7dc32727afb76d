"""A vLLM-Omni reply's audio on its way to the gateway: decoded, resampled, and counted.

vLLM-Omni (in process or over its server) hands a reply's audio over in chunks,
each in a ``format`` and, where it says so, at a ``sample_rate_hz``; the gateway
wants PCM16 at the engine's output rate. :class:`ReplyAudio` does that per reply
(one stream resampler, so chunk edges leave no clicks) and keeps the two counts
a playback report needs: what the gateway was handed, and what vLLM-Omni's
playback ledger counts as sent (its ``speed`` makes them differ).

Decided once for both engines: every name either engine took for a format is
taken (the MIME-like ``audio/pcm`` ones too), and G.711 without a stated rate is
at 8 kHz, the only rate it has.
"""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio import codec
from duplex_gateway.audio.resample import StreamResampler
from duplex_gateway.vocabulary.formats import Encoding

__all__ = ["FORMATS", "ReplyAudio", "decode_audio", "is_pcm16", "ledger_ms_of"]

#: G.711 is 8 kHz by definition: a chunk that names no rate is at it.
_G711_RATE = 8_000

#: Each format name vLLM-Omni (or a gateway backend) may put on a chunk: its encoding,
#: and the rate it implies when the chunk states none (None: the engine's output rate).
FORMATS: Mapping[str, tuple[Encoding, int | None]] = {
    **dict.fromkeys(("pcm16", "pcm", "pcm_s16le", "s16le", "audio/pcm"), (Encoding.PCM16, None)),
    **dict.fromkeys(("pcm_f32le", "f32le", "float32", "audio/pcm_f32le"), (Encoding.PCM_F32LE, None)),
    **dict.fromkeys(("g711_ulaw", "ulaw", "pcmu", "audio/pcmu"), (Encoding.G711_ULAW, _G711_RATE)),
    **dict.fromkeys(("g711_alaw", "alaw", "pcma", "audio/pcma"), (Encoding.G711_ALAW, _G711_RATE)),
}

#: Bytes per sample of the raw encodings (a chunk cut mid-sample loses the partial one).
_WIDTH = {Encoding.PCM16: 2, Encoding.PCM_F32LE: 4, Encoding.G711_ULAW: 1, Encoding.G711_ALAW: 1}


def is_pcm16(fmt: str | None) -> bool:
    """``fmt`` names PCM16 (no format at all means PCM16, vLLM-Omni's default)."""
    return FORMATS.get((fmt or "pcm16").lower(), (None, None))[0] is Encoding.PCM16


def decode_audio(
    data: bytes, fmt: str | None, rate: int | None
) -> tuple[npt.NDArray[np.float32], int | None]:
    """Engine audio bytes in ``fmt`` as mono float32, with the rate they are at.

    ``wav`` carries its own rate; raw formats are at ``rate``, or the rate their
    format implies (G.711: 8 kHz), or ``None`` (unknown: the engine's output rate).
    Raises :class:`ValueError` for a format no engine speaks.
    """
    name = (fmt or "pcm16").lower()
    known = FORMATS.get(name)
    if known is not None:
        encoding, implied = known
        width = _WIDTH[encoding]
        return codec.decode(data[: len(data) - len(data) % width], encoding), rate or implied
    if name == "wav":
        import soundfile

        samples, wav_rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        return np.ascontiguousarray(samples.mean(axis=1), dtype=np.float32), int(wav_rate)
    raise ValueError(f"unsupported engine audio format {fmt!r}")


def ledger_ms_of(metadata: object) -> int | None:
    """How much of the reply vLLM-Omni's playback ledger counts as sent, from a chunk's ``metadata``.

    vLLM-Omni 0.30 reports it cumulatively (``playback.sent_ms``, or
    ``audio_duration_ms``, which its session adds the reply's earlier audio to).
    """
    if not isinstance(metadata, Mapping):
        return None
    playback = metadata.get("playback")
    value = playback.get("sent_ms") if isinstance(playback, Mapping) else metadata.get("audio_duration_ms")
    return int(value) if isinstance(value, int | float) and value >= 0 else None


class ReplyAudio:
    """One reply's audio on its way to PCM16 at the engine output rate (stateful resampling)."""

    def __init__(self, out_rate: int) -> None:
        self.out_rate = out_rate
        #: PCM16 samples produced at ``out_rate``.
        self.samples = 0
        #: The reply's audio as the engine's playback ledger counts it (0: nothing yet).
        self.ledger_ms = 0.0
        self._resampler: StreamResampler | None = None

    @property
    def produced_ms(self) -> float:
        """How much audio the gateway was handed, in milliseconds at the output rate."""
        return self.samples * 1000.0 / self.out_rate

    def chunk(self, data: bytes, fmt: str | None, rate: int | None, *, ledger_ms: int | None = None) -> bytes:
        """One chunk of the reply as PCM16 at the output rate; ``ledger_ms``: what the chunk's
        metadata says the ledger counts for the reply so far (None: count the chunk itself).

        Raises :class:`ValueError` for audio that cannot be decoded (nothing is counted then).
        """
        if (rate is None or rate == self.out_rate) and is_pcm16(fmt):
            pcm = self.pass_through(data)  # already what the gateway wants: no float round trip
            seconds = len(data) // 2 / self.out_rate
        else:
            samples, at = decode_audio(data, fmt, rate)
            at = at or self.out_rate
            seconds = samples.size / at
            pcm = self.convert(samples, at)
        if ledger_ms is not None:
            self.ledger_ms = max(self.ledger_ms, float(ledger_ms))
        else:
            self.ledger_ms += seconds * 1000.0
        return pcm

    def convert(self, samples: npt.NDArray[np.float32], rate: int) -> bytes:
        """Float samples at ``rate`` as PCM16 at the output rate (after what a resampler at another rate held)."""
        out = b""
        if self._resampler is None or self._resampler.in_rate != rate:
            out = self.flush()
            self._resampler = StreamResampler(rate, self.out_rate)
        return out + self._pcm(self._resampler.process(samples))

    def pass_through(self, data: bytes) -> bytes:
        """PCM16 already at the output rate (after whatever a resampler still holds)."""
        head = self.flush()
        self._resampler = None
        pcm = data[: len(data) - len(data) % 2]
        self.samples += len(pcm) // 2
        return head + pcm

    def flush(self) -> bytes:
        """What the resampler still holds (the reply ended)."""
        if self._resampler is None:
            return b""
        return self._pcm(self._resampler.flush())

    def ledger_played(self, played_ms: int) -> int:
        """``played_ms`` of the audio handed over, in the engine ledger's milliseconds."""
        produced = self.produced_ms
        if produced <= 0 or self.ledger_ms <= 0:
            return int(played_ms)
        return int(min(self.ledger_ms, round(played_ms * self.ledger_ms / produced)))

    def ledger_total(self) -> int:
        """The whole reply in the ledger's milliseconds (what acknowledges all of it)."""
        return int(self.ledger_ms) if self.ledger_ms > 0 else int(self.produced_ms)

    def _pcm(self, samples: npt.NDArray[np.float32]) -> bytes:
        self.samples += int(samples.size)
        return codec.encode(samples, Encoding.PCM16) if samples.size else b""
