"""Session resume: a client whose connection drops mid-reply picks its session up again."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    audio_of,
    send_json,
    speech_turn,
    stream_audio,
    wait_closed,
    ws_connect,
)

pytestmark = pytest.mark.e2e

GRACE_S = 2.0


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0}},
            "limits": {"resume_grace_s": GRACE_S, "max_sessions": 8},
        },
        name="resume",
    )


def drop(ws: Any) -> None:
    """Lose the connection the way a network does: no close frame."""
    ws.transport.abort()


async def test_dropped_client_resumes_and_gets_every_event_it_missed(gateway: Gateway) -> None:
    async with ws_connect(gateway) as first:
        log = EventLog(first.recv)
        _, created = await log.wait_for("session.created")
        session_id, token = created["session_id"], created["resume_token"]
        assert token and created["session"]["id"] == session_id
        await stream_audio(first, speech_turn(24_000), realtime=True)
        i_delta, delta = await log.wait_for("response.output_audio.delta", timeout=15)
        response_id = delta["response_id"]
        # Drop mid-reply, with some of its audio heard: after its second delta.
        await log.wait_for(
            lambda e: e["type"] == "response.output_audio.delta" and e["response_id"] == response_id,
            timeout=5,
            start=i_delta + 1,
        )
        last_seq = log.events[-1]["server_event_seq"]
        before = audio_of(log.events, response_id)
        drop(first)
        await log.aclose()
    # Deliberately let time pass: the reply goes on while nobody listens, and the session is kept.
    await asyncio.sleep(0.5)
    assert gateway.readyz()["sessions"] == 1  # the session is kept for its client

    async with ws_connect(gateway, "/v1/realtime?resume=1") as second:
        log2 = EventLog(second.recv)
        await send_json(
            second,
            {
                "type": "session.resume",
                "session_id": session_id,
                "resume_token": token,
                "last_received_server_event_seq": last_seq,
            },
        )
        _, resumed = await log2.wait_for("session.resumed")
        assert resumed["session_id"] == session_id and resumed["resume_token"] not in (None, token)
        _, done = await log2.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id, timeout=15
        )
        assert done["response"]["status"] == "completed"
        replayed = [e for e in log2.events if e["type"] != "session.resumed"]
        seqs = [e["server_event_seq"] for e in replayed]
        assert seqs[0] == last_seq + 1 and seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        # Together the two connections heard the whole reply, once.
        total_ms = (len(before) + len(audio_of(replayed, response_id))) / 2 / 24
        assert abs(total_ms - done["response"]["audio_ms"]) < 5
        # The resumed session is fully alive.
        await send_json(second, {"type": "session.heartbeat"})
        await log2.wait_for("session.heartbeat_ack")
        await send_json(second, {"type": "session.close"})
        assert await wait_closed(second) == 1000
        await log2.aclose()
    await gateway.wait_sessions(0)


async def test_wrong_token_is_refused_and_the_connection_can_start_fresh(gateway: Gateway) -> None:
    async with ws_connect(gateway) as first:
        created = json.loads(await asyncio.wait_for(first.recv(), 5))
        drop(first)
    async with ws_connect(gateway, "/v1/duplex") as second:
        log = EventLog(second.recv)
        await send_json(
            second,
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": "forged",
                "event_id": "r1",
            },
        )
        _, error = await log.wait_for("error")
        assert error["error"]["code"] == "invalid_resume_token" and error["error"]["event_id"] == "r1"
        await send_json(second, {"type": "session.update", "session": {"type": "realtime"}})
        _, fresh = await log.wait_for("session.created")
        assert fresh["session_id"] != created["session_id"]
        await log.aclose()


async def test_resume_later_in_a_session_is_an_error(gateway: Gateway) -> None:
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await send_json(ws, {"type": "session.resume", "session_id": "x", "resume_token": "y"})
        _, error = await log.wait_for("error")
        assert error["error"]["code"] == "invalid_event"
        await log.aclose()


async def test_unclaimed_session_ends_after_the_grace_period(gateway: Gateway) -> None:
    await gateway.wait_sessions(0, timeout=GRACE_S + 5)
    async with ws_connect(gateway) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), 5))
        drop(ws)
    # Deliberately let time pass: the dropped session is still held, well inside its grace period.
    await asyncio.sleep(0.3)
    assert gateway.readyz()["sessions"] == 1
    await gateway.wait_sessions(0, timeout=GRACE_S + 3)
    # Its credentials are void now.
    async with ws_connect(gateway, "/v1/realtime?resume=1") as late:
        await send_json(
            late,
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
            },
        )
        error = json.loads(await asyncio.wait_for(late.recv(), 5))
        assert error["type"] == "error" and error["error"]["code"] == "invalid_resume_token"


async def test_a_clean_close_is_not_kept_for_resume(gateway: Gateway) -> None:
    await gateway.wait_sessions(0, timeout=GRACE_S + 5)
    async with ws_connect(gateway) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), 5))
    # Well before the grace period would end a parked session, the slot is free ...
    await gateway.wait_sessions(0, timeout=GRACE_S / 2)
    # ... and the credentials name nothing.
    async with ws_connect(gateway, "/v1/realtime?resume=1") as late:
        await send_json(
            late,
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": created["server_event_seq"],
            },
        )
        error = json.loads(await asyncio.wait_for(late.recv(), 5))
        assert error["type"] == "error" and error["error"]["code"] == "invalid_resume_token", error


async def test_resume_after_events_no_longer_held_is_resync_required_on_the_wire(
    gateway_factory: GatewayFactory,
) -> None:
    """The journal keeps the last few events; asking for older ones is vLLM-Omni's
    ``session.resync_required``, and the connection stays open for a fresh session."""
    gw = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "limits": {"resume_grace_s": 30, "resume_journal_events": 16},
        },
        name="gap",
    )
    async with ws_connect(gw) as first:
        log = EventLog(first.recv)
        try:
            _, created = await log.wait_for("session.created")
            # More events after session.created than the journal holds (its smallest size: 16).
            index = 0
            for i in range(20):
                await send_json(first, {"type": "session.heartbeat", "event_id": f"hb{i}"})
                index, _ = await log.wait_for("session.heartbeat_ack", 5, start=index + 1)
            drop(first)
        finally:
            await log.aclose()
    await gw.wait_sessions(1)  # parked
    async with ws_connect(gw, "/v1/realtime?resume=1") as second:
        log = EventLog(second.recv)
        try:
            await send_json(
                second,
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": created["server_event_seq"],
                    "event_id": "resume1",
                },
            )
            _, resync = await log.wait_for("session.resync_required", 5)
            assert resync["session_id"] == created["session_id"] and resync["reason"] == "journal_gap", resync
            assert "server_event_seq" not in resync, resync
            # The connection stays open for a fresh session.
            await send_json(second, {"type": "session.update", "session": {"type": "realtime"}})
            _, fresh = await log.wait_for("session.created", 5)
            assert fresh["session_id"] != created["session_id"]
            assert log.types() == ["session.resync_required", "session.created"], log.types()
            await send_json(second, {"type": "session.close"})
            assert await wait_closed(second) == 1000
        finally:
            await log.aclose()


async def test_a_full_gateway_lets_its_dropped_client_back_in(gateway_factory: GatewayFactory) -> None:
    """At ``max_sessions`` a resume is admitted: it takes over the parked session's own slot."""
    gw = gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo"},
            "limits": {"resume_grace_s": 30, "max_sessions": 1},
        },
        name="full",
    )
    async with ws_connect(gw) as first:
        created = json.loads(await asyncio.wait_for(first.recv(), 5))
        drop(first)
    await gw.wait_sessions(1)  # parked, holding the only slot
    async with ws_connect(gw, "/v1/realtime?resume=1") as second:
        log = EventLog(second.recv)
        try:
            await send_json(
                second,
                {
                    "type": "session.resume",
                    "session_id": created["session_id"],
                    "resume_token": created["resume_token"],
                    "last_received_server_event_seq": created["server_event_seq"],
                },
            )
            _, resumed = await log.wait_for("session.resumed")
            assert resumed["session_id"] == created["session_id"]
            assert gw.readyz()["sessions"] == 1
            # A new caller still finds the gateway full.
            async with ws_connect(gw) as third:
                refused = json.loads(await asyncio.wait_for(third.recv(), 5))
                assert refused["type"] == "error" and refused["error"]["code"] == "session_limit", refused
                assert await wait_closed(third) == 1013
            # The resumed session is fully alive.
            await send_json(second, {"type": "session.heartbeat"})
            await log.wait_for("session.heartbeat_ack")
            assert not [e for e in log.events if e["type"] == "error"], log.events
            await send_json(second, {"type": "session.close"})
            assert await wait_closed(second) == 1000
        finally:
            await log.aclose()
    await gw.wait_sessions(0)
