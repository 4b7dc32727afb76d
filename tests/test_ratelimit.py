from __future__ import annotations

import pytest

from duplex_gateway.ratelimit import AudioRateLimiter


def test_real_time_stream_is_admitted_indefinitely() -> None:
    limiter = AudioRateLimiter(factor=1.5, burst_ms=200)
    assert all(limiter.admit(20, i * 0.02) for i in range(5000))


def test_double_speed_stream_is_refused_after_the_burst() -> None:
    limiter = AudioRateLimiter(factor=1.5, burst_ms=200)
    results = [limiter.admit(20, i * 0.01) for i in range(200)]
    assert all(results[:10])
    assert not all(results)
    # Refusals leave the bucket intact: about 1.5x real time still gets through.
    admitted_ms = 20 * sum(results)
    assert admitted_ms == pytest.approx(200 + 1.5 * 1990, rel=0.05)


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        AudioRateLimiter(factor=0, burst_ms=1)
