"""The Responses delegation backend: a Live dialect's rounds sent to a real chat endpoint on loopback.

The dialect is the real one (``LiveDialect`` with a backend); the endpoint is the OpenAI-compatible
test server of ``tests/engine/embedded/chat_server.py``, which streams chunks as OpenAI does.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from duplex_gateway.config import load_settings
from duplex_gateway.dialects.live import LiveDialect
from duplex_gateway.dialects.live_backend import BackendFailed, BackendFinished, BackendRequest
from duplex_gateway.engine.embedded.chat_llm import ChatSettings
from duplex_gateway.host.delegation import DelegatingDialect, Delegator, ResponsesBackend, backend_settings
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from tests.engine.embedded.chat_server import (
    MODEL_ID,
    ChatServer,
    Reply,
    ScriptedToolCall,
    running_chat_server,
)

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


_ENDS = ("response.completed", "response.incomplete", "response.failed")


@pytest.fixture
def server() -> Iterator[ChatServer]:
    with running_chat_server() as running:
        yield running


def _dialect() -> LiveDialect:
    dialect = LiveDialect(session_id="sess_1", expires_at=0, max_message_bytes=1 << 20, backend=MODEL_ID)
    start = {
        "type": "session.start",
        "session": {
            "model": "gpt-live-1",
            "instructions": "Be brief.",
            "delegation": {"type": "responses", "responses": {"model": "gpt-5.5", "tools": [WEATHER]}},
        },
    }
    dialect.parse(json.dumps(start))
    dialect.render(ev.InputTranscriptionCompleted(item_id="item_1", transcript="Weather in Paris?"), seq=1)
    return dialect


def _engine_delegates(dialect: LiveDialect, call_id: str = "call_engine") -> list[dict[str, Any]]:
    """The voice engine calls its one function: the delegation opens."""
    item = ev.ConversationItem(
        id="item_fc",
        role="assistant",
        kind="function_call",
        call_id=call_id,
        name="delegate_get_weather",
        arguments="{}",
    )
    frame = dialect.render(ev.OutputItemDone(response_id="resp_engine", output_index=0, item=item), seq=2)
    assert frame is not None
    return [json.loads(frame), *(json.loads(f) for f in dialect.own_frames())]


class _Run:
    """A dialect, a delegator over a backend at ``server``, and what they produced."""

    def __init__(self, backend: ResponsesBackend, dialect: LiveDialect, **kwargs: Any) -> None:
        self.dialect = dialect
        self.frames: list[dict[str, Any]] = []
        self.commands: list[cmd.Command] = []
        self.done = asyncio.Event()
        self._ended = 0
        assert isinstance(dialect, DelegatingDialect)
        self.delegator = Delegator(backend, dialect, delivered=self._delivered, name="sess_1", **kwargs)

    def _delivered(self) -> None:
        self.frames.extend(json.loads(f) for f in self.dialect.own_frames())
        self.commands.extend(self.dialect.take_backend_commands())
        if sum(t in _ENDS for t in self.nested()) > self._ended:
            self.done.set()

    async def until_done(self) -> None:
        """Until the round in flight ends (completed, incomplete or failed)."""
        await asyncio.wait_for(self.done.wait(), 10)
        self.done.clear()
        self._ended = sum(t in _ENDS for t in self.nested())

    def nested(self) -> list[str]:
        return [f["event"]["type"] for f in self.frames if f["type"] == "response.event"]


def _settings(server: ChatServer, **extra: Any) -> ChatSettings:
    return ChatSettings(url=server.url, model=MODEL_ID, **extra)


async def test_a_backend_answer_streams_to_the_client_and_goes_to_the_engine(server: ChatServer) -> None:
    server.script(Reply(text="Paris is sunny today, nineteen degrees."))
    backend = await ResponsesBackend.connect(_settings(server))
    assert backend is not None
    dialect = _dialect()
    opened = _engine_delegates(dialect)
    assert opened[0]["type"] == "session.delegation.created"
    run = _Run(backend, dialect)
    try:
        run.delegator.poll()
        await run.until_done()
    finally:
        await run.delegator.close()
        await backend.aclose()
    assert run.nested()[0] == "response.output_item.added"
    assert run.nested()[-1] == "response.completed"
    text = "".join(
        f["event"]["delta"] for f in run.frames if f["event"]["type"] == "response.output_text.delta"
    )
    assert text == "Paris is sunny today, nineteen degrees."
    usage = run.frames[-1]["event"]["response"]["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (17, 9)
    (answer,) = run.commands
    assert isinstance(answer, cmd.ContextAppend)
    assert (answer.channel, answer.delegation_id, answer.content) == (
        "commentary",
        "call_engine",
        "Paris is sunny today, nineteen degrees.",
    )
    body = server.chat_requests[0].body
    assert body["model"] == MODEL_ID  # not the client's gpt-5.5: the endpoint's own model
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["messages"][-1] == {"role": "user", "content": "Weather in Paris?"}
    assert [t["function"]["name"] for t in body["tools"]] == ["get_weather"]


async def test_a_backend_function_call_is_the_clients_and_its_output_starts_the_next_round(
    server: ChatServer,
) -> None:
    server.script(
        Reply(
            tool_calls=(ScriptedToolCall(name="get_weather", arguments='{"city": "Paris"}', id="call_b1"),)
        ),
        Reply(text="Sunny, nineteen degrees."),
    )
    backend = await ResponsesBackend.connect(_settings(server))
    assert backend is not None
    dialect = _dialect()
    _engine_delegates(dialect)
    run = _Run(backend, dialect)
    try:
        run.delegator.poll()
        await run.until_done()
        call = next(
            f["event"]["item"] for f in run.frames if f["event"]["type"] == "response.output_item.done"
        )
        assert (call["type"], call["call_id"], call["name"]) == ("function_call", "call_b1", "get_weather")
        assert json.loads(call["arguments"]) == {"city": "Paris"}
        assert not run.commands  # nothing for the engine until the backend answers
        output = {"type": "function_call_output", "call_id": "call_b1", "output": '{"sky": "sunny", "c": 19}'}
        assert dialect.parse(json.dumps({"type": "response.item.create", "item": output})) == ()
        assert dialect.parse(json.dumps({"type": "response.create"})) == ()
        run.frames.extend(json.loads(f) for f in dialect.own_frames())
        run.delegator.poll()
        await run.until_done()
    finally:
        await run.delegator.close()
        await backend.aclose()
    (answer,) = run.commands
    assert isinstance(answer, cmd.ContextAppend) and answer.content == "Sunny, nineteen degrees."
    second = server.chat_requests[1].body["messages"]
    assert second[-2]["role"] == "assistant"
    assert second[-2]["tool_calls"][0]["id"] == "call_b1"
    assert second[-1] == {"role": "tool", "tool_call_id": "call_b1", "content": '{"sky": "sunny", "c": 19}'}


async def test_a_backend_that_fails_is_a_failed_round_the_engine_hears_of(server: ChatServer) -> None:
    server.script(Reply(status=503, error="overloaded"))
    backend = await ResponsesBackend.connect(_settings(server))
    assert backend is not None
    dialect = _dialect()
    _engine_delegates(dialect)
    run = _Run(backend, dialect)
    try:
        run.delegator.poll()
        await run.until_done()
    finally:
        await run.delegator.close()
        await backend.aclose()
    failed = run.frames[-1]["event"]
    assert failed["type"] == "response.failed"
    assert "503" in failed["response"]["error"]["message"]
    (answer,) = run.commands
    assert isinstance(answer, cmd.ContextAppend)
    assert answer.content.startswith("The assistant backend could not complete this request")


async def test_a_stalled_backend_fails_its_round_at_the_deadline(server: ChatServer) -> None:
    server.script(Reply(text="Let me think", stall_s=30))
    backend = await ResponsesBackend.connect(_settings(server))
    assert backend is not None
    dialect = _dialect()
    _engine_delegates(dialect)
    run = _Run(backend, dialect, timeout_s=0.5)
    try:
        run.delegator.poll()
        await run.until_done()
    finally:
        await run.delegator.close()
        await backend.aclose()
    assert run.frames[-1]["event"]["type"] == "response.failed"
    assert "did not finish within 0.5 s" in run.frames[-1]["event"]["response"]["error"]["message"]
    assert await server.wait_disconnected()  # the stalled request was closed


async def test_closing_gives_up_the_rounds_in_flight(server: ChatServer) -> None:
    server.script(Reply(text="A long answer", stall_s=30))
    backend = await ResponsesBackend.connect(_settings(server))
    assert backend is not None
    dialect = _dialect()
    _engine_delegates(dialect)
    run = _Run(backend, dialect)
    run.delegator.poll()
    assert await server.wait_stalling()
    await run.delegator.close()
    await backend.aclose()
    assert await server.wait_disconnected()
    assert not run.commands and "response.failed" not in run.nested()  # the session is gone: nothing more


async def test_the_endpoints_first_model_serves_when_none_is_configured(server: ChatServer) -> None:
    backend = await ResponsesBackend.connect(ChatSettings(url=server.url, model=""))
    assert backend is not None
    try:
        assert backend.model == MODEL_ID
    finally:
        await backend.aclose()


async def test_an_unreachable_endpoint_naming_no_model_leaves_the_engine_to_do_the_work() -> None:
    assert await ResponsesBackend.connect(ChatSettings(url="http://127.0.0.1:9/v1", model="")) is None


def test_the_backend_is_live_responses_else_the_embedded_engines_model() -> None:
    assert backend_settings(load_settings(None)) is None
    own = backend_settings(load_settings(None, **{"live.responses.url": "http://127.0.0.1:8001/v1"}))
    assert own is not None and own.url == "http://127.0.0.1:8001/v1"
    shared = backend_settings(
        load_settings(
            None, **{"engine.name": "embedded", "engine.embedded.llm.url": "http://127.0.0.1:8002/v1"}
        )
    )
    assert shared is not None and shared.url == "http://127.0.0.1:8002/v1"
    other_engine = load_settings(
        None, **{"engine.name": "echo", "engine.embedded.llm.url": "http://127.0.0.1:8002/v1"}
    )
    assert backend_settings(other_engine) is None


def test_a_round_request_is_typed_as_the_dialect_made_it() -> None:
    dialect = _dialect()
    _engine_delegates(dialect)
    (request,) = dialect.take_backend_requests()
    assert isinstance(request, BackendRequest)
    assert [m.role for m in request.messages] == ["system", "user"]
    assert not isinstance(request, BackendFailed | BackendFinished)
