"""The Redis state store against a real redis-server: journal, records, leases, expiry, outages."""

from __future__ import annotations

import asyncio

import pytest

from duplex_gateway.state.records import (
    Acknowledge,
    AppendEvents,
    Forget,
    JournalEntry,
    SaveRecord,
    SessionRecord,
    token_digest,
    token_matches,
)
from duplex_gateway.state.redis_store import RedisStateStore
from duplex_gateway.state.store import StoreUnavailable
from tests.redis_server import RedisServer

TTL_MS = 60_000


def record(session_id: str = "sess_a", owner: str = "gw-1", grace_ms: int = 30_000) -> SessionRecord:
    return SessionRecord(
        session_id=session_id,
        owner=owner,
        token_digest=token_digest("secret-token"),
        dialect="realtime",
        handshake="duplex",
        config='{"voice": "alloy"}',
        grace_ms=grace_ms,
    )


def events(first: int, last: int) -> tuple[JournalEntry, ...]:
    """Text and binary frames alike, as a session's journal holds both."""
    return tuple(
        JournalEntry(seq, f'{{"type":"e","seq":{seq}}}' if seq % 2 else bytes([seq % 256]) * 3)
        for seq in range(first, last + 1)
    )


async def test_a_record_round_trips_and_its_token_is_kept_as_a_digest(store: RedisStateStore) -> None:
    await store.write([SaveRecord(record(), TTL_MS)])
    loaded = await store.load("sess_a")
    assert loaded == record()
    assert loaded is not None and token_matches(loaded, "secret-token")
    assert not token_matches(loaded, "secret-tokeN")
    assert await store.load("sess_missing") is None


async def test_the_journal_replays_what_a_client_missed_and_knows_its_head(store: RedisStateStore) -> None:
    await store.write([AppendEvents("sess_a", events(1, 10), max_events=100, ttl_ms=TTL_MS)])
    replay = await store.replay("sess_a", 6)
    assert replay.entries == events(7, 10)
    assert (replay.first_kept, replay.head) == (1, 10)
    assert replay.covers(0) and replay.covers(10)
    assert not replay.covers(11)  # a client cannot have seen an event never sent


async def test_acknowledged_events_are_dropped_but_the_head_stays(store: RedisStateStore) -> None:
    await store.write([AppendEvents("sess_a", events(1, 5), max_events=100, ttl_ms=TTL_MS)])
    await store.write([Acknowledge("sess_a", 5)])
    replay = await store.replay("sess_a", 5)
    assert replay.entries == ()
    assert (replay.first_kept, replay.head) == (None, 5)
    assert replay.covers(5)


async def test_the_journal_keeps_its_latest_events_and_says_a_gap_is_a_gap(store: RedisStateStore) -> None:
    await store.write([AppendEvents("sess_a", events(1, 30), max_events=8, ttl_ms=TTL_MS)])
    replay = await store.replay("sess_a", 0)
    assert replay.entries == events(23, 30)
    assert not replay.covers(21)
    assert replay.covers(22)


async def test_an_event_written_twice_keeps_the_first(store: RedisStateStore) -> None:
    """A batch retried after a timeout that hid its success must not fail or duplicate."""
    batch = [AppendEvents("sess_a", events(1, 3), max_events=100, ttl_ms=TTL_MS)]
    await store.write(batch)
    await store.write([*batch, AppendEvents("sess_a", events(4, 4), max_events=100, ttl_ms=TTL_MS)])
    assert (await store.replay("sess_a", 0)).entries == events(1, 4)


async def test_a_takeover_waits_for_the_lease_to_lapse(store: RedisStateStore) -> None:
    await store.write([SaveRecord(record(), TTL_MS)])
    assert await store.take_lease("sess_a", "gw-1", 300, unless_held=False)
    assert not await store.take_lease("sess_a", "gw-2", 300, unless_held=True)
    assert await store.take_lease("sess_a", "gw-1", 300, unless_held=True)  # its own: renewed
    await asyncio.sleep(0.45)
    assert await store.owner("sess_a") is None
    assert await store.take_lease("sess_a", "gw-2", 300, unless_held=True)
    loaded = await store.load("sess_a")
    assert loaded is not None and loaded.owner == "gw-2"


async def test_renewal_keeps_a_session_alive_and_reports_lost_ones(store: RedisStateStore) -> None:
    for session_id in ("sess_a", "sess_b"):
        await store.write(
            [
                SaveRecord(record(session_id, grace_ms=200), 400),
                AppendEvents(session_id, events(1, 2), max_events=100, ttl_ms=400),
            ]
        )
        await store.take_lease(session_id, "gw-1", 400, unless_held=False)
    await store.take_lease("sess_b", "gw-2", 400, unless_held=False)  # taken over
    for _ in range(4):
        await asyncio.sleep(0.2)
        assert await store.renew("gw-1", ["sess_a", "sess_b"], 400) == ["sess_b"]
    assert await store.load("sess_a") is not None
    assert (await store.replay("sess_a", 0)).head == 2
    # Not renewed: the lease lapses, and the data one grace after it.
    await asyncio.sleep(0.75)
    assert await store.owner("sess_a") is None
    assert await store.load("sess_a") is None
    assert (await store.replay("sess_a", 0)).head == 0


async def test_forget_deletes_everything(store: RedisStateStore) -> None:
    await store.write(
        [SaveRecord(record(), TTL_MS), AppendEvents("sess_a", events(1, 2), max_events=100, ttl_ms=TTL_MS)]
    )
    await store.take_lease("sess_a", "gw-1", TTL_MS, unless_held=False)
    await store.write([Forget("sess_a")])
    assert await store.load("sess_a") is None
    assert await store.owner("sess_a") is None
    assert (await store.replay("sess_a", 0)).head == 0


async def test_a_store_that_is_down_fails_fast_and_works_again_when_back(
    store: RedisStateStore, redis_server: RedisServer
) -> None:
    await store.ping()
    redis_server.kill()
    loop = asyncio.get_running_loop()
    began = loop.time()
    with pytest.raises(StoreUnavailable):
        await store.write([SaveRecord(record(), TTL_MS)])
    with pytest.raises(StoreUnavailable):
        await store.load("sess_a")
    assert loop.time() - began < 3.0  # bounded by the store's timeout, not TCP's
    redis_server.start()
    for _ in range(50):  # the client reconnects on its own
        try:
            await store.ping()
            break
        except StoreUnavailable:
            await asyncio.sleep(0.1)
    await store.write([SaveRecord(record(), TTL_MS)])
    assert await store.load("sess_a") == record()


async def test_only_the_owner_releases_a_lease(store: RedisStateStore) -> None:
    await store.take_lease("sess_a", "gw-1", TTL_MS, unless_held=False)
    await store.release_lease("sess_a", "gw-2")
    assert await store.owner("sess_a") == "gw-1"
    await store.release_lease("sess_a", "gw-1")
    assert await store.owner("sess_a") is None
