"""The embedded engine answering with a language model: a real OpenAI-compatible SSE server on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.engine import port
from duplex_gateway.engine.embedded import ChatSettings, EmbeddedEngine
from duplex_gateway.engine.embedded.llm_brain import LlmBrain
from duplex_gateway.engine.registry import build_engine
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.engine.embedded.chat_server import (
    MODEL_ID,
    ChatServer,
    Reply,
    ScriptedToolCall,
    running_chat_server,
)
from tests.engine.embedded.conftest import FIXED_NOW
from tests.engine.embedded.test_chat_llm import free_port
from tests.engine.embedded.test_engine import audio_bytes, opened, read_until, reply_text
from tests.engine.embedded.test_engine_tools import WEATHER, done, until_done


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with running_chat_server() as running:
        yield running


@asynccontextmanager
async def llm_engine(url: str, *, pace: float = 0.0, **chat: object) -> AsyncIterator[EmbeddedEngine]:
    """An engine with a language model; its models are the process's shared ones, so it starts at once."""
    settings = ChatSettings(url=url, model="", timeout_s=3.0, **chat)  # type: ignore[arg-type]
    engine = EmbeddedEngine(
        pace=pace,
        lead_ms=300,
        partials=False,
        whisper_cpu_threads=2,
        tts_threads=2,
        clock=lambda: FIXED_NOW,
        chat=settings,
    )
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


async def test_a_streamed_reply_is_spoken_sentence_by_sentence(server: ChatServer) -> None:
    text = "Hello there! The forecast says 3.5 degrees. Anything else?"
    server.script(Reply(text=text, usage=(40, 12)))
    async with llm_engine(server.url) as engine, opened(engine, "llm_text") as session:
        assert isinstance(engine.brain, LlmBrain)
        await session.add_item(item_id="item_1", role="user", text="How cold is it?")
        await session.create_response(response_id="resp_1", instructions=None)
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert reply_text(seen) == text
    transcripts = [e.delta for e in seen if isinstance(e, port.EngineTranscript)]
    assert transcripts == ["Hello there!", " The forecast says 3.5 degrees.", " Anything else?"]
    assert audio_bytes(seen, "resp_1") > 0
    timings = next(i for i, e in enumerate(seen) if isinstance(e, port.EngineTimings))
    assert timings < next(i for i, e in enumerate(seen) if isinstance(e, port.EngineAudio))
    assert seen[-1] == port.EngineResponseDone(response_id="resp_1", input_tokens=40, output_tokens=12)
    # No model was configured: the engine took the one the endpoint lists.
    assert server.chat_requests[0].body["model"] == MODEL_ID


async def test_a_tool_call_round_trip_carries_the_conversation(server: ChatServer) -> None:
    arguments = '{"city": "Paris"}'
    server.script(
        Reply(tool_calls=(ScriptedToolCall(name="get_current_weather", arguments=arguments, id="call_0"),)),
        Reply(text="It is sunny in Paris."),
    )
    config = SessionConfig(instructions="You are a weather line. Be brief.", tools=(WEATHER,))
    async with llm_engine(server.url) as engine, opened(engine, "llm_tools") as session:
        await session.update(config)
        await session.add_item(item_id="u1", role="user", text="Hello")
        await session.add_item(item_id="a1", role="assistant", text="Hi! Which city?")
        await session.add_item(item_id="u2", role="user", text="What's the weather in Paris?")
        await session.create_response(response_id="resp_call", instructions=None)
        called = await read_until(session.events(), port.EngineResponseDone)
        call = next(e for e in called if isinstance(e, port.EngineFunctionCall))
        await session.add_function_output(item_id="o1", call_id=call.call_id, output='{"sky": "sunny"}')
        await session.create_response(response_id="resp_said", instructions="Answer in one sentence.")
        said = await read_until(session.events(), port.EngineResponseDone)
    deltas = [e for e in called if isinstance(e, port.EngineFunctionCallDelta)]
    assert deltas and all(d.call_id == call.call_id and d.name == "get_current_weather" for d in deltas)
    assert "".join(d.delta for d in deltas) == arguments == call.arguments
    assert called.index(deltas[-1]) < called.index(call)
    assert called[-1] == port.EngineResponseDone(response_id="resp_call", input_tokens=17, output_tokens=9)
    assert audio_bytes(called) == 0 and reply_text(said) == "It is sunny in Paris."
    first, second = (request.body for request in server.chat_requests)
    assert first["messages"] == [
        {"role": "system", "content": "You are a weather line. Be brief."},
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "Hi! Which city?"},
        {"role": "user", "content": "What's the weather in Paris?"},
    ]
    assert [tool["function"]["name"] for tool in first["tools"]] == ["get_current_weather"]
    assert first["tool_choice"] == "auto"
    # The second request: the reply's own instructions, the call and its output after the history.
    assert second["messages"][0] == {"role": "system", "content": "Answer in one sentence."}
    assert second["messages"][-2:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call.call_id,
                    "type": "function",
                    "function": {"name": "get_current_weather", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": call.call_id},
    ]


async def test_a_reply_the_client_deleted_leaves_the_models_context(server: ChatServer) -> None:
    """The gateway names the reply's item; the engine finds it by the reply's id."""
    server.script(Reply(text="The first answer."), Reply(text="The second answer."))
    async with llm_engine(server.url) as engine, opened(engine, "llm_delete") as session:
        await session.add_item(item_id="u1", role="user", text="First question?")
        await session.create_response(response_id="resp_1", instructions=None)
        await read_until(session.events(), port.EngineResponseDone)
        await session.add_item(item_id="u2", role="user", text="Second question?")
        await session.delete_item("item_the_gateway_named", response_id="resp_1")
        await session.create_response(response_id="resp_2", instructions=None)
        said = await read_until(session.events(), port.EngineResponseDone)
    assert reply_text(said) == "The second answer."
    first, second = (request.body for request in server.chat_requests)
    chat = [(m["role"], m["content"]) for m in second["messages"] if m["role"] != "system"]
    assert chat == [("user", "First question?"), ("user", "Second question?")]
    assert ("user", "First question?") in [(m["role"], m["content"]) for m in first["messages"]]


async def test_barge_in_mid_stream_closes_the_models_stream(server: ChatServer) -> None:
    server.script(Reply(text="This is the first sentence. And then", stall_s=30))
    async with llm_engine(server.url, pace=1.0) as engine, opened(engine, "llm_barge") as session:
        await session.add_item(item_id="item_b", role="user", text="Tell me a long story.")
        await session.create_response(response_id="resp_b", instructions=None)
        events = session.events()
        seen: list[port.EngineEvent] = []
        while not any(isinstance(e, port.EngineAudio) for e in seen):
            seen.append(await asyncio.wait_for(anext(events), 20))
        assert await server.wait_stalling()
        stopped = time.perf_counter()
        await session.barge_in()
        elapsed = time.perf_counter() - stopped
        rest = await read_until(events, port.EngineResponseDone, timeout=2.0)
        assert await server.wait_disconnected(5.0)
    assert elapsed < 1.0
    assert rest[-1] == port.EngineResponseDone(response_id="resp_b", status="cancelled")
    assert server.completed == 0 and server.disconnects == 1


async def test_a_stream_that_breaks_after_output_fails_the_reply(server: ChatServer) -> None:
    server.script(Reply(text="Here is part of it. More", raw=("this is not json",)))
    async with llm_engine(server.url) as engine, opened(engine, "llm_broken") as session:
        await session.add_item(item_id="item_x", role="user", text="Go on.")
        await session.create_response(response_id="resp_x", instructions=None)
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert reply_text(seen) == "Here is part of it."
    errors = [e for e in seen if isinstance(e, port.EngineError)]
    assert len(errors) == 1 and not errors[0].fatal and "not JSON" in errors[0].message
    assert seen[-1] == port.EngineResponseDone(response_id="resp_x", status="failed", reason="engine_error")


async def test_an_unreachable_endpoint_at_start_leaves_the_offline_responder(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with caplog.at_level(logging.WARNING, logger="duplex_gateway.engine.embedded"):
        async with llm_engine(url) as engine, opened(engine, "llm_down") as session:
            assert not isinstance(engine.brain, LlmBrain)
            await session.add_item(item_id="item_d", role="user", text="What time is it?")
            await session.create_response(response_id="resp_d", instructions=None)
            seen = await read_until(session.events(), port.EngineResponseDone)
    assert reply_text(seen) == "You said: what time is it? It's 3:15 PM UTC."
    lines = [r.getMessage() for r in caplog.records if "LLM" in r.getMessage()]
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"LLM endpoint {url} unreachable (")
    assert lines[0].endswith("); answering with the offline responder")


async def test_a_refused_request_is_answered_offline(
    server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    server.script(Reply(status=401, error="Incorrect API key provided: sk-wrong-key."))
    async with llm_engine(server.url, api_key="sk-wrong-key") as engine, opened(engine, "llm_401") as session:
        with caplog.at_level(logging.WARNING, logger="duplex_gateway.engine.embedded"):
            await session.add_item(item_id="item_k", role="user", text="What day is it?")
            await session.create_response(response_id="resp_k", instructions=None)
            seen = await read_until(session.events(), port.EngineResponseDone)
        # The next turn asks the model again: the failure was this turn's only.
        await session.add_item(item_id="item_k2", role="user", text="Thanks")
        await session.create_response(response_id="resp_k2", instructions=None)
        again = await until_done(session, "resp_k2")
    assert reply_text(seen) == "You said: what day is it? Today is Tuesday, May 6, 2025."
    assert done(seen, "resp_k").status == "completed" and not any(
        isinstance(e, port.EngineError) for e in seen
    )
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "HTTP 401" in warnings[0] and "offline responder" in warnings[0]
    assert "sk-wrong-key" not in warnings[0]
    assert reply_text(again) == "The model heard: Thanks."
    assert json.dumps(server.chat_requests[-1].body).count("What day is it?") == 1


def test_the_registry_builds_the_model_settings_with_the_key_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    llm: dict[str, Any] = {
        "engine.embedded.llm": {
            "url": "http://127.0.0.1:8080/v1",
            "api_key_env": "TEST_LLM_KEY",
            "max_tokens": 200,
            "temperature": 0.3,
        }
    }
    monkeypatch.setenv("TEST_LLM_KEY", "sk-from-env")
    engine = build_engine(load_settings(**llm))
    assert isinstance(engine, EmbeddedEngine) and not engine.ready
    assert engine._chat_settings == ChatSettings(
        url="http://127.0.0.1:8080/v1",
        model="",
        api_key="sk-from-env",
        timeout_s=10.0,
        max_tokens=200,
        temperature=0.3,
    )
    assert isinstance(build_engine(load_settings()), EmbeddedEngine)  # no url: no model
    assert build_engine(load_settings())._chat_settings is None  # type: ignore[attr-defined]
    monkeypatch.delenv("TEST_LLM_KEY")
    with pytest.raises(ConfigError, match="TEST_LLM_KEY"):
        build_engine(load_settings(**llm))
