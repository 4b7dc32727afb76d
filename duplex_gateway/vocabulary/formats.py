"""Audio wire formats: an encoding plus a sample rate, and the byte arithmetic on them."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

__all__ = ["MAX_RATE", "MIN_RATE", "AudioFormat", "Encoding"]

MIN_RATE = 8_000
MAX_RATE = 48_000


class Encoding(enum.StrEnum):
    """Sample encodings a client may stream in or ask for."""

    PCM16 = "pcm16"  # signed 16-bit little-endian
    PCM_F32LE = "pcm_f32le"  # 32-bit float little-endian, -1.0..1.0
    G711_ULAW = "g711_ulaw"
    G711_ALAW = "g711_alaw"

    @property
    def bytes_per_sample(self) -> int:
        return _BYTES_PER_SAMPLE[self]

    @property
    def is_g711(self) -> bool:
        """A telephone codec (8 kHz unless said otherwise)."""
        return self in (Encoding.G711_ULAW, Encoding.G711_ALAW)


_BYTES_PER_SAMPLE = {
    Encoding.PCM16: 2,
    Encoding.PCM_F32LE: 4,
    Encoding.G711_ULAW: 1,
    Encoding.G711_ALAW: 1,
}


@dataclass(frozen=True, slots=True, kw_only=True)
class AudioFormat:
    """One mono audio format on the wire."""

    encoding: Encoding
    rate: int

    def __post_init__(self) -> None:
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE,
                f"sample rate {self.rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz",
            )

    @property
    def bytes_per_second(self) -> int:
        return self.rate * self.encoding.bytes_per_sample

    def duration_ms(self, byte_count: int) -> float:
        """How much audio ``byte_count`` bytes of this format hold."""
        return byte_count * 1000.0 / self.bytes_per_second

    def byte_count(self, duration_ms: float) -> int:
        """Bytes for ``duration_ms`` of audio, rounded down to whole samples."""
        samples = int(self.rate * duration_ms / 1000.0)
        return samples * self.encoding.bytes_per_sample

    def check_length(self, byte_count: int) -> None:
        """Refuse a payload that is not a whole number of samples."""
        width = self.encoding.bytes_per_sample
        if byte_count % width:
            raise ProtocolError(
                ErrorCode.INVALID_AUDIO_LENGTH,
                f"{byte_count} bytes is not a whole number of {width}-byte {self.encoding} samples",
            )

    def __str__(self) -> str:
        return f"{self.encoding}@{self.rate}"
