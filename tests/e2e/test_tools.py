"""Function calling end to end: clients written by others, a real gateway, the embedded engine.

The caller SPEAKS a request that needs a tool (a recorded phrase, recognised by the
engine's Whisper); the engine's offline tool router calls the client's function; the
client runs it and returns its output; the next reply speaks from that output. The
``openai`` SDK drives it by hand (every raw event validated strictly against its
models); ``openai-agents`` runs its own ``@function_tool`` at its default settings.
An out-of-band reply (``conversation: "none"``) runs beside a reply in progress.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import websockets
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeModelConfig, RealtimeRunner
from openai import AsyncOpenAI

from tests.e2e.helpers import EventLog, Gateway, GatewayFactory, encode, silence, stream_audio
from tests.fixtures import PHRASES
from tests.sdk_models import validate_server_event

pytestmark = pytest.mark.e2e

#: "What is the weather going to be like in Boston this weekend?"
WEATHER_PHRASE = next(p for p in PHRASES if "Boston" in p.text)
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather forecast for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "description": "The city"}},
        "required": ["city"],
    },
}
#: A tool the caller's words have nothing to do with: it must not be called.
REFUND_TOOL = {
    "type": "function",
    "name": "issue_refund",
    "description": "Refund an order.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "embedded"}}, name="tools"
    )


def weather_turn(rate: int = 24_000) -> bytes:
    """Silence, the spoken weather question, silence: one turn for server VAD."""
    speech = encode(np.asarray(WEATHER_PHRASE.load(rate)))
    return silence(800, rate) + speech + silence(1200, rate)


@pytest.fixture
async def sdk(gateway: Gateway) -> AsyncIterator[tuple[Any, EventLog]]:
    client = AsyncOpenAI(api_key="test", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with asyncio.timeout(10):
        manager = client.realtime.connect(model="gpt-realtime")
        conn = await manager.__aenter__()
    log = EventLog(conn.recv_bytes)
    try:
        yield conn, log
    finally:
        await log.aclose()
        async with asyncio.timeout(10):
            await manager.__aexit__(None, None, None)
        await client.close()
        await gateway.wait_sessions(0)


async def test_openai_sdk_calls_a_function_and_hears_a_reply_built_from_its_output(
    sdk: tuple[Any, EventLog],
) -> None:
    conn, log = sdk
    await log.wait_for("session.created", 10)
    await conn.session.update(
        session={
            "type": "realtime",
            "tools": [REFUND_TOOL, WEATHER_TOOL],
            "tool_choice": "auto",
            "audio": {"input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}},
        }
    )
    _, updated = await log.wait_for("session.updated", 10)
    assert [t["name"] for t in updated["session"]["tools"]] == ["issue_refund", "get_weather"]

    await stream_audio(conn, weather_turn(), frame_ms=20, speed=2.0, lead_ms=1000, timeout=30)
    i_args, args_done = await log.wait_for("response.function_call_arguments.done", 60)
    assert args_done["name"] == "get_weather"
    assert json.loads(args_done["arguments"]) == {"city": "Boston"}
    call_id, call_item_id, response_id = args_done["call_id"], args_done["item_id"], args_done["response_id"]
    _, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id, 30, start=i_args
    )
    assert done["response"]["status"] == "completed"
    output = done["response"]["output"]
    assert [(o["type"], o["call_id"], o["status"]) for o in output] == [
        ("function_call", call_id, "completed")
    ]
    # The call came as OpenAI sends one: its item, its arguments streamed, the item done.
    reply_events = [e for e in log.events if e.get("response_id") == response_id]
    added = next(e for e in reply_events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "function_call" and added["item"]["id"] == call_item_id
    deltas = "".join(
        e["delta"] for e in reply_events if e["type"] == "response.function_call_arguments.delta"
    )
    assert json.loads(deltas) == {"city": "Boston"}
    assert any(
        e["type"] == "response.output_item.done" and e["item"]["id"] == call_item_id for e in reply_events
    )
    # No audio was made for a reply that only calls a function.
    assert not [e for e in reply_events if e["type"] == "response.output_audio.delta"]

    await conn.conversation.item.create(
        item={
            "type": "function_call_output",
            "call_id": call_id,
            "output": json.dumps({"forecast": "sunny", "high_fahrenheit": 72}),
        }
    )
    i_item, item_added = await log.wait_for("conversation.item.added", 10, start=i_args)
    while item_added["item"]["type"] != "function_call_output":
        i_item, item_added = await log.wait_for("conversation.item.added", 10, start=i_item + 1)
    assert item_added["previous_item_id"] == call_item_id
    await conn.response.create()
    i_next, created = await log.wait_for("response.created", 10, start=i_item)
    next_id = created["response"]["id"]
    _, spoken = await log.wait_for("response.output_audio_transcript.done", 60, start=i_next)
    assert "sunny" in spoken["transcript"] and "72" in spoken["transcript"], spoken
    _, next_done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == next_id, 60, start=i_next
    )
    assert next_done["response"]["status"] == "completed"
    assert next_done["response"]["usage"]["output_audio_seconds"] > 0.5
    audio = [e for e in log.events[i_next:] if e["type"] == "response.output_audio.delta"]
    assert len(audio) > 5
    for event in log.events:
        validate_server_event(event)


async def test_realtime_agent_runs_its_function_tool_and_speaks_the_result(gateway: Gateway) -> None:
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather forecast for a city."""
        calls.append(city)
        return f"It will be sunny and 72 degrees in {city}."

    agent = RealtimeAgent(name="Assistant", instructions="Answer briefly.", tools=[get_weather])
    model_config = RealtimeModelConfig(
        api_key="unused", url=f"{gateway.ws_url}/v1/realtime?model=gpt-realtime"
    )
    events: list[Any] = []
    async with asyncio.timeout(120):
        session = await RealtimeRunner(agent).run(model_config=model_config)
        async with session:
            speaker = asyncio.create_task(
                stream_audio(None, weather_turn(), send=session.send_audio, realtime=True)
            )
            tool_done = False
            async for event in session:
                events.append(event)
                tool_done = tool_done or event.type == "tool_end"
                problems = [e for e in events if e.type == "error"]
                if problems:
                    break
                if (
                    tool_done
                    and event.type == "raw_model_event"
                    and event.data.type == "raw_server_event"
                    and event.data.data.get("type") == "response.done"
                    and any(o.get("type") == "message" for o in event.data.data["response"]["output"])
                ):
                    break
            await speaker

    assert not [e for e in events if e.type == "error"], [
        str(e.error)[:400] for e in events if e.type == "error"
    ]
    starts = [e for e in events if e.type == "tool_start"]
    assert [s.tool.name for s in starts] == ["get_weather"]
    assert json.loads(starts[0].arguments) == {"city": "Boston"}
    assert calls == ["Boston"]
    raw = [e.data.data for e in events if e.type == "raw_model_event" and e.data.type == "raw_server_event"]
    spoken = [e["transcript"] for e in raw if e["type"] == "response.output_audio_transcript.done"]
    assert any("sunny" in text and "72" in text for text in spoken), spoken


async def test_an_out_of_band_reply_runs_beside_the_reply_in_progress(gateway: Gateway) -> None:
    async with websockets.connect(f"{gateway.ws_url}/v1/realtime?model=gpt-realtime") as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 10)
            await ws.send(
                json.dumps(
                    {
                        "type": "session.update",
                        "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                    }
                )
            )
            await log.wait_for("session.updated", 10)
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [
                                {
                                    "type": "input_text",
                                    "text": "Please read me the weather report for Tuesday morning.",
                                }
                            ],
                        },
                    }
                )
            )
            await ws.send(json.dumps({"type": "response.create"}))
            _, main = await log.wait_for("response.created", 10)
            main_id = main["response"]["id"]
            await log.wait_for("response.output_audio.delta", 30)
            # While the caller hears that reply, ask for a text classification outside the conversation.
            await ws.send(
                json.dumps(
                    {
                        "type": "response.create",
                        "response": {
                            "conversation": "none",
                            "output_modalities": ["text"],
                            "metadata": {"purpose": "classify"},
                            "input": [
                                {
                                    "type": "message",
                                    "role": "user",
                                    "content": [{"type": "input_text", "text": "Is this caller happy?"}],
                                }
                            ],
                        },
                    }
                )
            )
            _, side = await log.wait_for(
                lambda e: e["type"] == "response.created" and e["response"]["id"] != main_id, 10
            )
            side_id = side["response"]["id"]
            assert side["response"]["metadata"] == {"purpose": "classify"}
            assert side["response"]["conversation_id"] is None
            _, side_done = await log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["id"] == side_id, 30
            )
            assert side_done["response"]["status"] == "completed"
            assert side_done["response"]["metadata"] == {"purpose": "classify"}
            side_items = {o["id"] for o in side_done["response"]["output"]}
            assert side_items and all(o["type"] == "message" for o in side_done["response"]["output"])
            # Meanwhile the conversation's reply goes on to the end.
            _, main_done = await log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["id"] == main_id, 60
            )
            assert main_done["response"]["status"] == "completed"
            # The side reply is in no conversation: never added, not retrievable.
            added = {e["item"]["id"] for e in log.events if e["type"] == "conversation.item.added"}
            assert not side_items & added
            item_id = next(iter(side_items))
            await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": item_id}))
            _, error = await log.wait_for("error", 10)
            assert error["error"]["code"] == "item_retrieve_invalid_item_id"
            for event in log.events:
                validate_server_event(event)
        finally:
            await log.aclose()
