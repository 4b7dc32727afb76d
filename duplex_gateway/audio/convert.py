"""Per-session audio conversion between the client's wire format and the engine's.

Input: wire bytes (any :class:`Encoding`, any rate) → PCM16 LE mono at the engine
rate, plus, on request, float32 at 16 kHz for the voice-activity detector.

Output: engine PCM16 LE mono → wire bytes in the format the client asked for.

Both directions keep resampler state across chunks, so chunk edges do not click.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.codec import decode, decode_pcm16, encode, encode_pcm16, float_to_pcm16
from duplex_gateway.audio.resample import Quality, StreamResampler
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding

__all__ = ["VAD_RATE", "InputConverter", "OutputConverter"]

#: The rate the VAD works at; silero is trained on 16 kHz.
VAD_RATE: Final = 16_000

_PCM16_LE: Final = np.dtype("<i2")


class InputConverter:
    """Client audio → engine PCM16 (and optionally the VAD's 16 kHz float feed).

    The VAD feed is started by the first :meth:`convert_with_vad_feed` call and
    stays continuous while every chunk goes through that method. A plain
    :meth:`convert` call ends the feed (turn detection was switched off), and the
    next :meth:`convert_with_vad_feed` starts a new one at :attr:`vad_origin_ms`;
    VAD timestamps are relative to that origin.

    Not thread-safe: one instance per session.
    """

    def __init__(self, wire: AudioFormat, engine_rate: int, *, quality: Quality = "HQ") -> None:
        self.wire: Final = wire
        self.engine_rate: Final = engine_rate
        self._quality: Final = quality
        self._to_engine = StreamResampler(wire.rate, engine_rate, quality)
        # PCM16 at the engine rate needs no decoding at all: bytes pass straight through.
        self._passthrough: Final = wire.encoding is Encoding.PCM16 and wire.rate == engine_rate
        self._to_vad: StreamResampler | None = None
        self._vad_origin_samples = 0
        self._input_samples = 0

    # -- accounting ------------------------------------------------------------

    @property
    def input_samples(self) -> int:
        """Wire-rate samples received since construction (or the last :meth:`reset`)."""
        return self._input_samples

    @property
    def input_ms(self) -> float:
        """Milliseconds of audio received, exact (derived from the sample count)."""
        return self._input_samples * 1000.0 / self.wire.rate

    @property
    def vad_origin_ms(self) -> float:
        """Input time (ms) at which the current VAD feed started."""
        return self._vad_origin_samples * 1000.0 / self.wire.rate

    # -- conversion ------------------------------------------------------------

    def convert(self, data: bytes) -> bytes:
        """Wire bytes → engine-rate PCM16 LE bytes (possibly empty while the filter fills).

        Raises :class:`ProtocolError` ``INVALID_AUDIO_LENGTH`` for a partial sample.
        """
        self.wire.check_length(len(data))
        self._to_vad = None  # the VAD feed would now have a gap: end it
        if self._passthrough:
            self._input_samples += len(data) // 2
            return bytes(data)
        samples = self._decode(data)
        return self._engine_bytes(samples)

    def convert_with_vad_feed(self, data: bytes) -> tuple[bytes, npt.NDArray[np.float32]]:
        """Like :meth:`convert`, also returning the same audio as float32 at 16 kHz.

        The VAD samples are time-aligned with the input (sample ``k`` of the feed is
        at ``vad_origin_ms + k / 16`` ms), though the resampler may release them late.
        """
        self.wire.check_length(len(data))
        if self._to_vad is None:
            # Quick quality: the detector needs no studio fidelity, but every ms the
            # resampler holds back delays the end of a turn.
            self._to_vad = StreamResampler(self.wire.rate, VAD_RATE, "QQ")
            self._vad_origin_samples = self._input_samples
        samples = self._decode(data)
        vad = self._to_vad.process(samples)
        if self._passthrough:
            return bytes(data), vad
        return self._engine_bytes(samples), vad

    def flush(self) -> bytes:
        """End the engine stream (e.g. on commit): its held-back tail as PCM16 bytes.

        The engine resampler then starts afresh; the VAD feed is left running
        because the caller's audio stream itself continues.
        """
        return float_to_pcm16(self._to_engine.flush()).astype(_PCM16_LE, copy=False).tobytes()

    def reset(self) -> None:
        """Forget everything: resampler state, the VAD feed and the input clock."""
        self._to_engine.reset()
        self._to_vad = None
        self._vad_origin_samples = 0
        self._input_samples = 0

    # -- helpers ---------------------------------------------------------------

    def _decode(self, data: bytes) -> npt.NDArray[np.float32]:
        samples = decode(data, self.wire.encoding)
        self._input_samples += samples.size
        return samples

    def _engine_bytes(self, samples: npt.NDArray[np.float32]) -> bytes:
        resampled = self._to_engine.process(samples)
        return float_to_pcm16(resampled).astype(_PCM16_LE, copy=False).tobytes()


class OutputConverter:
    """Engine PCM16 LE mono → the client's wire format, one response at a time.

    Engine chunks may split a sample across two chunks; the odd byte is carried
    over to the next call. Not thread-safe: one instance per session.
    """

    def __init__(self, engine_rate: int, wire: AudioFormat, *, quality: Quality = "HQ") -> None:
        self.engine_rate: Final = engine_rate
        self.wire: Final = wire
        self._resampler = StreamResampler(engine_rate, wire.rate, quality)
        self._pending = b""  # an odd trailing byte: half of a PCM16 sample

    def convert(self, pcm16: bytes) -> bytes:
        """Engine PCM16 LE bytes → wire bytes (possibly empty while the filter fills)."""
        if self._pending:
            pcm16 = self._pending + pcm16
            self._pending = b""
        if len(pcm16) % 2:
            self._pending = pcm16[-1:]
            pcm16 = pcm16[:-1]
        if not pcm16:
            return b""
        if self._resampler.is_identity:
            if self.wire.encoding is Encoding.PCM16:
                return bytes(pcm16)
            # Integer path: G.711 from int16 is exact, no float round trip.
            return encode_pcm16(decode_pcm16(pcm16), self.wire.encoding)
        samples = decode(pcm16, Encoding.PCM16)
        return encode(self._resampler.process(samples), self.wire.encoding)

    def flush(self) -> bytes:
        """End of a response: the resampler's tail as wire bytes, then a clean reset."""
        self._pending = b""  # half a sample cannot be played
        tail = self._resampler.flush()
        return encode(tail, self.wire.encoding) if tail.size else b""

    def reset(self) -> None:
        """Drop buffered audio and filter state without emitting it (cancel/barge-in)."""
        self._pending = b""
        self._resampler.reset()
