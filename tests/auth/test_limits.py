"""The connection rate per address (token bucket) and the concurrent caps per key and address."""

from __future__ import annotations

import pytest

from duplex_gateway.auth.limits import CapReached, RateLimiter, SessionCaps, SessionHold, retry_after


def test_bucket_bursts_then_refills_evenly() -> None:
    rate = RateLimiter(6)  # 6 a minute: one every 10 s
    assert [rate.take("a", 0.0) for _ in range(6)] == [0.0] * 6
    assert rate.take("a", 0.0) == pytest.approx(10.0)
    assert rate.take("b", 0.0) == 0.0  # addresses are apart
    assert rate.wait_s("a", 4.0) == pytest.approx(6.0)
    assert rate.take("a", 9.0) == pytest.approx(1.0)  # a refused try takes nothing
    assert rate.take("a", 10.0) == 0.0
    assert rate.take("a", 10.0) > 0
    # A long pause refills it to the burst, no further.
    assert [rate.take("a", 1000.0) for _ in range(7)][-2:] == [0.0, pytest.approx(10.0)]


def test_peeking_takes_nothing() -> None:
    rate = RateLimiter(1)
    assert rate.wait_s("a", 0.0) == 0.0 and rate.wait_s("a", 0.0) == 0.0
    assert rate.take("a", 0.0) == 0.0 and rate.wait_s("a", 0.0) == pytest.approx(60.0)


def test_a_clock_going_back_refills_nothing() -> None:
    rate = RateLimiter(1)
    rate.take("a", 100.0)
    assert rate.take("a", 50.0) > 0


def test_full_buckets_are_forgotten() -> None:
    rate = RateLimiter(60)
    rate.PRUNE_ABOVE = 3
    for i in range(4):
        rate.take(f"c{i}", 0.0)
    assert len(rate) == 4
    rate.take("late", 10.0)  # the others refilled meanwhile
    assert len(rate) <= 2


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after(0.01) == 1 and retry_after(1.0) == 1 and retry_after(1.2) == 2


def test_caps_per_key_and_per_address() -> None:
    caps = SessionCaps(per_ip=2)
    first = caps.acquire("web", 2, "10.0.0.1")
    second = caps.acquire("web", 2, "10.0.0.2")
    assert isinstance(first, SessionHold) and isinstance(second, SessionHold)
    assert caps.acquire("web", 2, "10.0.0.3") == CapReached("key", 2)
    assert caps.open_for_key("web") == 2
    other = caps.acquire("other", None, "10.0.0.1")
    assert isinstance(other, SessionHold)
    assert caps.acquire(None, None, "10.0.0.1") == CapReached("ip", 2)
    assert caps.check("other", None, "10.0.0.9") is None
    first.release()
    first.release()  # idempotent
    assert caps.open_for_key("web") == 1 and caps.open_for_ip("10.0.0.1") == 1
    assert isinstance(caps.acquire("web", 2, "10.0.0.1"), SessionHold)


def test_no_caps_count_but_never_refuse() -> None:
    caps = SessionCaps()
    holds = [caps.acquire("k", None, "1.2.3.4") for _ in range(100)]
    assert all(isinstance(h, SessionHold) for h in holds) and caps.open_for_ip("1.2.3.4") == 100
    for hold in holds:
        assert isinstance(hold, SessionHold)
        hold.release()
    assert caps.open_for_key("k") == 0 and caps.open_for_ip("1.2.3.4") == 0
