"""A session's audio on its way in and out: decode, resample, scan for speech; encode.

Decoding and resampling a 20 ms frame take microseconds, so they run on the event
loop; only the VAD model runs elsewhere, batched with every other session's
windows (:class:`~duplex_gateway.audio.vad_batch.VadBatcher`). A frame that completes no
VAD window is done without waiting at all.

On the way out, :class:`OutputStage` converts reply audio to the client's format
and keeps the fence: the resampler holds back the last few ms of the audio it
converts, and audio held back for a reply that was cancelled is discarded, never
flushed, so not one byte of it reaches the client after the cancel.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from duplex_gateway.audio.convert import InputConverter, OutputConverter
from duplex_gateway.audio.vad import SileroVadStream
from duplex_gateway.audio.vad_batch import VadBatcher
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat

__all__ = ["InputStage", "OutputStage", "ProcessedInput"]


@dataclass(frozen=True, slots=True)
class ProcessedInput:
    """One chunk of caller audio, ready for the session."""

    pcm: bytes  # PCM16 mono at the engine's input rate
    duration_ms: float  # how much caller audio the chunk held
    windows: tuple[tuple[int, float], ...]  # VAD (end_ms, probability), on the session's input clock


class InputStage:
    """Wire bytes in the session's input format → :class:`ProcessedInput`.

    ``start_ms`` places this stage on the session's input clock when it replaces
    an earlier one (the client changed its input format mid-session). Not for
    concurrent use: a session awaits each chunk before the next.
    """

    def __init__(
        self,
        wire: AudioFormat,
        engine_rate: int,
        *,
        vad: VadBatcher | None,
        start_ms: float = 0.0,
        recent_ms: float = 0.0,
    ) -> None:
        """``recent_ms``: how much of the latest 16 kHz audio :meth:`recent` keeps (0: none)."""
        self.wire = wire
        self.vad = vad is not None
        self.recent_ms = recent_ms
        self._recent: deque[npt.NDArray[np.float32]] = deque()
        self._recent_samples = 0
        self._start_ms = start_ms
        self._converter = InputConverter(wire, engine_rate)
        self._batcher = vad
        self._vad_stream: SileroVadStream | None = vad.model.stream() if vad is not None else None

    @property
    def position_ms(self) -> float:
        """Caller audio seen so far, on the session's input clock."""
        return self._start_ms + self._converter.input_ms

    async def process(self, data: bytes) -> ProcessedInput:
        """Convert one chunk; raises ``ProtocolError`` for a partial sample."""
        before = self.position_ms
        if self._batcher is None or self._vad_stream is None:
            pcm = self._converter.convert(data)
            return ProcessedInput(pcm, self.position_ms - before, ())
        pcm, feed = self._converter.convert_with_vad_feed(data)
        origin = self._start_ms + self._converter.vad_origin_ms
        duration = self.position_ms - before
        if self.recent_ms > 0 and feed.size:
            self._keep(feed)
        found = await self._batcher.windows(self._vad_stream, feed)
        windows = tuple((int(origin + window.end_ms), window.probability) for window in found)
        return ProcessedInput(pcm, duration, windows)

    def flush(self) -> bytes:
        """End of a turn: the engine-rate audio the resampler still holds (its filter delay)."""
        return self._converter.flush()

    def recent(self) -> npt.NDArray[np.float32]:
        """The latest ``recent_ms`` of caller audio at 16 kHz (what an end-of-turn model hears)."""
        if not self._recent:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(list(self._recent))

    def _keep(self, feed: npt.NDArray[np.float32]) -> None:
        limit = int(self.recent_ms * 16)
        self._recent.append(feed.astype(np.float32, copy=True))
        self._recent_samples += feed.size
        while self._recent and self._recent_samples - self._recent[0].size >= limit:
            self._recent_samples -= self._recent.popleft().size


class OutputStage:
    """Reply audio from the engine's rate to the client's format, fenced by the session's epoch."""

    def __init__(self, engine_rate: int) -> None:
        self._engine_rate = engine_rate
        self._converter: OutputConverter | None = None
        self._epoch = 0

    def encode(self, event: ev.ServerEvent, wire: AudioFormat, epoch: int) -> list[ev.ServerEvent]:
        """``event`` as the client gets it: audio converted, a finished reply's tail added.

        ``epoch`` is the session's: it advances whenever the session cancels a reply,
        before it hands out that reply's closing events, so audio converted in an
        older epoch belongs to a cancelled reply.
        """
        if not isinstance(event, ev.AudioDelta | ev.AudioDone):
            return [event]
        converter = self._converter_for(wire, epoch)
        if isinstance(event, ev.AudioDelta):
            audio = converter.convert(event.audio)
            if not audio:
                return []
            return [replace(event, audio=audio, rate=wire.rate, encoding=wire.encoding, encoded=True)]
        tail = converter.flush()
        if not tail:
            return [event]
        delta = ev.AudioDelta(
            response_id=event.response_id,
            item_id=event.item_id,
            audio=tail,
            rate=wire.rate,
            encoding=wire.encoding,
            encoded=True,
        )
        return [delta, event]

    def _converter_for(self, wire: AudioFormat, epoch: int) -> OutputConverter:
        converter = self._converter
        if converter is None or converter.wire != wire:
            converter = self._converter = OutputConverter(self._engine_rate, wire)
        if epoch != self._epoch:
            converter.reset()  # what it holds is a cancelled reply's
            self._epoch = epoch
        return converter
