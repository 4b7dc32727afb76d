"""Input pacing: refuse caller audio that arrives much faster than real time.

A token bucket measured in milliseconds of audio, refilled at ``factor`` times
wall-clock time, with ``burst_ms`` of head-room for network jitter. Pure: the
caller passes the clock reading.
"""

from __future__ import annotations

__all__ = ["AudioRateLimiter"]


class AudioRateLimiter:
    """Admits audio at up to ``factor`` × real time plus a ``burst_ms`` allowance."""

    def __init__(self, *, factor: float, burst_ms: float) -> None:
        if factor <= 0 or burst_ms < 0:
            raise ValueError("factor must be positive and burst_ms non-negative")
        self.factor = factor
        self.burst_ms = burst_ms
        self._tokens_ms = burst_ms
        self._last: float | None = None

    def admit(self, audio_ms: float, now: float) -> bool:
        """Take ``audio_ms`` from the bucket at time ``now`` (seconds); False if it would overflow."""
        if self._last is not None:
            elapsed_ms = max(0.0, now - self._last) * 1000.0
            self._tokens_ms = min(self.burst_ms, self._tokens_ms + elapsed_ms * self.factor)
        self._last = now
        if audio_ms > self._tokens_ms:
            return False
        self._tokens_ms -= audio_ms
        return True
