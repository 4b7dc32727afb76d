"""Per-client and per-key limits on WebSocket connections: a rate (token bucket) and concurrent caps.

Pure: the clock comes in as ``now`` (seconds). Both structures forget a client once it has nothing
to remember (a full bucket, no open session), so their memory follows the clients active now.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["CapReached", "RateLimiter", "SessionCaps", "SessionHold", "retry_after"]


class RateLimiter:
    """``per_minute`` connections per client, refilled evenly, with bursts of up to as many."""

    #: Above this many remembered clients, the ones whose buckets have refilled are forgotten.
    PRUNE_ABOVE = 10_000

    def __init__(self, per_minute: int) -> None:
        if per_minute < 1:
            raise ValueError("per_minute is at least 1")
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0  # tokens per second
        self._buckets: dict[str, tuple[float, float]] = {}  # client -> (tokens, at)

    def _level(self, client: str, now: float) -> float:
        tokens, at = self._buckets.get(client, (self.capacity, now))
        return min(self.capacity, tokens + max(0.0, now - at) * self.rate)

    def wait_s(self, client: str, now: float) -> float:
        """Seconds until ``client`` may connect (0: now), without taking anything."""
        level = self._level(client, now)
        return 0.0 if level >= 1.0 else (1.0 - level) / self.rate

    def take(self, client: str, now: float) -> float:
        """Take one connection for ``client``: 0 if allowed, else the seconds to wait (nothing taken)."""
        level = self._level(client, now)
        if level < 1.0:
            self._buckets[client] = (level, now)
            return (1.0 - level) / self.rate
        self._buckets[client] = (level - 1.0, now)
        if len(self._buckets) > self.PRUNE_ABOVE:
            self._prune(now)
        return 0.0

    def _prune(self, now: float) -> None:
        full = [c for c in self._buckets if self._level(c, now) >= self.capacity]
        for client in full:
            del self._buckets[client]

    def __len__(self) -> int:
        return len(self._buckets)


@dataclass(frozen=True, slots=True)
class CapReached:
    """A cap a new session would pass: whose, and how many sessions it allows."""

    who: str  # "key" or "ip"
    limit: int


@dataclass(eq=False, slots=True)
class SessionHold:
    """One counted session; :meth:`release` (idempotent) uncounts it."""

    caps: SessionCaps
    key: str | None
    ip: str | None
    released: bool = field(default=False)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.caps._release(self)


class SessionCaps:
    """Open sessions per key name and per client address, against their caps."""

    def __init__(self, per_ip: int | None = None) -> None:
        self.per_ip = per_ip
        self._by_key: dict[str, int] = {}
        self._by_ip: dict[str, int] = {}

    def check(self, key: str | None, key_cap: int | None, ip: str | None) -> CapReached | None:
        """The cap one more session would pass, or None (nothing is counted)."""
        if key is not None and key_cap is not None and self._by_key.get(key, 0) >= key_cap:
            return CapReached("key", key_cap)
        if ip is not None and self.per_ip is not None and self._by_ip.get(ip, 0) >= self.per_ip:
            return CapReached("ip", self.per_ip)
        return None

    def acquire(self, key: str | None, key_cap: int | None, ip: str | None) -> SessionHold | CapReached:
        """Count one more session for ``key`` and ``ip``, or say which cap it would pass."""
        reached = self.check(key, key_cap, ip)
        if reached is not None:
            return reached
        if key is not None:
            self._by_key[key] = self._by_key.get(key, 0) + 1
        if ip is not None:
            self._by_ip[ip] = self._by_ip.get(ip, 0) + 1
        return SessionHold(self, key, ip)

    def _release(self, hold: SessionHold) -> None:
        for counts, name in ((self._by_key, hold.key), (self._by_ip, hold.ip)):
            if name is None:
                continue
            left = counts.get(name, 0) - 1
            if left > 0:
                counts[name] = left
            else:
                counts.pop(name, None)

    def open_for_key(self, key: str) -> int:
        return self._by_key.get(key, 0)

    def open_for_ip(self, ip: str) -> int:
        return self._by_ip.get(ip, 0)


def retry_after(seconds: float) -> int:
    """A ``Retry-After`` value: whole seconds, at least 1."""
    return max(1, math.ceil(seconds))
