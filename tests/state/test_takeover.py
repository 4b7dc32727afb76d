"""Claiming a session from the store: the token, a live owner's lease, a dead one's, the journal's reach."""

from __future__ import annotations

import asyncio

import pytest

from duplex_gateway.state.records import AppendEvents, JournalEntry, SaveRecord, SessionRecord, token_digest
from duplex_gateway.state.redis_store import RedisStateStore
from duplex_gateway.state.takeover import Refusal, TakeoverRefused, claim
from tests.redis_server import RedisServer

TTL_MS = 60_000


@pytest.fixture
async def store(store: RedisStateStore) -> RedisStateStore:
    """The store holding one session, ``sess_a``, whose journal kept its latest 4 of 6 events."""
    await store.write(
        [
            SaveRecord(
                SessionRecord(
                    session_id="sess_a",
                    owner="gw-1",
                    token_digest=token_digest("token"),
                    dialect="realtime",
                    handshake="realtime",
                    config="{}",
                    grace_ms=30_000,
                    head=4,
                ),
                TTL_MS,
            ),
            AppendEvents(
                "sess_a",
                tuple(JournalEntry(seq, f"e{seq}") for seq in range(1, 7)),
                max_events=4,
                ttl_ms=TTL_MS,
            ),
        ]
    )
    return store


async def test_a_lapsed_lease_is_taken_and_the_missed_events_come_with_it(store: RedisStateStore) -> None:
    claimed = await claim(store, "sess_a", "token", 4, owner="gw-2", lease_ms=1_000, wait_ms=0)
    assert claimed.replay.entries == (JournalEntry(5, "e5"), JournalEntry(6, "e6"))
    assert claimed.head == 6  # the journal's head is newer than the record's
    assert await store.owner("sess_a") == "gw-2"


@pytest.mark.parametrize(("session_id", "token"), [("sess_a", "nope"), ("sess_b", "token")])
async def test_an_unknown_session_or_a_wrong_token_is_refused(
    store: RedisStateStore, session_id: str, token: str
) -> None:
    with pytest.raises(TakeoverRefused) as refused:
        await claim(store, session_id, token, 4, owner="gw-2", lease_ms=1_000, wait_ms=0)
    assert refused.value.refusal is Refusal.UNKNOWN
    assert await store.owner(session_id) is None


async def test_a_live_owner_keeps_its_session(store: RedisStateStore) -> None:
    await store.take_lease("sess_a", "gw-1", 5_000, unless_held=False)
    with pytest.raises(TakeoverRefused) as refused:
        await claim(store, "sess_a", "token", 4, owner="gw-2", lease_ms=1_000, wait_ms=300)
    assert refused.value.refusal is Refusal.HELD
    assert "gw-1" in refused.value.message
    assert await store.owner("sess_a") == "gw-1"


async def test_a_dead_owners_lease_is_waited_out(store: RedisStateStore) -> None:
    await store.take_lease("sess_a", "gw-1", 400, unless_held=False)  # and never renewed
    loop = asyncio.get_running_loop()
    began = loop.time()
    claimed = await claim(store, "sess_a", "token", 4, owner="gw-2", lease_ms=1_000, wait_ms=2_000)
    assert 0.3 <= loop.time() - began < 2.0
    assert claimed.record.session_id == "sess_a"


async def test_a_journal_that_no_longer_reaches_back_is_a_gap(store: RedisStateStore) -> None:
    with pytest.raises(TakeoverRefused) as refused:
        await claim(store, "sess_a", "token", 1, owner="gw-2", lease_ms=1_000, wait_ms=0)
    assert refused.value.refusal is Refusal.GAP


async def test_a_store_that_is_down_is_said_to_be(store: RedisStateStore, redis_server: RedisServer) -> None:
    redis_server.kill()
    with pytest.raises(TakeoverRefused) as refused:
        await claim(store, "sess_a", "token", 4, owner="gw-2", lease_ms=1_000, wait_ms=0)
    assert refused.value.refusal is Refusal.UNAVAILABLE
