"""vLLM-Omni's ``DuplexClient`` at its defaults, through HAProxy, when the gateway holding its session dies.

Two gateways share a real Redis (``server.state_store``) behind the shipped HAProxy config.
After the first turn the gateway serving the session is killed (SIGKILL: no drain, nothing
written at exit). The client reconnects by itself, to the very URL it was given; the
balancer sends it to the surviving gateway, which takes the session over from the store.
The second turn is answered in the same session, with no ``error``, no
``session.resync_required`` and no gap in ``server_event_seq``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm_omni", reason="DuplexClient runs in .venv-omni (make test runs it there)")

from duplex_gateway.host.resumption import node_of
from duplex_gateway.state.redis_store import RedisStateStore
from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_scaling import Balancer, start_haproxy
from tests.omni.test_duplex_client_defaults import default_client
from tests.redis_server import RedisServer, redis_server_at

pytestmark = pytest.mark.e2e


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    with redis_server_at(tmp_path) as server:
        yield server


def fleet_gateway(factory: GatewayFactory, redis_server: RedisServer, node: str) -> Gateway:
    return factory.start(
        {
            "server": {"web_demo": False, "node_id": node, "state_store": redis_server.url},
            "engine": {"name": "echo", "echo": {"pace": 4.0}},
            "limits": {"resume_grace_s": 30},
        },
        name=node,
    )


@pytest.fixture
def gateways(gateway_factory: GatewayFactory, redis_server: RedisServer) -> dict[str, Gateway]:
    return {node: fleet_gateway(gateway_factory, redis_server, node) for node in ("gw1", "gw2")}


@pytest.fixture
def haproxy(tmp_path: Path, gateways: dict[str, Gateway]) -> Iterator[Balancer]:
    balancer = start_haproxy(tmp_path, gateways)
    yield balancer
    balancer.stop()


@pytest.fixture
async def store(redis_server: RedisServer) -> AsyncIterator[RedisStateStore]:
    store = RedisStateStore(redis_server.url)
    yield store
    await store.close()


async def test_duplex_client_resumes_on_the_other_gateway_when_its_own_is_killed(
    haproxy: Balancer, gateways: dict[str, Gateway], store: RedisStateStore
) -> None:
    async with default_client(haproxy.ws_url) as session:
        first = await session.turn()
        session_id = session.client.session_id
        assert session_id is not None
        holder = node_of(session_id)
        assert holder in gateways
        last_seq = max(e["server_event_seq"] for e in session.events if "server_event_seq" in e)

        async def copied() -> bool:
            return (await store.replay(session_id, 0)).head >= last_seq

        async with asyncio.timeout(5):
            while not await copied():
                await asyncio.sleep(0.05)
        dead = gateways[holder]
        dead.proc.kill()
        dead.proc.wait(10)
        dead.stopped = True

        await session.resumed(1)
        second = await session.turn()
        assert second.response_id != first.response_id
        assert session.client.session_id == session_id
        assert not session.errors(), session.errors()
        assert not [e for e in session.events if e.get("type") == "session.resync_required"]
        seqs = [e["server_event_seq"] for e in session.events if "server_event_seq" in e]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        (survivor,) = set(gateways) - {holder}
        assert await store.owner(session_id) == survivor
        await session.client.close()


#: Sessions held through a rolling restart of both gateways.
SESSIONS = 50


async def test_a_rolling_restart_of_both_gateways_loses_no_session(
    haproxy: Balancer,
    gateways: dict[str, Gateway],
    gateway_factory: GatewayFactory,
    redis_server: RedisServer,
    store: RedisStateStore,
) -> None:
    """Each gateway in turn is taken out of the balancer and stopped (SIGTERM): its sessions move to the other."""
    async with contextlib.AsyncExitStack() as stack:
        sessions = [await stack.enter_async_context(default_client(haproxy.ws_url)) for _ in range(SESSIONS)]
        await asyncio.gather(*(session.turn() for session in sessions))
        ids = [session.client.session_id for session in sessions]
        resumes = dict.fromkeys(ids, 0)
        for node in ("gw1", "gw2"):
            owners = [await store.owner(str(session_id)) for session_id in ids]
            moving = [session for session, owner in zip(sessions, owners, strict=True) if owner == node]
            assert haproxy.command(f"set server gateways/{node} state drain").strip() == ""
            assert await asyncio.to_thread(gateways[node].stop) == 0
            for session in moving:
                resumes[session.client.session_id] += 1
                await session.resumed(resumes[session.client.session_id])
            # Every session answers a turn, on the gateway left.
            await asyncio.gather(*(session.turn() for session in sessions))
            # The gateway comes back (a new process: a new port) and takes callers again.
            back = fleet_gateway(gateway_factory, redis_server, node)
            gateways[node] = back
            haproxy.command(f"set server gateways/{node} addr 127.0.0.1 port {back.port}")
            assert haproxy.command(f"set server gateways/{node} state ready").strip() == ""
        assert [session.client.session_id for session in sessions] == ids
        for session in sessions:
            assert not session.errors(), session.errors()
            assert not [e for e in session.events if e.get("type") == "session.resync_required"]
            seqs = [e["server_event_seq"] for e in session.events if "server_event_seq" in e]
            assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        assert sum(resumes.values()) >= SESSIONS  # each moved at least once (those on gw1 twice)
