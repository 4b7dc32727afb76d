"""A session's caller-audio pipeline: decode, resample to the engine, and scan for speech.

One instance per session, run on a worker thread (never on the event loop) and
never concurrently with itself: the connection awaits each chunk in order.
"""

from __future__ import annotations

from dataclasses import dataclass

from duplex_gateway.audio.convert import InputConverter
from duplex_gateway.audio.format import AudioFormat
from duplex_gateway.vad import SileroVad, SileroVadStream

__all__ = ["InputPipeline", "ProcessedInput"]


@dataclass(frozen=True, slots=True)
class ProcessedInput:
    """One chunk of caller audio, ready for the session."""

    pcm: bytes  # PCM16 mono at the engine's input rate
    duration_ms: float  # how much caller audio the chunk held
    windows: tuple[tuple[int, float], ...]  # VAD (end_ms, probability), on the session's input clock


class InputPipeline:
    """Wire bytes in the session's input format → :class:`ProcessedInput`.

    ``start_ms`` places this pipeline on the session's input clock when it
    replaces an earlier one (the client changed its input format mid-session).
    """

    def __init__(self, wire: AudioFormat, engine_rate: int, *, vad: bool, start_ms: float = 0.0) -> None:
        self.wire = wire
        self.vad = vad
        self._start_ms = start_ms
        self._converter = InputConverter(wire, engine_rate)
        self._vad_stream: SileroVadStream | None = SileroVad.shared().stream() if vad else None

    @property
    def position_ms(self) -> float:
        """Caller audio seen so far, on the session's input clock."""
        return self._start_ms + self._converter.input_ms

    def process(self, data: bytes) -> ProcessedInput:
        """Convert one chunk; raises ``ProtocolError`` for a partial sample."""
        before = self.position_ms
        if self._vad_stream is None:
            pcm = self._converter.convert(data)
            return ProcessedInput(pcm, self.position_ms - before, ())
        pcm, feed = self._converter.convert_with_vad_feed(data)
        origin = self._start_ms + self._converter.vad_origin_ms
        windows = tuple(
            (int(origin + window.end_ms), window.probability) for window in self._vad_stream.process(feed)
        )
        return ProcessedInput(pcm, self.position_ms - before, windows)

    def flush(self) -> bytes:
        """End of a turn: the engine-rate audio the resampler still holds (its filter delay)."""
        return self._converter.flush()
