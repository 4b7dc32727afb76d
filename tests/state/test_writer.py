"""The store writer against a real redis-server: sessions mirrored as they go, outages healed whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from duplex_gateway.host.resumption import Journal
from duplex_gateway.state.records import JournalEntry, token_matches
from duplex_gateway.state.redis_store import RedisStateStore
from duplex_gateway.state.writer import StoreWriter
from tests.redis_server import RedisServer

LEASE_MS = 600
GRACE_MS = 30_000


class Session:
    """A session's side of the mirror: its journal, and the writer told of each event."""

    def __init__(self, writer: StoreWriter, session_id: str = "sess_a", max_events: int = 64) -> None:
        self.id = session_id
        self.writer = writer
        self.journal = Journal(max_events=max_events, max_bytes=1 << 20)
        self.seq = 0
        writer.track(
            session_id,
            dialect="realtime",
            handshake="duplex",
            token="token-1",
            journal=lambda: [JournalEntry(seq, frame) for seq, frame in self.journal.entries()],
        )

    def emit(self, count: int) -> None:
        for _ in range(count):
            self.seq += 1
            frame = f'{{"type":"e","seq":{self.seq}}}'
            self.journal.append(self.seq, frame)
            self.writer.event(self.id, self.seq, frame)

    def expected(self, after: int = 0) -> tuple[JournalEntry, ...]:
        return tuple(JournalEntry(seq, frame) for seq, frame in self.journal.entries() if seq > after)


async def settled(writer: StoreWriter, check: object, timeout: float = 5.0) -> None:
    """Wait until ``check()`` holds (the writer works on its own task)."""
    assert callable(check)
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)


@pytest.fixture
async def writer(store: RedisStateStore) -> AsyncIterator[StoreWriter]:
    writer = StoreWriter(store, owner="gw-1", lease_ms=LEASE_MS, grace_ms=GRACE_MS, max_events=64)
    writer.start()
    yield writer
    await writer.close()


async def test_a_session_is_mirrored_as_it_goes(writer: StoreWriter, store: RedisStateStore) -> None:
    session = Session(writer)
    writer.configured(session.id, '{"type":"session.updated","session":{"voice":"alloy"}}')
    session.emit(10)

    async def mirrored() -> bool:
        return (await store.replay(session.id, 0)).entries == session.expected()

    await settled(writer, mirrored)
    record = await store.load(session.id)
    assert record is not None
    assert record.owner == "gw-1" and token_matches(record, "token-1")
    assert record.config.startswith('{"type":"session.updated"')
    assert await store.owner(session.id) == "gw-1"

    writer.token(session.id, "token-2")
    session.journal.acknowledge(6)
    writer.acknowledged(session.id, 6)

    async def trimmed() -> bool:
        replay = await store.replay(session.id, 0)
        record = await store.load(session.id)
        return replay.first_kept == 7 and record is not None and token_matches(record, "token-2")

    await settled(writer, trimmed)
    # Renewed past several lease lengths.
    await asyncio.sleep(3 * LEASE_MS / 1000)
    assert await store.owner(session.id) == "gw-1"
    writer.ended(session.id)

    async def forgotten() -> bool:
        return await store.load(session.id) is None and await store.owner(session.id) is None

    await settled(writer, forgotten)


async def test_events_never_wait_for_a_store_that_is_down_and_are_all_there_once_it_is_back(
    writer: StoreWriter, store: RedisStateStore, redis_server: RedisServer
) -> None:
    session = Session(writer, max_events=64)
    session.emit(5)

    async def mirrored() -> bool:
        return (await store.replay(session.id, 0)).entries == session.expected()

    await settled(writer, mirrored)
    redis_server.kill()
    loop = asyncio.get_running_loop()
    began = loop.time()
    for _ in range(20):  # a session goes on: each event is taken at once
        session.emit(5)
        await asyncio.sleep(0.02)
    assert loop.time() - began < 2.0

    async def unhealthy() -> bool:
        return not writer.healthy

    await settled(writer, unhealthy)
    assert writer.problem
    # More than the journal holds went by while the store was away: the copy is rewritten whole.
    session.journal.acknowledge(50)
    writer.acknowledged(session.id, 50)
    redis_server.start()

    async def healed() -> bool:
        if not writer.healthy:
            return False
        replay = await store.replay(session.id, 0)
        record = await store.load(session.id)
        return (
            replay.entries == session.expected()
            and record is not None
            and max(record.head, replay.head) == session.seq
        )

    await settled(writer, healed, timeout=10)
    assert await store.owner(session.id) == "gw-1"
    assert writer.failures >= 1


async def test_a_session_taken_over_elsewhere_is_let_go(store: RedisStateStore) -> None:
    lost: list[str] = []
    writer = StoreWriter(
        store, owner="gw-1", lease_ms=LEASE_MS, grace_ms=GRACE_MS, max_events=64, on_lost=lost.append
    )
    writer.start()
    try:
        await _let_go(writer, store, lost)
    finally:
        await writer.close()


async def _let_go(writer: StoreWriter, store: RedisStateStore, lost: list[str]) -> None:
    session = Session(writer)
    session.emit(1)

    async def leased() -> bool:
        return await store.owner(session.id) == "gw-1"

    await settled(writer, leased)
    assert await store.take_lease(session.id, "gw-2", LEASE_MS * 10, unless_held=False)

    async def let_go() -> bool:
        return lost == [session.id]

    await settled(writer, let_go)
    session.emit(3)  # no longer mirrored from here: gw-2 writes it now
    await asyncio.sleep(0.1)
    assert (await store.replay(session.id, 0)).head == 1


async def test_a_session_handed_off_is_whole_in_the_store_and_free_to_take(
    writer: StoreWriter, store: RedisStateStore
) -> None:
    session = Session(writer)
    session.emit(7)
    assert await writer.hand_off(session.id)
    # Written whole before the lease went, with nothing waiting for a round.
    assert (await store.replay(session.id, 0)).entries == session.expected()
    assert await store.owner(session.id) is None
    assert await store.take_lease(session.id, "gw-2", LEASE_MS, unless_held=True)
    # No longer this gateway's: neither its events nor its end touch the copy.
    session.emit(2)
    writer.ended(session.id)
    await asyncio.sleep(0.1)
    assert (await store.replay(session.id, 0)).head == 7
    assert await store.load(session.id) is not None


async def test_a_writer_with_no_session_still_finds_the_store_down_and_back(
    writer: StoreWriter, redis_server: RedisServer
) -> None:
    """With nothing to write or renew, /readyz must still learn that the store stopped answering."""

    async def healthy_is(value: bool) -> bool:
        return writer.healthy is value

    redis_server.kill()
    await settled(writer, lambda: healthy_is(False))
    redis_server.start()
    await settled(writer, lambda: healthy_is(True), timeout=10)
