"""Streaming sample-rate conversion for one mono float32 stream.

A WebSocket client sends audio in arbitrary chunks; resampling each chunk on its
own would restart the filter at every edge and click. :class:`StreamResampler`
keeps soxr's filter state between calls, so the concatenated output of any
chunking equals resampling the whole signal at once.

soxr's HQ filter holds back a few tens of milliseconds and releases output in
blocks, so a call may return nothing; the output is time-aligned (sample ``k`` is
at ``k / out_rate`` seconds) and :meth:`StreamResampler.flush` releases the rest.
"""

from __future__ import annotations

from typing import Final, Literal

import numpy as np
import numpy.typing as npt
import soxr

__all__ = ["Quality", "StreamResampler"]

Quality = Literal["QQ", "LQ", "MQ", "HQ", "VHQ"]

_EMPTY: Final = np.zeros(0, dtype=np.float32)
_EMPTY.flags.writeable = False


class StreamResampler:
    """Stateful mono float32 resampler from ``in_rate`` to ``out_rate``.

    Not thread-safe: one instance per stream, used from one task at a time.
    """

    def __init__(self, in_rate: int, out_rate: int, quality: Quality = "HQ") -> None:
        if in_rate <= 0 or out_rate <= 0:
            raise ValueError(f"sample rates must be positive, got {in_rate} -> {out_rate}")
        self.in_rate: Final = in_rate
        self.out_rate: Final = out_rate
        self.quality: Final = quality
        # Equal rates need no filter at all: pass samples straight through.
        self._stream: soxr.ResampleStream | None = (
            None
            if in_rate == out_rate
            else soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality=quality)
        )
        self._dirty = False

    @property
    def is_identity(self) -> bool:
        """True when input and output rates match and samples pass through unchanged."""
        return self._stream is None

    def process(self, chunk: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
        """Resample the next chunk of the stream; may return fewer (or no) samples.

        On the identity path the result may be ``chunk`` itself, not a copy.
        """
        samples = np.ascontiguousarray(chunk, dtype=np.float32)
        if samples.ndim != 1:
            raise ValueError(f"expected mono 1-D samples, got shape {samples.shape}")
        if self._stream is None:
            return samples
        if samples.size == 0:
            return _EMPTY
        self._dirty = True
        out: npt.NDArray[np.float32] = self._stream.resample_chunk(samples, last=False)
        return out

    def flush(self) -> npt.NDArray[np.float32]:
        """End the stream: return the samples still held in the filter, then reset.

        After a flush the resampler starts a fresh, independent stream, as after
        :meth:`reset`.
        """
        if self._stream is None or not self._dirty:
            return _EMPTY
        out: npt.NDArray[np.float32] = self._stream.resample_chunk(_EMPTY, last=True)
        self.reset()
        return out

    def reset(self) -> None:
        """Drop all buffered input and filter state (for a cancel or a new stream)."""
        if self._stream is not None and self._dirty:
            self._stream.clear()
        self._dirty = False

    def output_length(self, input_samples: int) -> int:
        """How many samples a stream of ``input_samples`` yields in total, once flushed."""
        # soxr emits round(n * out / in) samples for a flushed stream; integer maths
        # avoids float error on long sessions.
        return (2 * input_samples * self.out_rate + self.in_rate) // (2 * self.in_rate)
