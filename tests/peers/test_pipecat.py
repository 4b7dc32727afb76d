"""Pipecat's ``OpenAIRealtimeLLMService`` at its defaults, in a ``Pipeline``, against a real gateway.

When Pipecat sets up a conversation it sends ``session.update`` and ``response.create``
back to back. OpenAI's server answers a connection's events in order, so the update's
``session.updated`` comes before the ``response.created`` of the response asked for
after it (and that response is made with the updated session). The wire is recorded
as Pipecat's own WebSocket sends and receives it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

pytest.importorskip(
    "pipecat", reason="Pipecat runs in .venv-peers (make test runs it there, where it must be installed)"
)

from pipecat.frames.frames import InputAudioRawFrame, LLMContextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from tests.e2e.helpers import Gateway, GatewayFactory

pytestmark = pytest.mark.e2e

#: The embedded engine's first reply loads its models on two cores.
SETUP_TIMEOUT_S = 60.0
#: The caller's microphone, open from the start: 20 ms frames of 24 kHz audio, as a transport
#: hands them to the service (here from a file, as fast as the pipeline takes them).
MIC_RATE = 24_000
MIC_FRAME_MS = 20
MIC_S = 3


class WireTap:
    """A WebSocket connection that notes, in order, the type of every event sent and received."""

    def __init__(self, ws: Any, wire: list[tuple[str, str]]) -> None:
        self._ws = ws
        self._wire = wire

    async def send(self, message: str) -> None:
        self._wire.append(("sent", json.loads(message)["type"]))
        await self._ws.send(message)

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._received()

    async def _received(self) -> AsyncIterator[str | bytes]:
        async for message in self._ws:
            self._wire.append(("received", json.loads(message)["type"]))
            yield message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)


class TappedRealtimeService(OpenAIRealtimeLLMService):
    """Pipecat's service unchanged, its socket tapped from the first event it reads."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wire: list[tuple[str, str]] = []

    async def _receive_task_handler(self) -> None:
        # Nothing is sent before the receive task starts: the first session.update answers
        # session.created, which this task reads.
        self._websocket = WireTap(self._websocket, self.wire)
        await super()._receive_task_handler()


def _received(wire: list[tuple[str, str]]) -> list[str]:
    return [kind for direction, kind in wire if direction == "received"]


def _sent(wire: list[tuple[str, str]]) -> list[str]:
    return [kind for direction, kind in wire if direction == "sent"]


def _microphone() -> list[InputAudioRawFrame]:
    frame = bytes(MIC_RATE * MIC_FRAME_MS // 1000 * 2)  # a quiet room
    return [
        InputAudioRawFrame(audio=frame, sample_rate=MIC_RATE, num_channels=1)
        for _ in range(MIC_S * 1000 // MIC_FRAME_MS)
    ]


async def _set_up_conversation(gateway: Gateway) -> list[tuple[str, str]]:
    llm = TappedRealtimeService(api_key="sk-test", base_url=f"{gateway.ws_url}/v1/realtime")
    worker = PipelineWorker(Pipeline([llm]))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    try:
        context = LLMContext(messages=[{"role": "user", "content": "Say hello."}])
        await worker.queue_frames([LLMContextFrame(context), *_microphone()])
        async with asyncio.timeout(SETUP_TIMEOUT_S):
            while "response.created" not in _received(llm.wire):
                if run.done():
                    run.result()  # the pipeline ended: say why
                    raise AssertionError(f"the pipeline ended before a response was created: {llm.wire}")
                await asyncio.sleep(0.02)
    finally:
        await worker.cancel()
        async with asyncio.timeout(30):
            await run
    return llm.wire


def _assert_answered_in_order(wire: list[tuple[str, str]]) -> None:
    sent, received = _sent(wire), _received(wire)
    assert "response.create" in sent, wire
    updates = sent[: sent.index("response.create")].count("session.update")
    assert updates >= 2, wire  # the one answering session.created, and the conversation's own
    before = received[: received.index("response.created")]
    assert before.count("session.updated") == updates, wire
    assert "error" not in received, wire


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start({"server": {"web_demo": False}}, name="pipecat-echo")


@pytest.fixture(scope="module")
def embedded_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    config = {"server": {"web_demo": False}, "engine": {"name": "embedded"}}
    return module_gateway_factory.start(config, name="pipecat-embedded")


async def test_conversation_setup_is_answered_in_order_by_the_echo_engine(echo_gateway: Gateway) -> None:
    _assert_answered_in_order(await _set_up_conversation(echo_gateway))


async def test_conversation_setup_is_answered_in_order_by_the_embedded_engine(
    embedded_gateway: Gateway,
) -> None:
    _assert_answered_in_order(await _set_up_conversation(embedded_gateway))
