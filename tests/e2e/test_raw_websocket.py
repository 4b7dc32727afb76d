"""A raw ``websockets`` client against a real gateway: duplex extensions, bad input, limits, auth.

Every bad-input case asserts the ``error`` event's ``code`` (and the echoed
``event_id``) and then that the same session still answers. The conftest fails a
test if the gateway logged a traceback while it ran.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus

from duplex_gateway.vocabulary.errors import OPENAI_MESSAGES, ErrorCode
from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    audio_of,
    b64,
    done_of,
    duration_ms,
    is_delta_of,
    load_speech,
    send_json,
    silence,
    stream_audio,
    wait_closed,
    ws_connect,
)
from tests.sdk_models import validate_server_event

pytestmark = pytest.mark.e2e

MAX_MESSAGE = 64 * 1024
HARD_MAX_MESSAGE = 256 * 1024
FRAME_100MS = 24000 * 2 // 10  # pcm16 24 kHz
NO_TURN_DETECTION = {"type": "realtime", "audio": {"input": {"turn_detection": None}}}
DUPLEX_SESSION = {
    "type": "realtime",
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}},
}


def _config(**limits: Any) -> dict[str, Any]:
    return {
        "server": {"web_demo": False},
        "limits": {
            "max_sessions": 16,
            "max_message_bytes": MAX_MESSAGE,
            "hard_max_message_bytes": HARD_MAX_MESSAGE,
            **limits,
        },
        "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 100}},
    }


@pytest.fixture(scope="module")
def main_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(_config(), name="raw")


@pytest.fixture
async def gw(main_gateway: Gateway) -> AsyncIterator[Gateway]:
    yield main_gateway
    # Every close path releases the session: nothing is left once the test's clients are gone.
    await main_gateway.wait_sessions(0, timeout=5)


# ---------------------------------------------------------------------------------------
# helpers


@asynccontextmanager
async def realtime_session(
    gw: Gateway, *, manual: bool = False, path: str = "/v1/realtime", **connect: Any
) -> AsyncIterator[tuple[Any, EventLog]]:
    """A ``/v1/realtime`` session (``session.created`` seen); ``manual``: turn detection off."""
    async with ws_connect(gw, path, **connect) as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 5)
            if manual:
                await send_json(ws, {"type": "session.update", "session": NO_TURN_DETECTION})
                await log.wait_for("session.updated", 5)
            yield ws, log
        finally:
            await log.aclose()


@asynccontextmanager
async def duplex_session(gw: Gateway) -> AsyncIterator[tuple[Any, EventLog]]:
    """A configured ``/v1/duplex`` session with turn detection off."""
    async with ws_connect(gw, "/v1/duplex") as ws:
        log = EventLog(ws.recv)
        try:
            await send_json(ws, {"type": "session.update", "session": DUPLEX_SESSION})
            await log.wait_for("session.created", 5)
            yield ws, log
        finally:
            await log.aclose()


async def append_speech(ws: Any, seconds: float) -> bytes:
    speech = load_speech()[: int(24000 * seconds) * 2]
    for offset in range(0, len(speech), FRAME_100MS):
        await send_json(
            ws, {"type": "input_audio_buffer.append", "audio": b64(speech[offset : offset + FRAME_100MS])}
        )
    return speech


async def start_response(ws: Any, log: EventLog, seconds: float) -> tuple[int, str, str]:
    """Commit ``seconds`` of speech and ask for a reply: (index of response.created, response id, item id)."""
    start = len(log.events)
    await append_speech(ws, seconds)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    index, _ = await log.wait_for("input_audio_buffer.committed", 5, start=start)
    await send_json(ws, {"type": "response.create"})
    index, created = await log.wait_for("response.created", 5, start=index)
    _, added = await log.wait_for("response.output_item.added", 5, start=index)
    return index, created["response"]["id"], added["item"]["id"]


def short_turn(speech_s: float, before_ms: float = 300, after_ms: float = 800) -> bytes:
    """Silence, the first ``speech_s`` seconds of the speech fixture (it starts ≈0.5 s in), silence."""
    return silence(before_ms) + load_speech()[: int(24000 * speech_s) * 2] + silence(after_ms)


async def wait_deltas(log: EventLog, response_id: str, count: int, start: int) -> int:
    index = start
    for _ in range(count):
        index, _ = await log.wait_for(is_delta_of(response_id), 5, start=index)
        index += 1
    return index


async def assert_no_stale_audio(
    log: EventLog, response_id: str, done_index: int, wait_s: float = 1.2
) -> None:
    """Nothing of ``response_id`` may follow its ``response.done`` (the echo would still be talking)."""
    await asyncio.sleep(wait_s)
    late = [e["type"] for e in log.events[done_index + 1 :] if e.get("response_id") == response_id]
    assert not [t for t in late if "delta" in t], f"stale output of {response_id} after response.done: {late}"


async def assert_alive(ws: Any, log: EventLog, tag: str = "alive") -> None:
    start = len(log.events)
    await send_json(ws, {"type": "session.heartbeat", "event_id": f"hb_{tag}"})
    _, ack = await log.wait_for("session.heartbeat_ack", 5, start=start)
    assert ack["session_id"].startswith("sess_")


def errors(log: EventLog, start: int = 0) -> list[dict[str, Any]]:
    return [e["error"] for e in log.events[start:] if e["type"] == "error"]


# ---------------------------------------------------------------------------------------
# (a) vLLM-Omni duplex extensions


@pytest.mark.parametrize("path", ["/v1/duplex", "/v1/realtime?duplex=1"])
async def test_duplex_handshake_requires_session_update_first(gw: Gateway, path: str) -> None:
    async with ws_connect(gw, path) as ws:
        log = EventLog(ws.recv)
        try:
            # Whatever the gateway sends on connect it sends before it answers this heartbeat.
            await send_json(ws, {"type": "session.heartbeat", "event_id": "evt_hello"})
            await log.wait_for("session.heartbeat_ack", 5)
            assert log.types() == ["session.heartbeat_ack"], (
                f"{path} spoke before session.update: {log.types()}"
            )
            for event_id, event in (
                ("evt_first", {"type": "input_audio_buffer.append", "audio": b64(silence(100))}),
                ("evt_second", {"type": "response.create"}),
                ("evt_third", {"type": "input_audio_buffer.commit"}),
                ("evt_fourth", {"type": "conversation.item.retrieve", "item_id": "x"}),
            ):
                start = len(log.events)
                await send_json(ws, {**event, "event_id": event_id})
                _, err = await log.wait_for("error", 5, start=start)
                assert err["error"]["code"] == "session_not_configured", err
                assert err["error"]["event_id"] == event_id
            # Still open: heartbeats work before the session is configured, too.
            await assert_alive(ws, log, "before")
            start = len(log.events)
            await send_json(ws, {"type": "session.update", "session": DUPLEX_SESSION, "event_id": "evt_open"})
            _, created = await log.wait_for("session.created", 5, start=start)
            assert created["session"]["audio"]["input"]["turn_detection"] is None
            assert created["session"]["id"].startswith("sess_")
            await assert_alive(ws, log, "after")
            assert not errors(log, start)
            # Configured now: a second session.update is an update.
            await send_json(
                ws, {"type": "session.update", "session": {"type": "realtime", "instructions": "hi"}}
            )
            _, updated = await log.wait_for("session.updated", 5, start=start)
            assert updated["session"]["instructions"] == "hi"
        finally:
            await log.aclose()


async def test_duplex_heartbeat_playback_ack_and_truncate(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        await send_json(ws, {"type": "session.heartbeat", "event_id": "hb1"})
        _, ack = await log.wait_for("session.heartbeat_ack", 5)
        session_id = ack["session_id"]

        index, response_id, item_id = await start_response(ws, log, 0.6)
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"
        produced = duration_ms(audio_of(log.events[index:done_index], response_id))
        assert 550 <= produced <= 650, produced

        # playback.ack -> playback.acknowledged, played_ms clamped to what was produced
        start = len(log.events)
        await send_json(ws, {"type": "playback.ack", "response_id": response_id, "played_ms": 300})
        _, acked = await log.wait_for("playback.acknowledged", 5, start=start)
        assert acked["response_id"] == response_id
        assert acked["played_ms"] == 300
        assert abs(acked["produced_ms"] - produced) <= 2, (acked, produced)
        assert acked["session_id"] == session_id
        assert acked["event"]["type"] == "playback.acknowledged"
        start = len(log.events)
        await send_json(ws, {"type": "playback.ack", "response_id": response_id, "played_ms": 99_999})
        _, acked = await log.wait_for("playback.acknowledged", 5, start=start)
        assert acked["played_ms"] == acked["produced_ms"], acked

        # conversation.item.truncate: within the produced audio, then beyond it
        start = len(log.events)
        await send_json(
            ws,
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": 200,
            },
        )
        _, truncated = await log.wait_for("conversation.item.truncated", 5, start=start)
        assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == (
            item_id,
            0,
            200,
        )
        start = len(log.events)
        await send_json(
            ws,
            {
                "type": "conversation.item.truncate",
                "event_id": "evt_trunc",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": 50_000,
            },
        )
        # Past the audio produced: clamped to all of it, as OpenAI does.
        _, truncated = await log.wait_for("conversation.item.truncated", 5, start=start)
        assert truncated["audio_end_ms"] == acked["produced_ms"], truncated
        start = len(log.events)
        await send_json(
            ws,
            {
                "type": "conversation.item.truncate",
                "event_id": "evt_trunc",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": -5,
            },
        )
        _, err = await log.wait_for("error", 5, start=start)
        assert err["error"]["code"] in ("invalid_audio_end_ms", "invalid_value")
        assert err["error"]["event_id"] == "evt_trunc"
        assert err["error"]["param"] == "audio_end_ms"
        for event, code in (
            (
                {
                    "type": "conversation.item.truncate",
                    "item_id": item_id,
                    "content_index": 1,
                    "audio_end_ms": 0,
                },
                "invalid_value",
            ),
            ({"type": "playback.ack", "response_id": "resp_unknown", "played_ms": 10}, "item_not_found"),
            ({"type": "playback.ack", "item_id": "item_unknown", "played_ms": 10}, "item_not_found"),
        ):
            start = len(log.events)
            await send_json(ws, {**event, "event_id": "evt_x"})
            _, err = await log.wait_for("error", 5, start=start)
            assert (err["error"]["code"], err["error"]["event_id"]) == (code, "evt_x"), (event, err)
        await assert_alive(ws, log)


async def test_duplex_barge_in_cancels_the_reply_and_fences_its_audio(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        index, response_id, _ = await start_response(ws, log, 2.5)
        await wait_deltas(log, response_id, 2, index)
        await send_json(ws, {"type": "barge_in", "event_id": "evt_barge"})
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "cancelled", done
        heard = duration_ms(audio_of(log.events[index:done_index], response_id))
        assert heard < 2000, heard
        await assert_no_stale_audio(log, response_id, done_index)
        assert not errors(log), errors(log)
        # The conversation goes on: the next turn gets a full reply.
        index, response_id, _ = await start_response(ws, log, 0.3)
        _, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"


async def test_caller_speaking_over_the_reply_interrupts_it(gw: Gateway) -> None:
    """Server VAD with interrupt_response (the default): speech during a reply cancels it."""
    async with realtime_session(gw) as (ws, log):
        await stream_audio(ws, short_turn(2.5), realtime=False, timeout=20)
        index, created = await log.wait_for("response.created", 5)
        first_id = created["response"]["id"]
        await wait_deltas(log, first_id, 3, index)
        # The caller talks again while the echo (pace 1.0, ≈2.3 s) is still playing.
        mark = len(log.events)
        interrupt = asyncio.create_task(stream_audio(ws, short_turn(1.5, before_ms=100), realtime=False))
        try:
            i_speech, _ = await log.wait_for("input_audio_buffer.speech_started", 10, start=mark)
            i_done, done = await log.wait_for(done_of(first_id), 5, start=mark)
            assert done["response"]["status"] == "cancelled", done
            assert (done["response"]["status_details"] or {}).get("reason") == "turn_detected", done
            assert i_done > i_speech, log.types(mark)
            i_created, created = await log.wait_for("response.created", 15, start=i_done)
            second_id = created["response"]["id"]
            assert second_id != first_id
            await wait_deltas(log, second_id, 2, i_created)
            stale = [e for e in log.events[i_speech + 1 :] if is_delta_of(first_id)(e)]
            assert not stale, f"{len(stale)} deltas of the interrupted reply after speech_started"
            assert not errors(log), errors(log)
        finally:
            await asyncio.wait_for(interrupt, 20)


async def test_response_create_while_one_is_active(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        index, response_id, _ = await start_response(ws, log, 0.8)
        await send_json(ws, {"type": "response.create", "event_id": "evt_twice"})
        _, err = await log.wait_for("error", 5, start=index)
        assert err["error"]["code"] == "conversation_already_has_active_response"
        assert err["error"]["event_id"] == "evt_twice"
        mark = len(log.events)
        await send_json(ws, {"type": "response.cancel", "event_id": "evt_other", "response_id": "resp_other"})
        _, err = await log.wait_for("error", 5, start=mark)
        assert (err["error"]["code"], err["error"]["event_id"]) == ("response_cancel_not_active", "evt_other")
        # The active reply is untouched and completes.
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"
        assert 750 <= duration_ms(audio_of(log.events[index:done_index], response_id)) <= 850
        assert [e["response"]["id"] for e in log.events if e["type"] == "response.created"] == [response_id]


async def test_output_audio_buffer_clear_mid_reply(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        # With nothing playing nothing changes, and nothing is said: OpenAI's
        # output_audio_buffer.cleared must name the reply it cleared.
        mark = len(log.events)
        await send_json(ws, {"type": "output_audio_buffer.clear"})
        await send_json(ws, {"type": "session.heartbeat"})
        await log.wait_for("session.heartbeat_ack", 5, start=mark)
        assert log.types(mark) == ["session.heartbeat_ack"], log.types(mark)

        index, response_id, _ = await start_response(ws, log, 2.5)
        await wait_deltas(log, response_id, 2, index)
        await send_json(ws, {"type": "output_audio_buffer.clear"})
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "cancelled"
        _, cleared = await log.wait_for("output_audio_buffer.cleared", 5, start=done_index)
        assert cleared["response_id"] == response_id
        await assert_no_stale_audio(log, response_id, done_index)
        assert not errors(log)


async def test_truncate_mid_reply_cancels_it(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        index, response_id, item_id = await start_response(ws, log, 2.5)
        after = await wait_deltas(log, response_id, 3, index)
        played = int(duration_ms(audio_of(log.events[index:after], response_id)))
        await send_json(
            ws,
            {
                "type": "conversation.item.truncate",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": played,
            },
        )
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "cancelled"
        _, truncated = await log.wait_for("conversation.item.truncated", 5, start=index)
        assert truncated["audio_end_ms"] == played
        await assert_no_stale_audio(log, response_id, done_index)
        assert not errors(log)


async def test_session_close_then_close_code_1000(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        await send_json(ws, {"type": "session.close", "reason": "bye"})
        _, closed = await log.wait_for("session.closed", 5)
        assert closed["reason"] == "bye"
        assert await wait_closed(ws) == 1000


async def test_session_close_mid_reply(gw: Gateway) -> None:
    async with duplex_session(gw) as (ws, log):
        index, response_id, _ = await start_response(ws, log, 2.5)
        await wait_deltas(log, response_id, 1, index)
        await send_json(ws, {"type": "session.close"})
        closed_index, _ = await log.wait_for("session.closed", 5, start=index)
        assert await wait_closed(ws) == 1000
        done = [e for e in log.events[index:closed_index] if done_of(response_id)(e)]
        assert done and done[0]["response"]["status"] == "cancelled", log.types(index)


async def test_conversation_items_create_retrieve_delete(gw: Gateway) -> None:
    async with realtime_session(gw) as (ws, log):
        item = {
            "type": "message",
            "id": "item_user_1",
            "role": "user",
            "content": [{"type": "input_text", "text": "héllo"}],
        }
        await send_json(ws, {"type": "conversation.item.create", "item": item})
        _, added = await log.wait_for("conversation.item.added", 5)
        assert added["item"]["id"] == "item_user_1"
        assert added["item"]["content"][0]["text"] == "héllo"
        await log.wait_for("conversation.item.done", 5)
        await send_json(ws, {"type": "conversation.item.create", "event_id": "evt_dup", "item": item})
        _, err = await log.wait_for("error", 5)
        assert (err["error"]["code"], err["error"]["event_id"]) == ("invalid_value", "evt_dup")
        await send_json(ws, {"type": "conversation.item.retrieve", "item_id": "item_user_1"})
        _, retrieved = await log.wait_for("conversation.item.retrieved", 5)
        assert retrieved["item"]["role"] == "user"
        await send_json(ws, {"type": "conversation.item.delete", "item_id": "item_user_1"})
        _, deleted = await log.wait_for("conversation.item.deleted", 5)
        assert deleted["item_id"] == "item_user_1"
        mark = len(log.events)
        await send_json(
            ws, {"type": "conversation.item.retrieve", "event_id": "evt_gone", "item_id": "item_user_1"}
        )
        _, err = await log.wait_for("error", 5, start=mark)
        assert (err["error"]["code"], err["error"]["event_id"]) == (
            "item_retrieve_invalid_item_id",
            "evt_gone",
        )
        await assert_alive(ws, log)


async def test_text_only_output_modality(gw: Gateway) -> None:
    async with realtime_session(gw, manual=True) as (ws, log):
        mark = len(log.events)
        await send_json(
            ws, {"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}
        )
        _, updated = await log.wait_for("session.updated", 5, start=mark)
        assert updated["session"]["output_modalities"] == ["text"]
        index, response_id, _ = await start_response(ws, log, 0.3)
        _, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"
        types = log.types(index)
        assert "response.output_text.delta" in types and "response.output_text.done" in types, types
        assert not [t for t in types if "audio" in t], types
        assert done["response"]["output"][0]["content"][0]["type"] == "output_text"


async def test_realtime_beta_header_gets_beta_event_names(gw: Gateway) -> None:
    async with realtime_session(gw, additional_headers={"OpenAI-Beta": "realtime=v1"}) as (ws, log):
        created = log.events[0]
        assert created["type"] == "session.created"
        assert created["session"]["input_audio_format"] == "pcm16"
        assert "modalities" in created["session"]
        await send_json(ws, {"type": "session.update", "session": {"turn_detection": None}})
        _, updated = await log.wait_for("session.updated", 5)
        assert updated["session"]["turn_detection"] is None
        index, response_id, _ = await start_response(ws, log, 0.5)
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"
        types = log.types()
        assert "response.audio.delta" in types
        assert "response.audio.done" in types
        assert "response.audio_transcript.delta" in types
        assert "conversation.item.created" in types
        ga_only = {
            "response.output_audio.delta",
            "response.output_audio.done",
            "conversation.item.added",
            "conversation.item.done",
            "response.output_audio_transcript.delta",
        }
        assert not ga_only & set(types), ga_only & set(types)
        assert 450 <= duration_ms(audio_of(log.events[index:done_index], response_id)) <= 550
    # The browser way to ask for beta: a subprotocol.
    async with realtime_session(gw, subprotocols=["realtime", "openai-beta.realtime-v1"]) as (ws, log):
        assert ws.subprotocol == "realtime"
        assert log.events[0]["session"]["input_audio_format"] == "pcm16"
    # And without either, GA names.
    async with realtime_session(gw) as (ws, log):
        assert log.events[0]["session"]["type"] == "realtime"
        assert "input_audio_format" not in log.events[0]["session"]


async def test_beta_query_parameter_selects_the_beta_dialect_end_to_end(gw: Gateway) -> None:
    """``?beta=1``, for clients that can set neither a header nor a subprotocol."""
    async with realtime_session(gw, path="/v1/realtime?beta=1") as (ws, log):
        assert log.events[0]["session"]["input_audio_format"] == "pcm16"
        await send_json(ws, {"type": "session.update", "session": {"turn_detection": None}})
        _, updated = await log.wait_for("session.updated", 5)
        assert updated["session"]["turn_detection"] is None
        index, response_id, _ = await start_response(ws, log, 0.5)
        done_index, done = await log.wait_for(done_of(response_id), 5, start=index)
        assert done["response"]["status"] == "completed"
        reply = log.types(index)[: done_index - index + 1]
        assert "response.audio.delta" in reply and "response.audio_transcript.delta" in reply, reply
        assert "response.output_audio.delta" not in log.types(), log.types()
        assert "conversation.item.created" in log.types() and "conversation.item.added" not in log.types()
        assert 450 <= duration_ms(audio_of(log.events[index:done_index], response_id)) <= 550
        # A beta client parses what it gets with the SDK's beta models, strictly.
        for event in log.events:
            validate_server_event(event, beta=True)


# ---------------------------------------------------------------------------------------
# (b) bad input: one error event, the session survives


def _too_long_int() -> str:
    return '{"type": "playback.ack", "played_ms": ' + "9" * 5000 + "}"


BAD_INPUT: list[tuple[str, str | bytes | dict[str, Any], str, str | None]] = [
    ("invalid_json", "{not json", "invalid_json", None),
    ("trailing_garbage", '{"type": "session.heartbeat"} }', "invalid_json", None),
    ("deeply_nested", "[" * 30_000 + "]" * 30_000, "invalid_json", None),
    ("int_too_long", _too_long_int(), "invalid_json", None),
    ("not_an_object", "[1, 2, 3]", "invalid_event", None),
    ("missing_type", {"event_id": "evt_nt"}, "invalid_event", "evt_nt"),
    ("unknown_event", {"type": "no.such.event", "event_id": "evt_unknown"}, "unknown_event", "evt_unknown"),
    ("missing_audio", {"type": "input_audio_buffer.append", "event_id": "evt_ma"}, "missing_field", "evt_ma"),
    ("missing_session", {"type": "session.update", "event_id": "evt_ms"}, "missing_field", "evt_ms"),
    (
        "missing_audio_end_ms",
        {"type": "conversation.item.truncate", "event_id": "evt_mt", "item_id": "item_x", "content_index": 0},
        "missing_field",
        "evt_mt",
    ),
    (
        "bad_base64",
        {"type": "input_audio_buffer.append", "event_id": "evt_b64", "audio": "this is not base64!"},
        "invalid_base64",
        "evt_b64",
    ),
    (
        "odd_pcm16_length",
        {"type": "input_audio_buffer.append", "event_id": "evt_odd", "audio": b64(b"\x01\x02\x03")},
        "invalid_audio_length",
        "evt_odd",
    ),
    (
        "empty_audio",
        {"type": "input_audio_buffer.append", "event_id": "evt_empty", "audio": ""},
        "invalid_value",
        "evt_empty",
    ),
    (
        "unsupported_format_ga",
        {
            "type": "session.update",
            "event_id": "evt_fmt",
            "session": {"type": "realtime", "audio": {"input": {"format": {"type": "audio/opus"}}}},
        },
        "unsupported_audio_format",
        "evt_fmt",
    ),
    (
        "unsupported_format_beta",
        {"type": "session.update", "event_id": "evt_fmt2", "session": {"input_audio_format": "mp3"}},
        "unsupported_audio_format",
        "evt_fmt2",
    ),
    (
        "unsupported_rate",
        {
            "type": "session.update",
            "event_id": "evt_rate",
            "session": {
                "type": "realtime",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 96000}}},
            },
        },
        "unsupported_sample_rate",
        "evt_rate",
    ),
    (
        "unsupported_turn_detection",
        {
            "type": "session.update",
            "event_id": "evt_td",
            "session": {"turn_detection": {"type": "push_to_talk"}},
        },
        "unsupported_turn_detection",
        "evt_td",
    ),
    (
        "cancel_nothing",
        {"type": "response.cancel", "event_id": "evt_cancel"},
        "response_cancel_not_active",
        "evt_cancel",
    ),
    (
        "commit_empty",
        {"type": "input_audio_buffer.commit", "event_id": "evt_commit"},
        "input_audio_buffer_commit_empty",
        "evt_commit",
    ),
    (
        "truncate_unknown_item",
        {
            "type": "conversation.item.truncate",
            "event_id": "evt_ti",
            "item_id": "item_nope",
            "content_index": 0,
            "audio_end_ms": 0,
        },
        "item_truncate_invalid_item_id",
        "evt_ti",
    ),
    (
        "delete_unknown_item",
        {"type": "conversation.item.delete", "event_id": "evt_di", "item_id": "item_nope"},
        "item_delete_invalid_item_id",
        "evt_di",
    ),
    (
        "retrieve_unknown_item",
        {"type": "conversation.item.retrieve", "event_id": "evt_ri", "item_id": "item_nope"},
        "item_retrieve_invalid_item_id",
        "evt_ri",
    ),
    (
        "negative_played_ms",
        {"type": "playback.ack", "event_id": "evt_neg", "played_ms": -5},
        "invalid_value",
        "evt_neg",
    ),
    (
        "nan_played_ms",
        '{"type": "playback.ack", "event_id": "evt_nan", "played_ms": NaN}',
        "invalid_value",
        "evt_nan",
    ),
    ("event_id_not_string", {"type": "session.heartbeat", "event_id": 7}, "invalid_value", None),
]


@pytest.mark.parametrize(
    ("message", "code", "event_id"),
    [pytest.param(m, c, e, id=name) for name, m, c, e in BAD_INPUT],
)
async def test_bad_input_is_an_error_event_and_the_session_survives(
    gw: Gateway, message: str | dict[str, Any], code: str, event_id: str | None
) -> None:
    async with realtime_session(gw) as (ws, log):
        start = len(log.events)
        text = message if isinstance(message, str) else json.dumps(message)
        await asyncio.wait_for(ws.send(text), 5)
        _, err = await log.wait_for("error", 5, start=start)
        assert err["error"]["code"] == code, err
        assert err["error"]["event_id"] == event_id, err
        assert err["error"]["type"] == "invalid_request_error", err
        assert err["error"]["message"]
        # Where OpenAI defines the error, its words begin the message (clients match on them).
        assert err["error"]["message"].startswith(OPENAI_MESSAGES.get(ErrorCode(code), "")), err
        await assert_alive(ws, log)
        assert len(errors(log, start)) == 1, errors(log, start)
        # Still a working session: audio is accepted and committed.
        await send_json(ws, {"type": "session.update", "session": NO_TURN_DETECTION})
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(silence(100))})
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await log.wait_for("input_audio_buffer.committed", 5, start=start)


async def test_append_before_configured_on_duplex(gw: Gateway) -> None:
    async with ws_connect(gw, "/v1/duplex") as ws:
        log = EventLog(ws.recv)
        try:
            await send_json(
                ws, {"type": "input_audio_buffer.append", "event_id": "e1", "audio": b64(silence(20))}
            )
            _, err = await log.wait_for("error", 5)
            assert (err["error"]["code"], err["error"]["event_id"]) == ("session_not_configured", "e1")
            # Bad JSON first is a parse error, and still not fatal.
            await asyncio.wait_for(ws.send("{"), 5)
            _, err = await log.wait_for("error", 5, start=1)
            assert err["error"]["code"] == "invalid_json"
            await assert_alive(ws, log)
        finally:
            await log.aclose()


async def test_session_event_ack_is_accepted_silently(gw: Gateway) -> None:
    """vLLM-Omni's DuplexClient acks every server event; answering with an error would loop."""
    async with realtime_session(gw) as (ws, log):
        start = len(log.events)
        for seq in (1, 2):
            await send_json(ws, {"type": "session.event_ack", "server_event_seq": seq})
        await assert_alive(ws, log)
        assert not errors(log, start), errors(log, start)
    async with ws_connect(gw, "/v1/duplex") as ws:  # also before the session is configured
        log = EventLog(ws.recv)
        try:
            await send_json(ws, {"type": "session.event_ack", "server_event_seq": 0})
            await assert_alive(ws, log)
            assert not errors(log), errors(log)
        finally:
            await log.aclose()


async def test_binary_frame_is_refused_and_session_survives(gw: Gateway) -> None:
    async with realtime_session(gw) as (ws, log):
        await asyncio.wait_for(ws.send(b"\x00\x01\x02\x03"), 5)
        _, err = await log.wait_for("error", 5)
        assert err["error"]["code"] == "binary_not_supported"
        await assert_alive(ws, log)


async def test_message_too_large_is_survivable(gw: Gateway) -> None:
    async with realtime_session(gw) as (ws, log):
        big = json.dumps(
            {"type": "input_audio_buffer.append", "event_id": "evt_big", "audio": "A" * (MAX_MESSAGE + 10)}
        )
        assert MAX_MESSAGE < len(big) < HARD_MAX_MESSAGE
        await asyncio.wait_for(ws.send(big), 5)
        _, err = await log.wait_for("error", 5)
        assert err["error"]["code"] == "message_too_large"
        await assert_alive(ws, log)
        # Multi-byte text: the limit is in bytes, not characters.
        wide = json.dumps(
            {"type": "session.update", "session": {"instructions": "é" * (MAX_MESSAGE // 2 + 100)}},
            ensure_ascii=False,
        )
        assert len(wide) < MAX_MESSAGE < len(wide.encode())
        start = len(log.events)
        await asyncio.wait_for(ws.send(wide), 5)
        _, err = await log.wait_for("error", 5, start=start)
        assert err["error"]["code"] == "message_too_large"
        await assert_alive(ws, log, "wide")


async def test_frame_above_hard_limit_closes_1009(gw: Gateway) -> None:
    async with realtime_session(gw) as (ws, _):
        huge = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * (HARD_MAX_MESSAGE + 10)})
        with suppress(ConnectionClosed):
            await asyncio.wait_for(ws.send(huge), 5)
        assert await wait_closed(ws) == 1009


@pytest.fixture(scope="module")
def upload_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    # Default limits: nothing raised for the upload; the echo comes back unpaced.
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 0}}}, name="upload"
    )


def recording(seconds: float) -> bytes:
    """``seconds`` of recorded speech (the fixture and pauses, repeated) at 24 kHz PCM16."""
    once = load_speech() + silence(600)
    audio = once * (int(seconds * 48000) // len(once) + 1)
    return audio[: int(seconds * 24000) * 2]


async def upload_and_echo(gw: Gateway, audio: bytes, frame_bytes: int) -> tuple[bytes, EventLog]:
    """Send ``audio`` as fast as the socket takes it, commit, and collect the echo."""
    async with realtime_session(gw, manual=True) as (ws, log):
        for offset in range(0, len(audio), frame_bytes):
            await ws.send(
                json.dumps(
                    {"type": "input_audio_buffer.append", "audio": b64(audio[offset : offset + frame_bytes])}
                )
            )
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await send_json(ws, {"type": "response.create"})
        index, created = await log.wait_for("response.created", 30)
        response_id = created["response"]["id"]
        done_index, done = await log.wait_for(done_of(response_id), 30, start=index)
        assert done["response"]["status"] == "completed", done
        return audio_of(log.events[index:done_index], response_id), log


@pytest.mark.parametrize("frame_ms", [20, 12_000], ids=["20ms-frames", "one-append"])
async def test_upload_sent_at_once_comes_back_whole(upload_gateway: Gateway, frame_ms: int) -> None:
    """12 s of audio, sent far faster than real time, loses nothing: the gateway paces it with TCP."""
    audio = recording(12.0)
    echo, log = await upload_and_echo(upload_gateway, audio, 24000 * 2 * frame_ms // 1000)
    assert not errors(log), errors(log)
    assert len(echo) == len(audio), (duration_ms(echo), duration_ms(audio))
    assert echo == audio  # the engine's own format both ways: no conversion, byte for byte
    await upload_gateway.wait_sessions(0)


async def test_append_over_the_size_cap_is_refused_and_the_session_lives(upload_gateway: Gateway) -> None:
    """The one coded refusal of caller audio: a single message above ``limits.max_message_bytes``.

    Its default holds OpenAI's cap, 15 MiB of audio in one append.
    """
    from duplex_gateway.config import MAX_APPEND_AUDIO_BYTES, MAX_MESSAGE_BYTES

    at_cap = json.dumps(
        {
            "type": "input_audio_buffer.append",
            "event_id": "evt_cap",
            "audio": b64(bytes(MAX_APPEND_AUDIO_BYTES)),
        }
    )
    assert len(at_cap) <= MAX_MESSAGE_BYTES
    over = json.dumps(
        {"type": "input_audio_buffer.append", "event_id": "evt_over", "audio": "A" * MAX_MESSAGE_BYTES}
    )
    async with realtime_session(upload_gateway, manual=True) as (ws, log):
        await asyncio.wait_for(ws.send(over), 30)
        _, err = await log.wait_for("error", 30)
        assert err["error"]["code"] == "message_too_large", err
        await asyncio.wait_for(ws.send(at_cap), 30)
        mark = len(log.events)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await log.wait_for("input_audio_buffer.committed", 60, start=mark)
        assert [e["code"] for e in errors(log)] == ["message_too_large"], errors(log)
    await upload_gateway.wait_sessions(0)


# ---------------------------------------------------------------------------------------
# isolation: one bad client never disturbs another


async def test_bad_sessions_do_not_disturb_a_good_one(gw: Gateway) -> None:
    async with realtime_session(gw) as (good, good_log):
        turn = short_turn(3.0, before_ms=600, after_ms=900)

        async def garbage() -> None:
            async with realtime_session(gw) as (bad, bad_log):
                for _ in range(3):
                    await asyncio.wait_for(bad.send("{oops"), 5)
                    await asyncio.wait_for(bad.send(b"\xff" * 100), 5)
                    await send_json(bad, {"type": "what.ever"})
                    await send_json(bad, {"type": "input_audio_buffer.append", "audio": "%%%"})
                    await asyncio.wait_for(bad.send("x" * (MAX_MESSAGE + 1)), 5)
                    for _ in range(15):  # 1.5 s of audio per round, far faster than real time
                        await send_json(
                            bad, {"type": "input_audio_buffer.append", "audio": b64(silence(100))}
                        )
                await assert_alive(bad, bad_log, "bad")
                codes = {e["code"] for e in errors(bad_log)}
                assert {
                    "invalid_json",
                    "binary_not_supported",
                    "unknown_event",
                    "invalid_base64",
                    "message_too_large",
                } <= codes, codes
                assert "input_rate_exceeded" not in codes, codes
                # ... and finally a frame over the hard limit kills only this connection.
                with suppress(ConnectionClosed):
                    await asyncio.wait_for(bad.send("y" * (HARD_MAX_MESSAGE + 1)), 5)
                assert await wait_closed(bad) == 1009

        async def vanisher() -> None:
            async with ws_connect(gw) as ws:
                await asyncio.wait_for(ws.recv(), 5)
                await stream_audio(ws, turn[: len(turn) // 2], realtime=False, timeout=10)
                ws.transport.abort()  # gone without a close frame, mid-turn

        bad_tasks = [asyncio.create_task(garbage()), asyncio.create_task(vanisher())]
        await stream_audio(good, turn, realtime=False, timeout=20)
        _, started = await good_log.wait_for("input_audio_buffer.speech_started", 5)
        _, stopped = await good_log.wait_for("input_audio_buffer.speech_stopped", 5)
        index, created = await good_log.wait_for("response.created", 5)
        response_id = created["response"]["id"]
        done_index, done = await good_log.wait_for(done_of(response_id), 15, start=index)
        assert done["response"]["status"] == "completed", done
        echoed = duration_ms(audio_of(good_log.events[index:done_index], response_id))
        turn_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
        assert abs(echoed - turn_ms) <= 600 and echoed >= 1500, (echoed, turn_ms)
        assert not errors(good_log), errors(good_log)
        await asyncio.wait_for(asyncio.gather(*bad_tasks), 15)


# ---------------------------------------------------------------------------------------
# limits: admission control, release on every close path, idle timeout


async def test_admission_control_and_release_on_every_close_path(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory.start(_config(max_sessions=2), name="admission")
    async with realtime_session(gw) as (a, _), realtime_session(gw) as (b, b_log):
        assert gw.readyz()["sessions"] == 2
        async with ws_connect(gw) as c:
            refused = json.loads(await asyncio.wait_for(c.recv(), 5))
            assert refused["type"] == "error", refused
            assert refused["error"]["code"] == "session_limit"
            assert refused["error"]["type"] == "rate_limit_error"
            assert await wait_closed(c) == 1013
        async with ws_connect(gw, "/v1/duplex") as c:
            # The duplex handshake is admitted when its session.update opens the engine (its
            # first message could have been a session.resume, which needs no new slot).
            await send_json(c, {"type": "session.update", "session": DUPLEX_SESSION})
            refused = json.loads(await asyncio.wait_for(c.recv(), 5))
            assert refused["error"]["code"] == "session_limit"
            assert await wait_closed(c) == 1013
        await a.close()
        await gw.wait_sessions(1)
        async with realtime_session(gw, manual=True) as (d, _):
            # b vanishes mid-reply (no close frame); d ends with session.close.
            await send_json(b, {"type": "session.update", "session": NO_TURN_DETECTION})
            await b_log.wait_for("session.updated", 5)
            index, response_id, _ = await start_response(b, b_log, 2.0)
            await wait_deltas(b_log, response_id, 1, index)
            b.transport.abort()
            await send_json(d, {"type": "session.close"})
            assert await wait_closed(d) == 1000
        await gw.wait_sessions(0)

    # The echo engine is limited to max_sessions too: had any engine session leaked, these fail.
    async with realtime_session(gw) as (e, _), realtime_session(gw, manual=True) as (f, f_log):
        assert gw.readyz()["sessions"] == 2
        index, response_id, _ = await start_response(f, f_log, 2.0)
        await wait_deltas(f_log, response_id, 1, index)
        with suppress(ConnectionClosed):
            await asyncio.wait_for(e.send("z" * (HARD_MAX_MESSAGE + 1)), 5)
        assert await wait_closed(e) == 1009
        await f.close()  # a normal client close mid-reply
    await gw.wait_sessions(0)
    async with ws_connect(gw, "/v1/duplex") as g:
        g_log = EventLog(g.recv)
        try:
            await send_json(g, {"type": "session.heartbeat"})
            await g_log.wait_for("session.heartbeat_ack", 5)
            assert gw.readyz()["sessions"] == 0  # not configured yet: no slot taken
            g.transport.abort()  # then gone
        finally:
            await g_log.aclose()
    await gw.wait_sessions(0)
    async with duplex_session(gw) as (_h, _), duplex_session(gw) as (i, i_log):
        index, response_id, _ = await start_response(i, i_log, 0.3)
        await i_log.wait_for(done_of(response_id), 5, start=index)
    await gw.wait_sessions(0)


async def test_idle_timeout_closes_4000_and_max_duration_closes_4001(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory.start(_config(idle_timeout_s=1, max_session_s=3), name="idle")
    loop = asyncio.get_running_loop()

    async def busy_until_max_duration() -> None:
        async with realtime_session(gw) as (ws, log):
            opened = loop.time()
            i = 0
            while not errors(log):  # never idle: a heartbeat every 0.3 s
                assert loop.time() - opened < 5, "max_session_s=3 did not end the session"
                try:
                    await send_json(ws, {"type": "session.heartbeat", "event_id": f"keep{i}"})
                except ConnectionClosed:
                    break
                i += 1
                await asyncio.sleep(0.3)
            _, err = await log.wait_for("error", 2)
            assert err["error"]["code"] == "session_expired", err
            assert err["error"]["message"] == "Your session hit the maximum duration of 3 seconds.", err
            assert 2.7 <= loop.time() - opened <= 4.5
            assert await wait_closed(ws) == 4001

    busy = asyncio.create_task(busy_until_max_duration())
    try:
        async with realtime_session(gw) as (ws, log):
            # Any client message resets the idle clock.
            for i in range(4):
                await asyncio.sleep(0.3)
                await send_json(ws, {"type": "session.heartbeat", "event_id": f"hb{i}"})
            assert not errors(log)
            mark = len(log.events)
            quiet_since = loop.time()
            err_index, err = await log.wait_for("error", 4, start=mark)
            waited = loop.time() - quiet_since
            assert err["error"]["code"] == "idle_timeout", err
            assert 0.8 <= waited <= 2.0, waited
            assert await wait_closed(ws) == 4000
            with pytest.raises(AssertionError, match="connection ended"):  # every event read
                await log.wait_for(lambda e: False, 2, start=err_index)
            # session.closed is vLLM-Omni's: a plain Realtime client gets the error and the close code only.
            assert "session.closed" not in log.types(err_index), log.types(err_index)
        # An unconfigured /v1/duplex connection times out the same way.
        async with ws_connect(gw, "/v1/duplex") as ws:
            log = EventLog(ws.recv)
            try:
                _, err = await log.wait_for("error", 4)
                assert err["error"]["code"] == "idle_timeout"
                assert await wait_closed(ws) == 4000
            finally:
                await log.aclose()
    finally:
        await asyncio.wait_for(busy, 10)
    await gw.wait_sessions(0)


# ---------------------------------------------------------------------------------------
# auth


API_KEY = "sk-e2e-test-key"


async def test_api_key_auth(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory.start({**_config(), "auth": {"api_keys": [API_KEY, "second-key"]}}, name="auth")

    async def refused(path: str = "/v1/realtime", **connect: Any) -> None:
        # Refused before the upgrade: HTTP 401 with the JSON error, no session, no engine work.
        with pytest.raises(InvalidStatus) as info:
            async with ws_connect(gw, path, **connect):
                pass
        response = info.value.response
        assert response.status_code == 401, (path, connect)
        assert json.loads(response.body)["error"]["code"] == "unauthorized"

    await refused()
    await refused("/v1/duplex")
    await refused(additional_headers={"Authorization": "Bearer wrong"})
    await refused(additional_headers={"Authorization": f"Basic {API_KEY}"})
    await refused(subprotocols=["realtime", "openai-insecure-api-key.wrong"])
    await refused("/v1/realtime?api_key=wrong")

    async with realtime_session(gw, additional_headers={"Authorization": f"Bearer {API_KEY}"}) as (ws, log):
        await assert_alive(ws, log)
    async with realtime_session(gw, additional_headers={"Authorization": "Bearer second-key"}) as (ws, log):
        await assert_alive(ws, log)
    async with realtime_session(gw, subprotocols=["realtime", f"openai-insecure-api-key.{API_KEY}"]) as (
        ws,
        log,
    ):
        assert ws.subprotocol == "realtime"
        await assert_alive(ws, log)
    async with realtime_session(gw, path=f"/v1/realtime?api_key={API_KEY}") as (ws, log):
        await assert_alive(ws, log)

    # The official SDK sends the key as a bearer token.
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key=API_KEY, websocket_base_url=f"ws://127.0.0.1:{gw.port}/v1")
    async with asyncio.timeout(10):
        async with client.realtime.connect(model="gpt-realtime") as conn:
            first = json.loads(await conn.recv_bytes())
            assert first["type"] == "session.created", first
    await client.close()
    await gw.wait_sessions(0)
    # Refused connections never counted.
    body = gw.readyz()
    assert body["sessions"] == 0 and body["engine_sessions"] == 0


async def test_shutdown_closes_sessions_with_1001(gateway_factory: GatewayFactory) -> None:
    gw = gateway_factory.start(_config(), name="shutdown")
    async with duplex_session(gw) as (ws, log):
        index, response_id, _ = await start_response(ws, log, 2.0)
        await wait_deltas(log, response_id, 1, index)
        gw.proc.send_signal(signal.SIGTERM)
        code = await wait_closed(ws, 10)
        await asyncio.to_thread(gw.proc.wait, 10)  # it does exit promptly
        types = log.types(index)
        assert code == 1001, (code, types[-5:])
        assert "session.closed" in types, types[-5:]
        assert any(done_of(response_id)(e) for e in log.events[index:]), types[-5:]


async def test_http_probes(gw: Gateway) -> None:
    status, body = gw.get("/healthz")
    assert (status, body) == (200, {"status": "ok"})
    body = gw.readyz()
    assert body["status"] == "ready" and body["engine"] == "echo" and body["max_sessions"] == 16
    # A plain HTTP GET on a WebSocket route is not a crash.
    with pytest.raises(InvalidStatus):
        async with ws_connect(gw, "/v1/nowhere"):
            pass


async def test_vllm_omni_input_events_on_an_engine_without_turn_taking(gw: Gateway) -> None:
    async with realtime_session(gw, manual=True) as (ws, log):
        await send_json(ws, {"type": "input.text.append", "event_id": "t1", "text": "hello"})
        await send_json(ws, {"type": "turn.signal", "event_id": "t2", "event": "user_started"})
        for event_id in ("t1", "t2"):
            _, error = await log.wait_for(
                lambda e, i=event_id: e["type"] == "error" and e["error"]["event_id"] == i
            )
            assert error["error"]["code"] == "unsupported_by_engine"
        # input.cancel abandons the turn; a signal naming a command is that command.
        await stream_audio(ws, load_speech()[: FRAME_100MS * 5], frame_ms=100, realtime=False)
        await send_json(ws, {"type": "input.cancel"})
        await log.wait_for("input_audio_buffer.cleared")
        await send_json(ws, {"type": "input_audio_buffer.commit", "event_id": "c1"})
        _, error = await log.wait_for(lambda e: e["type"] == "error" and e["error"]["event_id"] == "c1")
        assert error["error"]["code"] == "input_audio_buffer_commit_empty"
        mark = len(log.events)
        await send_json(
            ws, {"type": "turn.signal", "event": "session.update", "payload": {"instructions": "Hi."}}
        )
        _, updated = await log.wait_for("session.updated", start=mark)
        assert updated["session"]["instructions"] == "Hi."
