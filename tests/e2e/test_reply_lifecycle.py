"""The reply lifecycle and the conversation's items, over the wire of a real gateway.

A raw ``websockets`` client drives the ``echo`` engine (replies paced in real
time), so a reply is long enough to act on at any instant of its life: before
the engine has started it, while it streams, and after it has played.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    done_of,
    is_delta_of,
    load_speech,
    send_json,
    silence,
    stream_audio,
    ws_connect,
)

pytestmark = pytest.mark.e2e

FRAME_100MS = 24000 * 2 // 10


@pytest.fixture(scope="module")
def gw(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 100}}}
    )


@pytest.fixture(scope="module")
def slow_gw(module_gateway_factory: GatewayFactory) -> Gateway:
    """Replies start 1.5 s after they are asked for, as a real model's would."""
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 100, "start_delay_ms": 1500}},
        },
        name="slow",
    )


@asynccontextmanager
async def realtime_session(gw: Gateway, session: dict[str, Any]) -> AsyncIterator[tuple[Any, EventLog]]:
    async with ws_connect(gw) as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 5)
            await send_json(ws, {"type": "session.update", "session": {"type": "realtime", **session}})
            await log.wait_for("session.updated", 5)
            yield ws, log
        finally:
            await log.aclose()


MANUAL_TURNS = {"audio": {"input": {"turn_detection": None}}}


async def append_speech(ws: Any, seconds: float) -> None:
    speech = load_speech()[: int(24000 * seconds) * 2]
    for offset in range(0, len(speech), FRAME_100MS):
        await send_json(
            ws, {"type": "input_audio_buffer.append", "audio": b64(speech[offset : offset + FRAME_100MS])}
        )


def errors(log: EventLog, start: int = 0) -> list[dict[str, Any]]:
    return [e["error"] for e in log.events[start:] if e["type"] == "error"]


def reply_events(log: EventLog, response_id: str, start: int = 0) -> list[str]:
    return [e["type"] for e in log.events[start:] if e.get("response_id") == response_id]


async def answer_next_turn(ws: Any, log: EventLog) -> None:
    """Commit one more second of speech with a reply asked for; wait until that reply is done.

    On the slow gateway a reply starts 1.5 s after it is asked for and plays in real time:
    when this returns, a reply requested before it would have been talking for over a second.
    """
    await append_speech(ws, 1.0)
    start = len(log.events)
    await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
    _, created = await log.wait_for("response.created", 5, start=start)
    response_id = created["response"]["id"]
    await log.wait_for(is_delta_of(response_id), 5, start=start)
    _, done = await log.wait_for(done_of(response_id), 10, start=start)
    assert done["response"]["status"] == "completed", done


async def test_a_reply_cancelled_before_the_engine_starts_it_is_cancelled(slow_gw: Gateway) -> None:
    """Cancel sent right behind the commit that asks for the reply, before the engine announces it."""
    async with realtime_session(slow_gw, MANUAL_TURNS) as (ws, log):
        await append_speech(ws, 2.0)
        await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
        await send_json(ws, {"type": "response.cancel", "event_id": "cancel_now"})
        _, created = await log.wait_for("response.created", 5)
        response_id = created["response"]["id"]
        _, done = await log.wait_for(done_of(response_id), 5)
        assert done["response"]["status"] == "cancelled"
        # The session goes on: the next reply is answered ...
        await answer_next_turn(ws, log)
        # ... by when the cancelled one, had the engine gone on with it, would have been talking.
        assert not [t for t in reply_events(log, response_id) if "delta" in t]
        assert not errors(log), errors(log)


async def test_caller_speech_interrupts_a_reply_the_engine_has_not_started(slow_gw: Gateway) -> None:
    """A server-VAD turn ends, the engine is still preparing the reply, the caller speaks again."""
    session = {"audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 300}}}}
    async with realtime_session(slow_gw, session) as (ws, log):
        speech = load_speech()[: 24000 * 2 * 2]
        # Speech, a pause just long enough to end the turn, then speech again at once.
        await stream_audio(ws, silence(300) + speech + silence(450) + speech + silence(800), realtime=True)
        _, created = await log.wait_for("response.created", 10)
        first = created["response"]["id"]
        _, done = await log.wait_for(done_of(first), 10)
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        # Only one reply at a time was asked for: none was closed as "superseded".
        created_ids = [e["response"]["id"] for e in log.events if e["type"] == "response.created"]
        done_ids = [e["response"]["id"] for e in log.events if e["type"] == "response.done"]
        assert set(done_ids) <= set(created_ids)
        assert not [t for t in reply_events(log, first) if "delta" in t]
        assert not errors(log), errors(log)


async def test_output_audio_buffer_clear_reaches_a_reply_just_requested(slow_gw: Gateway) -> None:
    async with realtime_session(slow_gw, MANUAL_TURNS) as (ws, log):
        await append_speech(ws, 2.0)
        await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
        await send_json(ws, {"type": "output_audio_buffer.clear"})
        _, created = await log.wait_for("response.created", 5)
        response_id = created["response"]["id"]
        _, done = await log.wait_for(done_of(response_id), 5)
        assert done["response"]["status"] == "cancelled"
        _, cleared = await log.wait_for("output_audio_buffer.cleared", 5)
        assert cleared["response_id"] == response_id
        await answer_next_turn(ws, log)
        assert not [t for t in reply_events(log, response_id) if "delta" in t]
        assert not errors(log), errors(log)


async def test_deleting_the_assistant_item_mid_reply_cancels_it_and_the_session_lives(gw: Gateway) -> None:
    async with realtime_session(gw, MANUAL_TURNS) as (ws, log):
        await append_speech(ws, 2.5)
        await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
        _, added = await log.wait_for("response.output_item.added", 5)
        response_id, item_id = added["response_id"], added["item"]["id"]
        await log.wait_for(is_delta_of(response_id), 5)
        start = len(log.events)
        await send_json(ws, {"type": "conversation.item.delete", "item_id": item_id})
        done_index, done = await log.wait_for(done_of(response_id), 5, start=start)
        assert done["response"]["status"] == "cancelled"
        _, deleted = await log.wait_for("conversation.item.deleted", 5, start=start)
        assert deleted["item_id"] == item_id
        # Deliberately let time pass: the 2.5 s echo would still be talking, in 100 ms chunks.
        await asyncio.sleep(0.5)
        late = [e["type"] for e in log.events[done_index + 1 :] if e.get("response_id") == response_id]
        assert not [t for t in late if "delta" in t], late
        assert not errors(log), errors(log)
        # Still alive and answering.
        start = len(log.events)
        await send_json(ws, {"type": "session.heartbeat"})
        await log.wait_for("session.heartbeat_ack", 5, start=start)


async def test_items_are_placed_by_previous_item_id(gw: Gateway) -> None:
    async with realtime_session(gw, MANUAL_TURNS) as (ws, log):

        async def create(item_id: str, previous: str | None = None, event_id: str | None = None) -> None:
            event: dict[str, Any] = {
                "type": "conversation.item.create",
                "item": {
                    "id": item_id,
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": item_id}],
                },
            }
            if previous is not None:
                event["previous_item_id"] = previous
            if event_id is not None:
                event["event_id"] = event_id
            await send_json(ws, event)

        await create("item_a")
        await create("item_c")
        await create("item_b", "item_a")
        await create("item_0", "root")
        await create("item_x", "item_missing", event_id="evt_x")
        _, error = await log.wait_for("error", 5)
        assert error["error"]["code"] == "item_not_found" and error["error"]["event_id"] == "evt_x"
        added = {
            e["item"]["id"]: e["previous_item_id"]
            for e in log.events
            if e["type"] == "conversation.item.added"
        }
        assert added == {"item_a": None, "item_c": "item_a", "item_b": "item_a", "item_0": None}


async def test_truncation_past_the_audio_is_clamped_and_the_transcript_follows_what_was_heard(
    gw: Gateway,
) -> None:
    async with realtime_session(gw, MANUAL_TURNS) as (ws, log):
        await append_speech(ws, 1.0)
        await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
        _, added = await log.wait_for("response.output_item.added", 5)
        response_id, item_id = added["response_id"], added["item"]["id"]
        _, done = await log.wait_for(done_of(response_id), 10)
        assert done["response"]["status"] == "completed"
        start = len(log.events)
        await send_json(
            ws,
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": 60_000,
            },
        )
        _, truncated = await log.wait_for("conversation.item.truncated", 5, start=start)
        assert 900 <= truncated["audio_end_ms"] <= 1100, truncated  # all of the ~1 s echo, not 60 s
        # Truncated to nothing heard: the item keeps no words of the reply.
        await send_json(
            ws,
            {"type": "conversation.item.truncate", "item_id": item_id, "content_index": 0, "audio_end_ms": 0},
        )
        await log.wait_for("conversation.item.truncated", 5, start=start + 1)
        await send_json(ws, {"type": "conversation.item.retrieve", "item_id": item_id})
        _, retrieved = await log.wait_for("conversation.item.retrieved", 5, start=start)
        assert retrieved["item"]["content"][0].get("transcript", "") == ""
        assert not errors(log), errors(log)


async def test_idle_timeout_ms_prompts_a_silent_caller_after_the_reply_has_played(gw: Gateway) -> None:
    session = {
        "audio": {
            "input": {
                "turn_detection": {
                    "type": "server_vad",
                    "silence_duration_ms": 300,
                    "idle_timeout_ms": 1000,
                }
            }
        }
    }
    async with realtime_session(gw, session) as (ws, log):
        turn = silence(300) + load_speech()[: 24000 * 2 * 2] + silence(600)
        await stream_audio(ws, turn, realtime=True)
        _, created = await log.wait_for("response.created", 10)
        first = created["response"]["id"]
        done_index, done = await log.wait_for(done_of(first), 10)
        assert done["response"]["status"] == "completed"
        # The caller now says nothing (no audio at all, as a muted phone line might):
        # once the reply has played and a second has passed, the gateway takes the turn.
        index, triggered = await log.wait_for("input_audio_buffer.timeout_triggered", 8, start=done_index)
        _, committed = await log.wait_for("input_audio_buffer.committed", 5, start=index)
        assert committed["item_id"] == triggered["item_id"]
        _, created = await log.wait_for("response.created", 5, start=index)
        assert created["response"]["id"] != first
        assert not errors(log), errors(log)
