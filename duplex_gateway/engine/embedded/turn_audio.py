"""The caller's turn as it is spoken: its most recent audio, and how loud it has been.

The embedded engine transcribes a turn early, when the caller pauses, and must
then tell whether anything but quiet came after that point: if not, the early
words still stand for the turn. That question is asked every partial step, so
the loudness is kept as a running sum and each answer costs nothing.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Final

import numpy as np

__all__ = ["Mark", "TurnAudio"]

#: Audio after a point counts as quiet if its RMS is below this share of the turn's.
QUIET_RATIO: Final = 0.25


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """A point in the turn: the bytes appended before it and their summed energy."""

    at: int
    energy: float


class TurnAudio:
    """PCM16 of one turn: its most recent ``max_bytes``, and the energy of all of it."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max(2, max_bytes - max_bytes % 2)
        self._pcm = bytearray()
        self._total = 0
        self._energy = 0.0
        # An odd byte left by a chunk, waiting for its pair before it is a sample.
        self._odd = b""

    def __len__(self) -> int:
        return len(self._pcm)

    @property
    def total(self) -> int:
        """Bytes appended to this turn in all (the buffer itself may have been trimmed)."""
        return self._total

    def append(self, pcm: bytes) -> None:
        """Add caller audio; a monologue keeps only its most recent ``max_bytes``."""
        self._pcm += pcm
        self._total += len(pcm)
        whole = self._odd + pcm
        even = len(whole) - len(whole) % 2
        self._odd = whole[even:]
        if even:
            samples = np.frombuffer(whole[:even], dtype="<i2").astype(np.float64)
            self._energy += float(np.dot(samples, samples))
        overflow = len(self._pcm) - self._max_bytes
        if overflow > 0:
            del self._pcm[: overflow + (overflow & 1)]

    def clear(self) -> None:
        """Start the next turn."""
        self._pcm.clear()
        self._total = 0
        self._energy = 0.0
        self._odd = b""

    def snapshot(self) -> bytes:
        """The audio kept, as it is now."""
        return bytes(self._pcm)

    def mark(self) -> Mark:
        """This point in the turn, to ask later what came after it."""
        return Mark(at=self._total, energy=self._energy)

    def since(self, mark: Mark) -> int:
        """Bytes appended after ``mark``; negative if the mark is from a later (cleared) turn."""
        return self._total - mark.at

    def quiet_since(self, mark: Mark) -> bool:
        """Whether everything after ``mark`` is much quieter than the turn as a whole."""
        tail_bytes = self.since(mark)
        if tail_bytes < 0:
            return False
        if tail_bytes < 2 or self._total < 2:
            return True
        tail_rms = math.sqrt(max(0.0, self._energy - mark.energy) / (tail_bytes // 2))
        whole_rms = math.sqrt(self._energy / (self._total // 2))
        return tail_rms <= QUIET_RATIO * whole_rms
