"""Pipecat's ``OpenAILiveLLMService`` under Responses delegation, the gateway's backend a real chat server.

The gateway runs the embedded engine with ``live.responses.url`` naming an OpenAI-compatible
chat endpoint (the fake one of :mod:`tests.engine.embedded.chat_server`, in its own process).
The engine gets one function, ``delegate``; when the caller's words call it, the backend model
does the work: its function call goes to Pipecat, which runs the function it registered and
answers, and the backend's next answer comes back to the engine, which speaks it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip(
    "pipecat", reason="Pipecat runs in .venv-peers (make test runs it there, where it must be installed)"
)

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import LLMContextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService
from pipecat.workers.runner import WorkerRunner

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.peers.chat_backend import ChatBackend, running_chat_backend
from tests.peers.conftest import gateway_python
from tests.peers.test_live_pipecat import (
    REPLY_TIMEOUT_S,
    Microphone,
    TappedLiveService,
    _assert_started_without_error,
    _speech,
    _until,
)

pytestmark = pytest.mark.e2e

#: The fake server's one model (:data:`tests.engine.embedded.chat_server.MODEL_ID`).
BACKEND_MODEL = "test-chat-model"
CALL_ID = "call_weather_1"
ARGUMENTS = {"day": "Tuesday"}
#: What Pipecat's function returns, and what the backend then answers.
FORECAST = {"forecast": "sunny, 19 C"}
ANSWER = "Tuesday will be sunny, nineteen degrees."


@pytest.fixture
def backend() -> Iterator[ChatBackend]:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "get_weather_report", "arguments": json.dumps(ARGUMENTS), "id": CALL_ID}]},
        {"text": ANSWER},
    ]
    with running_chat_backend(gateway_python(), replies) as server:
        yield server


@pytest.fixture
def backend_gateway(gateway_factory: GatewayFactory, backend: ChatBackend) -> Gateway:
    config = {
        "server": {"web_demo": False},
        "engine": {"name": "embedded"},
        "live": {"responses": {"url": backend.url, "model": BACKEND_MODEL}},
    }
    return gateway_factory.start(config, name="live-backend")


async def _until_delegated(service: TappedLiveService, run: asyncio.Task[Any]) -> bool:
    """Until the engine delegates (True), or has answered by itself instead (False, as its reply ends)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(REPLY_TIMEOUT_S):
        while not service.times("session.delegation.created"):
            if run.done():
                run.result()
            audio = service.times("session.output_audio.delta")
            if audio and loop.time() - max(audio) > 2.0:
                return False
            await asyncio.sleep(0.05)
    return True


def _spoken(service: TappedLiveService) -> str:
    return "".join(m["delta"] for _, m in service.received if m["type"] == "session.output_transcript.delta")


def _envelopes(service: TappedLiveService) -> list[tuple[float, dict[str, Any]]]:
    return [(t, m["event"]) for t, m in service.received if m["type"] == "response.event"]


def _spoken_after_completed(service: TappedLiveService) -> str:
    """The engine's words after the client answered the backend's call."""
    if "response.create" not in service.sent:
        return ""
    done = [t for t, e in _envelopes(service) if e["type"] == "response.output_item.done"]
    if not done:
        return ""
    return "".join(
        m["delta"]
        for t, m in service.received
        if m["type"] == "session.output_transcript.delta" and t > done[0]
    )


#: The function's description as Pipecat's docs would write it, and one that also names the words
#: the caller says ("Tuesday morning").
PLAIN = "Get the weather report for a day"
WORDY = "Get the weather report for a day, such as Tuesday morning"


@pytest.mark.parametrize("description", [PLAIN, WORDY], ids=["plain-description", "wordy-description"])
async def test_a_spoken_question_is_delegated_to_the_backend_its_call_runs_in_pipecat_and_its_answer_is_spoken(
    backend_gateway: Gateway, backend: ChatBackend, description: str
) -> None:
    """Pipecat at its defaults but for Responses delegation (the mode in which it runs functions)."""
    calls: list[dict[str, Any]] = []

    async def fetch_weather_report(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await params.result_callback(FORECAST)

    weather = FunctionSchema(
        name="get_weather_report",
        description=description,
        properties={"day": {"type": "string", "description": "The day of the week"}},
        required=["day"],
    )
    service = TappedLiveService(
        api_key="sk-test",
        base_url=f"{backend_gateway.ws_url}/v1/live/sessions",
        delegation=OpenAILiveLLMService.ResponsesDelegation(
            settings=OpenAIResponsesLLMService.Settings(model="gpt-5.4-mini")
        ),
    )
    service.register_function("get_weather_report", fetch_weather_report)
    worker = PipelineWorker(Pipeline([service]))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    mic = Microphone(worker)
    listening: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    try:
        context = LLMContext(messages=[], tools=ToolsSchema(standard_tools=[weather]))
        await worker.queue_frames([LLMContextFrame(context)])
        await _until(service, "session.started", 30.0, run)
        listening = asyncio.create_task(mic.run())
        mic.say(_speech())
        if not await _until_delegated(service, run):
            raise AssertionError(f"the engine answered by itself, not delegating: {_spoken(service)!r}")
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while "response.create" not in service.sent:
                if run.done():
                    run.result()
                await asyncio.sleep(0.05)
        # The engine speaks the backend's answer: wait for its audio to stop coming (its words come
        # as their audio plays, so a sentence after a long one comes seconds after the first).
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while not _spoken_after_completed(service) or (
                loop.time() - max(service.times("session.output_audio.delta")) < 1.5
            ):
                if run.done():
                    run.result()
                await asyncio.sleep(0.05)
    finally:
        if listening is not None:
            listening.cancel()
        await worker.cancel()
        async with asyncio.timeout(30):
            await run

    _assert_started_without_error(service)
    infos = [m for _, m in service.received if m["type"] == "info"]
    assert any(m.get("code") == "responses_delegation_backend" for m in infos), infos
    created = [m for _, m in service.received if m["type"] == "session.delegation.created"]
    assert len(created) == 1 and created[0]["delegation"]["target"] == "responses", created

    envelopes = [e for _, e in _envelopes(service)]
    called = [e["item"] for e in envelopes if e["type"] == "response.output_item.done"]
    function_calls = [item for item in called if item.get("type") == "function_call"]
    assert [(c["name"], c["call_id"]) for c in function_calls] == [("get_weather_report", CALL_ID)], envelopes
    assert "response.completed" in [e["type"] for e in envelopes], envelopes
    # Pipecat ran its function with the backend's arguments, and answered with its output.
    assert calls == [ARGUMENTS], calls
    assert service.sent.index("response.item.create") < service.sent.index("response.create")

    words = _spoken_after_completed(service).lower()
    assert "sunny" in words and "nineteen" in words, words

    _assert_backend_rounds(backend.chat_bodies())


def _assert_backend_rounds(bodies: list[Any]) -> None:
    """Two rounds: the caller's request with Pipecat's function, then the same with the call and its output."""
    assert len(bodies) == 2, bodies
    first, second = bodies
    for body in bodies:
        assert body["model"] == BACKEND_MODEL, body
        names = [t["function"]["name"] for t in body.get("tools") or []]
        assert names == ["get_weather_report"], body
    heard = " ".join(str(m.get("content") or "") for m in first["messages"] if m["role"] == "user")
    assert "weather" in heard.lower(), first["messages"]
    # The second round is the first one's conversation, then the call and its output.
    assert second["messages"][: len(first["messages"])] == first["messages"], second["messages"]
    call, output = second["messages"][len(first["messages"]) :]
    assert call["role"] == "assistant", call
    assert [
        (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in call["tool_calls"]
    ] == [(CALL_ID, "get_weather_report", ARGUMENTS)], call
    assert output["role"] == "tool" and output["tool_call_id"] == CALL_ID, output
    assert json.loads(output["content"]) == FORECAST, output
