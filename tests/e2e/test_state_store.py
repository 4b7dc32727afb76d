"""A gateway with ``server.state_store``: its resumable sessions copied into a real Redis as they go.

The copy is what another gateway resumes a session from: every numbered event exactly as
the client got it, the current resume token (as a digest), the configuration the client
was last told, and this gateway's lease. A store that goes down costs the copy, never a
session: the gateway answers turns throughout, says so on ``/readyz`` and ``/metrics``,
and rewrites each session whole once the store is back.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from duplex_gateway.state.records import JournalEntry, token_matches
from duplex_gateway.state.redis_store import RedisStateStore
from tests.e2e.helpers import Gateway, GatewayFactory, speech_turn, stream_audio, ws_connect
from tests.redis_server import RedisServer, redis_server_at

pytestmark = pytest.mark.e2e

GRACE_S = 2.0


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server_at(tmp_path_factory.mktemp("redis")) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory, redis_server: RedisServer) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {
                "web_demo": False,
                "node_id": "gw-a",
                "state_store": redis_server.url,
                "state_store_timeout_s": 0.5,
                "state_lease_s": 2.0,
            },
            "engine": {"name": "echo", "echo": {"pace": 4.0}},
            # Turns end by the client's commit only, so each response.create is the one reply asked for.
            "session": {"turn_detection": "none"},
            "limits": {"resume_grace_s": GRACE_S, "max_sessions": 8},
        },
        name="state-store",
    )


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore(redis_server.url, timeout_s=1.0)
    yield store
    await store.close()


class Client:
    """A Realtime client that keeps every frame it got, as it got it."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.frames: list[str] = []
        self.events: list[dict[str, Any]] = []

    async def until(self, kind: str, timeout: float = 15.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                frame = await self.ws.recv()
                self.frames.append(frame)
                event = json.loads(frame)
                self.events.append(event)
                if event["type"] == kind:
                    return event

    def journal(self) -> tuple[JournalEntry, ...]:
        """The numbered events, as the gateway's journal (and so its copy) holds them."""
        return tuple(
            JournalEntry(event["server_event_seq"], frame)
            for frame, event in zip(self.frames, self.events, strict=True)
            if "server_event_seq" in event
        )


async def eventually(check: Any, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.05)


def metric(gateway: Gateway, name: str) -> float | None:
    with urllib.request.urlopen(gateway.base_url + "/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return None


async def resume(ws: Any, session_id: str, token: str, last_seq: int) -> None:
    await ws.send(
        json.dumps(
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": last_seq,
            }
        )
    )


async def a_new_session(gateway: Gateway) -> None:
    """A session opened on ``gateway`` and one turn of it answered."""
    async with ws_connect(gateway, "/v1/realtime") as ws:
        client = Client(ws)
        await client.until("session.created")
        await a_turn(client)


async def a_turn(client: Client) -> None:
    await stream_audio(client.ws, speech_turn(24_000), realtime=False)
    await client.ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
    await client.ws.send(json.dumps({"type": "response.create"}))
    done = await client.until("response.done")
    assert done["response"]["status"] == "completed"
    await client.until("rate_limits.updated")  # the last event of a reply


async def test_a_session_is_in_the_store_as_it_goes_and_leaves_it_when_it_ends(
    gateway: Gateway, store: RedisStateStore
) -> None:
    assert gateway.readyz()["state_store"]["status"] == "ok"
    assert metric(gateway, "duplex_gateway_state_store_up") == 1.0
    async with ws_connect(gateway, "/v1/realtime") as ws:
        client = Client(ws)
        created = await client.until("session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        updated = await client.until("session.updated")
        session_id, token = created["session_id"], created["resume_token"]
        await a_turn(client)

        async def copied() -> bool:
            return (await store.replay(session_id, 0)).entries == client.journal()

        await eventually(copied)
        record = await store.load(session_id)
        assert record is not None
        assert token_matches(record, token)
        assert (record.owner, record.dialect, record.handshake) == ("gw-a", "realtime", "realtime")
        assert json.loads(record.config)["session"]["instructions"] == updated["session"]["instructions"]
        assert await store.owner(session_id) == "gw-a"
        # Acknowledged events leave the copy as they leave the journal.
        last = client.journal()[-1].seq
        await ws.send(json.dumps({"type": "session.event_ack", "server_event_seq": last - 2}))

        async def trimmed() -> bool:
            replay = await store.replay(session_id, 0)
            return replay.first_kept == last - 1 and replay.head == last

        await eventually(trimmed)
    # The client left without coming back: once its grace is over, so is the copy.

    async def forgotten() -> bool:
        return await store.load(session_id) is None and await store.owner(session_id) is None

    await eventually(forgotten, timeout=GRACE_S + 5)


async def test_the_gateway_serves_through_a_store_outage_and_heals_the_copy(
    gateway: Gateway, store: RedisStateStore, redis_server: RedisServer
) -> None:
    async with ws_connect(gateway, "/v1/realtime") as ws:
        client = Client(ws)
        created = await client.until("session.created")
        session_id = created["session_id"]
        redis_server.kill()
        try:
            await a_turn(client)  # answered while the store is down

            async def reported() -> bool:
                body = await asyncio.to_thread(gateway.readyz)  # still ready: 200
                return bool(body["state_store"]["status"] == "unavailable")

            await eventually(reported)
            assert metric(gateway, "duplex_gateway_state_store_up") == 0.0
            await a_new_session(gateway)  # admitted and answered meanwhile
        finally:
            redis_server.start()
        await a_turn(client)

        async def healed() -> bool:
            return (await store.replay(session_id, 0)).entries == client.journal()

        await eventually(healed, timeout=10)
        assert gateway.readyz()["state_store"]["status"] == "ok"
        assert metric(gateway, "duplex_gateway_state_store_up") == 1.0
        assert await store.owner(session_id) == "gw-a"


def fleet_gateway(factory: GatewayFactory, redis_server: RedisServer, node: str) -> Gateway:
    return factory.start(
        {
            "server": {
                "web_demo": False,
                "node_id": node,
                "state_store": redis_server.url,
                "state_store_timeout_s": 0.5,
                "state_lease_s": 1.0,
            },
            "engine": {"name": "echo", "echo": {"pace": 4.0}},
            # Turns end by the client's commit only, so each response.create is the one reply asked for.
            "session": {"turn_detection": "none"},
            "limits": {"resume_grace_s": 30, "max_sessions": 8},
        },
        name=node,
    )


def kill(gateway: Gateway) -> None:
    """SIGKILL: no drain, no goodbye, nothing written at exit."""
    gateway.proc.kill()
    gateway.proc.wait(10)
    gateway.stopped = True


async def test_a_session_resumes_on_another_gateway_after_its_own_is_killed(
    gateway_factory: GatewayFactory, redis_server: RedisServer, store: RedisStateStore
) -> None:
    first = fleet_gateway(gateway_factory, redis_server, "gw-1")
    second = fleet_gateway(gateway_factory, redis_server, "gw-2")
    async with ws_connect(first) as ws:
        before = Client(ws)
        created = await before.until("session.created")
        session_id, token = created["session_id"], created["resume_token"]
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        await before.until("session.updated")
        await a_turn(before)
        journal = before.journal()

        async def copied() -> bool:
            return (await store.replay(session_id, 0)).entries == journal

        await eventually(copied)
        kill(first)
    # The client lost the last three events on the way.
    missed_from = journal[-3].seq
    async with ws_connect(second, "/v1/realtime?resume=1") as ws:
        after = Client(ws)
        await resume(ws, session_id, token, missed_from - 1)
        resumed = await after.until("session.resumed", timeout=10)
        assert resumed["session_id"] == session_id
        assert resumed["resume_token"] and resumed["resume_token"] != token
        await a_turn(after)
        numbered = after.journal()
        # What it missed, exactly as the first gateway sent it, then the session going on.
        assert numbered[:3] == journal[-3:]
        assert [entry.seq for entry in numbered] == list(range(missed_from, missed_from + len(numbered)))
        assert [e["type"] for e in after.events if e["type"] == "error"] == []
        # The configuration came along.
        await ws.send(json.dumps({"type": "session.update", "session": {"output_modalities": ["audio"]}}))
        updated = await after.until("session.updated")
        assert updated["session"]["instructions"] == "Be brief."
        assert await store.owner(session_id) == "gw-2"
        # The copy follows the session a round of the writer behind: the new token gets there too.

        async def token_copied() -> bool:
            record = await store.load(session_id)
            return record is not None and token_matches(record, resumed["resume_token"])

        await eventually(token_copied)


async def test_after_a_store_outage_a_session_resumes_on_another_gateway_again(
    gateway_factory: GatewayFactory, redis_server: RedisServer, store: RedisStateStore
) -> None:
    """Redis killed and started again under a live session: new sessions work throughout, and once
    the copy is healed the session still moves to another gateway when its own dies."""
    first = fleet_gateway(gateway_factory, redis_server, "gw-1")
    second = fleet_gateway(gateway_factory, redis_server, "gw-2")
    async with ws_connect(first) as ws:
        before = Client(ws)
        created = await before.until("session.created")
        session_id, token = created["session_id"], created["resume_token"]
        await a_turn(before)
        redis_server.kill()
        try:
            await a_turn(before)
            await a_new_session(second)  # admitted and answered without the store
        finally:
            redis_server.start()
        await a_turn(before)
        journal = before.journal()

        async def healed() -> bool:
            return (await store.replay(session_id, 0)).entries == journal

        await eventually(healed, timeout=10)
        kill(first)
    async with ws_connect(second, "/v1/realtime?resume=1") as ws:
        after = Client(ws)
        await resume(ws, session_id, token, journal[-1].seq)
        await after.until("session.resumed", timeout=10)
        await a_turn(after)
        assert after.journal()[0].seq == journal[-1].seq + 1
        assert not [e for e in after.events if e["type"] == "error"]


async def test_a_spent_token_resumes_nothing_even_while_the_copy_still_has_it(gateway: Gateway) -> None:
    """Tokens are single-use on a gateway with a store too: right after a resume the store's copy may
    still hold the spent token, and the gateway must not make a second session from it."""
    async with ws_connect(gateway) as ws:
        first = Client(ws)
        created = await first.until("session.created")
        session_id, spent = created["session_id"], created["resume_token"]
        ws.transport.abort()  # dropped, as a network drops it
    async with ws_connect(gateway, "/v1/realtime?resume=1") as ws:
        resumed_client = Client(ws)
        await resume(ws, session_id, spent, created["server_event_seq"])
        await resumed_client.until("session.resumed")
        # At once, before the writer's next round: the spent token again.
        async with ws_connect(gateway, "/v1/realtime?resume=1") as again:
            refused = Client(again)
            await resume(again, session_id, spent, created["server_event_seq"])
            error = await refused.until("error")
            assert error["error"]["code"] == "invalid_resume_token"
        # The session is still the first client's, on its new token.
        await a_turn(resumed_client)
