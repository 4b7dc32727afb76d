"""The state store on Redis (or Valkey): one hash, one stream and one lease key per session.

``dg:{<session_id>}:rec`` is the session's record (a hash), ``dg:{<session_id>}:jrnl``
its journal (a stream whose entry ids are the events' sequence numbers, so the
stream's last generated id is the session's last sequence number even once every
entry is trimmed), ``dg:{<session_id>}:lease`` the owning gateway's name with an
expiry. The braces keep a session's keys in one hash slot. Ownership changes
only in Lua scripts, which Redis runs atomically: a takeover cannot race a
renewal. Every call is bounded by ``timeout_s``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from duplex_gateway.extras import require
from duplex_gateway.state.records import (
    Acknowledge,
    AppendEvents,
    Forget,
    JournalEntry,
    Replay,
    SaveRecord,
    SessionRecord,
    Write,
)
from duplex_gateway.state.store import StateStore, StoreUnavailable

__all__ = ["RedisStateStore"]

_TAKE_LEASE = """
local current = redis.call('GET', KEYS[1])
if ARGV[3] == '1' and current and current ~= ARGV[1] then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HSET', KEYS[2], 'owner', ARGV[1])
end
return 1
"""

_RELEASE_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease, record and journal of each session in turn. Returns the (1-based) positions of
# the sessions whose lease is not the owner's any more.
_RENEW = """
local lost = {}
for i = 1, #KEYS, 3 do
  if redis.call('GET', KEYS[i]) == ARGV[1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2])
    local ttl = tonumber(ARGV[2]) + tonumber(redis.call('HGET', KEYS[i + 1], 'grace_ms') or '0')
    redis.call('PEXPIRE', KEYS[i + 1], ttl)
    redis.call('PEXPIRE', KEYS[i + 2], ttl)
  else
    table.insert(lost, (i + 2) / 3)
  end
end
return lost
"""


def _keys(session_id: str) -> tuple[str, str, str]:
    """The session's record, journal and lease keys."""
    tag = f"dg:{{{session_id}}}"
    return f"{tag}:rec", f"{tag}:jrnl", f"{tag}:lease"


def _seq_of(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


def _entry(entry_id: bytes, fields: dict[bytes, bytes]) -> JournalEntry:
    if b"t" in fields:
        return JournalEntry(_seq_of(entry_id), fields[b"t"].decode())
    return JournalEntry(_seq_of(entry_id), fields[b"b"])


class RedisStateStore(StateStore):
    """A :class:`StateStore` at ``url`` (``redis://host:port/db``; ``rediss://`` for TLS)."""

    def __init__(self, url: str, *, timeout_s: float = 1.0) -> None:
        """Raises :class:`~duplex_gateway.extras.MissingExtra` without the ``fleet`` extra."""
        require("fleet", "server.state_store")
        import redis.asyncio as aioredis

        self.url = url
        #: The longest one call may take.
        self.timeout_s = timeout_s
        self._redis: Any = aioredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=False
        )
        self._take_lease = self._redis.register_script(_TAKE_LEASE)
        self._renew = self._redis.register_script(_RENEW)
        self._release_lease = self._redis.register_script(_RELEASE_LEASE)

    async def _bounded(self, call: Any) -> Any:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeout

        try:
            async with asyncio.timeout(self.timeout_s):
                return await call
        except (TimeoutError, RedisTimeout, RedisConnectionError, OSError) as exc:
            raise StoreUnavailable(f"{self.url}: {exc or type(exc).__name__}") from exc

    async def ping(self) -> None:
        await self._bounded(self._redis.ping())

    async def write(self, batch: Sequence[Write]) -> None:
        if not batch:
            return
        pipe = self._redis.pipeline(transaction=False)
        for write in batch:
            if isinstance(write, AppendEvents):
                _, journal, _ = _keys(write.session_id)
                for entry in write.entries:
                    field = "t" if isinstance(entry.frame, str) else "b"
                    pipe.xadd(
                        journal,
                        {field: entry.frame},
                        id=f"{entry.seq}-0",
                        maxlen=write.max_events,
                        approximate=False,
                    )
                pipe.pexpire(journal, write.ttl_ms)
            elif isinstance(write, SaveRecord):
                record, _, _ = _keys(write.record.session_id)
                pipe.delete(record)
                pipe.hset(record, mapping=write.record.fields())
                pipe.pexpire(record, write.ttl_ms)
            elif isinstance(write, Acknowledge):
                _, journal, _ = _keys(write.session_id)
                pipe.xtrim(journal, minid=f"{write.seq + 1}-0", approximate=False)
            elif isinstance(write, Forget):
                record, journal, lease = _keys(write.session_id)
                pipe.delete(record, journal, *([lease] if write.lease else []))
        # An event written twice (a batch retried after a timeout that hid its success) is
        # refused by the stream as not newer: the first write stands, and that is right.
        await self._bounded(pipe.execute(raise_on_error=False))

    async def load(self, session_id: str) -> SessionRecord | None:
        record, _, _ = _keys(session_id)
        raw = await self._bounded(self._redis.hgetall(record))
        if not raw:
            return None
        return SessionRecord.from_fields(session_id, {k.decode(): v.decode() for k, v in raw.items()})

    async def replay(self, session_id: str, after_seq: int) -> Replay:
        _, journal, _ = _keys(session_id)
        pipe = self._redis.pipeline(transaction=False)
        pipe.xrange(journal, min=f"{after_seq + 1}-0", max="+")
        pipe.xrange(journal, min="-", max="+", count=1)
        pipe.xinfo_stream(journal)
        entries, first, info = await self._bounded(pipe.execute(raise_on_error=False))
        if isinstance(info, Exception):  # no journal: no event was ever written
            return Replay((), None, 0)
        last = info.get(b"last-generated-id") or info.get("last-generated-id") or b"0-0"
        return Replay(
            tuple(_entry(entry_id, fields) for entry_id, fields in entries),
            _seq_of(first[0][0]) if first else None,
            _seq_of(last),
        )

    async def take_lease(self, session_id: str, owner: str, ttl_ms: int, *, unless_held: bool) -> bool:
        record, _, lease = _keys(session_id)
        taken = await self._bounded(
            self._take_lease(keys=[lease, record], args=[owner, ttl_ms, "1" if unless_held else "0"])
        )
        return bool(taken)

    async def release_lease(self, session_id: str, owner: str) -> None:
        _, _, lease = _keys(session_id)
        await self._bounded(self._release_lease(keys=[lease], args=[owner]))

    async def owner(self, session_id: str) -> str | None:
        _, _, lease = _keys(session_id)
        value = await self._bounded(self._redis.get(lease))
        return value.decode() if value is not None else None

    async def renew(self, owner: str, session_ids: Sequence[str], ttl_ms: int) -> list[str]:
        if not session_ids:
            return []
        keys: list[str] = []
        for session_id in session_ids:
            record, journal, lease = _keys(session_id)
            keys += [lease, record, journal]
        lost = await self._bounded(self._renew(keys=keys, args=[owner, ttl_ms]))
        return [session_ids[int(position) - 1] for position in lost]

    async def close(self) -> None:
        await self._redis.aclose()
