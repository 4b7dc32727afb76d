"""openai-agents' ``RealtimeAgent`` + ``RealtimeRunner``, at their default settings, against a real gateway.

The agents SDK is the strictest client there is: it validates every server event
against the ``openai`` SDK's models and reports each one that does not validate as an
``error`` session event, dropping it (a dropped transcription leaves the caller's
words out of its history). Its defaults ask for semantic VAD, PCM16 at 24 kHz and input
transcription. Only the URL (the SDK's ``RealtimeModelConfig.url``) points at the
gateway instead of OpenAI, with the embedded CPU engine behind it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import numpy as np
import pytest
import soxr
from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeModelConfig, RealtimeRunner
from agents.realtime.items import UserMessageItem

from duplex_gateway.engine.embedded import PiperSynthesizer
from tests.e2e.helpers import Gateway, GatewayFactory, encode, silence, speech_turn, stream_audio

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "embedded"}}, name="agents"
    )


def _user_transcripts(history: list[Any]) -> list[str]:
    return [
        part.transcript
        for item in history
        if isinstance(item, UserMessageItem)
        for part in item.content
        if getattr(part, "transcript", None)
    ]


def _raw_server_events(events: list[Any]) -> list[dict[str, Any]]:
    """The server events as the agents SDK received them, before its own validation."""
    return [e.data.data for e in events if e.type == "raw_model_event" and e.data.type == "raw_server_event"]


def _problems(events: list[Any]) -> list[str]:
    """Error events, validation failures and exceptions the SDK reported."""
    found = []
    for e in events:
        if e.type == "error":
            found.append(f"error: {e.error}"[:600])
        elif e.type == "raw_model_event" and e.data.type in ("error", "exception"):
            found.append(f"{e.data.type}: {getattr(e.data, 'error', None) or e.data.exception}"[:600])
    return found


async def test_voice_turn_through_a_realtime_agent(gateway: Gateway) -> None:
    runner = RealtimeRunner(RealtimeAgent(name="Assistant", instructions="Answer the caller briefly."))
    model_config = RealtimeModelConfig(
        api_key="unused", url=f"{gateway.ws_url}/v1/realtime?model=gpt-realtime"
    )
    events: list[Any] = []
    history: dict[str, Any] = {}  # as an app sees it, from history_updated / history_added
    reply_audio = bytearray()
    async with asyncio.timeout(90):
        session = await runner.run(model_config=model_config)
        async with session:
            speaker = asyncio.create_task(
                stream_audio(None, speech_turn(24_000), send=session.send_audio, realtime=True)
            )
            turn_ended = False
            # The transcript may come before or after the reply ends (transcription runs
            # beside the reply), so wait for both, or for the first problem.
            async for event in session:
                events.append(event)
                if event.type == "audio":
                    reply_audio += event.audio.data
                elif event.type == "history_updated":
                    history = {item.item_id: item for item in event.history}
                elif event.type == "history_added":
                    history[event.item.item_id] = event.item
                turn_ended = turn_ended or event.type == "agent_end"
                if _problems(events) or (turn_ended and _user_transcripts(list(history.values()))):
                    break
            await speaker

    assert not _problems(events), _problems(events)
    raw = _raw_server_events(events)
    completed = [e for e in raw if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert len(completed) == 1, [e["type"] for e in raw]
    # Its usage is the length of the caller's turn: the fixture's 2.9 s of speech, its prefix padding
    # and the silence that ended it.
    usage = completed[0]["usage"]
    assert usage["type"] == "duration" and 2.9 <= usage["seconds"] <= 5.0, usage
    # The caller's words, as the gateway recognised them, are in the agent's history.
    transcripts = _user_transcripts(list(history.values()))
    assert transcripts == [completed[0]["transcript"]], (transcripts, completed)
    assert "weather" in transcripts[0].lower(), transcripts
    # The reply was heard: PCM16 at 24 kHz, more than a second of it.
    assert len(reply_audio) / 2 / 24_000 > 1.0, len(reply_audio)
    done = [e for e in raw if e["type"] == "response.done"]
    assert [e["response"]["status"] for e in done] == ["completed"], done


def spoken_turn(text: str, rate: int = 24_000) -> bytes:
    """Silence, ``text`` said by the embedded engine's own Piper voice, silence: one turn for server VAD."""
    synthesizer = PiperSynthesizer.shared()
    speech = np.frombuffer(synthesizer.synthesize(text), dtype="<i2").astype(np.float32) / 32768
    return (
        silence(800, rate)
        + encode(soxr.resample(speech, synthesizer.sample_rate, rate))
        + silence(1200, rate)
    )


async def test_a_function_tool_parameter_left_unsaid_takes_its_default(gateway: Gateway) -> None:
    # @function_tool sends a strict schema: "city" is required and carries "default": "here".
    calls: list[str] = []

    @function_tool
    def get_weather(city: str = "here") -> str:
        """Get the weather for a city."""
        calls.append(city)
        return f"It is sunny and 21 degrees {city}."

    agent = RealtimeAgent(name="Assistant", instructions="Answer briefly.", tools=[get_weather])
    model_config = RealtimeModelConfig(
        api_key="unused", url=f"{gateway.ws_url}/v1/realtime?model=gpt-realtime"
    )
    events: list[Any] = []
    async with asyncio.timeout(120):
        session = await RealtimeRunner(agent).run(model_config=model_config)
        async with session:
            turn = spoken_turn("What is the weather like today?")
            speaker = asyncio.create_task(stream_audio(None, turn, send=session.send_audio, realtime=True))
            # The first reply that speaks ends the test: with the tool called, the one after its output.
            async for event in session:
                events.append(event)
                if _problems(events):
                    break
                if (
                    event.type == "raw_model_event"
                    and event.data.type == "raw_server_event"
                    and event.data.data.get("type") == "response.done"
                    and any(o.get("type") == "message" for o in event.data.data["response"]["output"])
                ):
                    break
            await speaker

    assert not _problems(events), _problems(events)
    raw = _raw_server_events(events)
    heard = [
        e["transcript"] for e in raw if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert len(heard) == 1 and "weather" in heard[0].lower() and "today" in heard[0].lower(), heard
    starts = [e for e in events if e.type == "tool_start"]
    assert [s.tool.name for s in starts] == ["get_weather"], [e["type"] for e in raw]
    assert json.loads(starts[0].arguments) == {"city": "here"}
    assert calls == ["here"]
    spoken = [e["transcript"] for e in raw if e["type"] == "response.output_audio_transcript.done"]
    assert any("sunny" in text and "21" in text for text in spoken), spoken
