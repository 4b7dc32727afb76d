"""Pipecat's ``OpenAILiveLLMService`` at its defaults, only its URL pointed at a real gateway.

The service speaks OpenAI's full-duplex Live API on ``/v1/live/sessions``. A caller's microphone
streams without pause (a Live client never commits a turn nor asks for a reply); the gateway's
turn-taking answers a spoken question, and speaking over the reply stops it. What the client
receives is recorded, with the time it arrived, as Pipecat's own WebSocket reads it.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

pytest.importorskip(
    "pipecat", reason="Pipecat runs in .venv-peers (make test runs it there, where it must be installed)"
)

from pipecat.frames.frames import InputAudioRawFrame, LLMContextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.services.openai.live.llm import OpenAILiveLLMService
from pipecat.workers.runner import WorkerRunner

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS, load_speech

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

#: The embedded engine's first reply loads its models on two cores.
REPLY_TIMEOUT_S = 90.0
MIC_RATE = 16_000
MIC_FRAME_MS = 20
#: A speaker heard over the reply stops it within this (from the onset of their speech).
BARGE_IN_BOUND_S = 0.5
#: No reply audio for this long: the reply has stopped.
QUIET_S = 0.3


class WireTap:
    """The service's WebSocket, noting every event it receives (with its arrival time) and sends."""

    def __init__(self, ws: Any, service: TappedLiveService) -> None:
        self._ws = ws
        self._service = service

    async def send(self, message: str) -> None:
        self._service.sent.append(json.loads(message)["type"])
        await self._ws.send(message)

    def __aiter__(self) -> AsyncIterator[str | bytes]:
        return self._received()

    async def _received(self) -> AsyncIterator[str | bytes]:
        loop = asyncio.get_running_loop()
        async for message in self._ws:
            self._service.received.append((loop.time(), json.loads(message)))
            yield message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._ws, name)


class TappedLiveService(OpenAILiveLLMService):
    """Pipecat's Live service unchanged, its socket tapped from the first event it reads."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.received: list[tuple[float, dict[str, Any]]] = []
        self.sent: list[str] = []

    async def _receive_task_handler(self) -> None:
        self._websocket = WireTap(self._websocket, self)
        await super()._receive_task_handler()

    def times(self, kind: str) -> list[float]:
        return [t for t, message in self.received if message["type"] == kind]

    def kinds(self) -> list[str]:
        return [message["type"] for _, message in self.received]


@dataclass
class Microphone:
    """The caller's microphone: 20 ms frames in real time, silence unless something is said."""

    worker: PipelineWorker
    queued: list[np.ndarray] = field(default_factory=list)
    #: When each utterance's first frame went out (loop time).
    said_at: list[float] = field(default_factory=list)

    def say(self, samples: np.ndarray) -> None:
        self.queued.append(samples)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        step = MIC_RATE * MIC_FRAME_MS // 1000
        silence = np.zeros(step, dtype=np.int16)
        playing: np.ndarray | None = None
        next_at = loop.time()
        while True:
            if playing is None and self.queued:
                playing = self.queued.pop(0)
                self.said_at.append(loop.time())
            if playing is not None:
                chunk, playing = playing[:step], playing[step:]
                if len(playing) == 0:
                    playing = None
                chunk = np.pad(chunk, (0, step - len(chunk)))
            else:
                chunk = silence
            frame = InputAudioRawFrame(audio=chunk.tobytes(), sample_rate=MIC_RATE, num_channels=1)
            await self.worker.queue_frames([frame])
            next_at += MIC_FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))


def _speech() -> np.ndarray:
    """The speech fixture (a question about the weather) as the microphone's PCM16."""
    return (np.clip(load_speech(MIC_RATE), -1.0, 1.0) * 32767).astype(np.int16)


async def _until(service: TappedLiveService, kind: str, timeout_s: float, run: asyncio.Task[Any]) -> float:
    async with asyncio.timeout(timeout_s):
        while not service.times(kind):
            if run.done():
                run.result()
                raise AssertionError(f"the pipeline ended before {kind}: {service.kinds()}")
            await asyncio.sleep(0.01)
    return service.times(kind)[0]


@dataclass
class Conversation:
    service: TappedLiveService
    said_at: list[float]
    first_audio_at: float


async def _converse(gateway: Gateway, *, barge_in: bool) -> Conversation:
    service = TappedLiveService(api_key="sk-test", base_url=f"{gateway.ws_url}/v1/live/sessions")
    worker = PipelineWorker(Pipeline([service]))
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    mic = Microphone(worker)
    listening: asyncio.Task[None] | None = None
    loop = asyncio.get_running_loop()
    try:
        await worker.queue_frames([LLMContextFrame(LLMContext(messages=[]))])
        await _until(service, "session.started", 30.0, run)
        listening = asyncio.create_task(mic.run())
        mic.say(_speech())
        first_audio = await _until(service, "session.output_audio.delta", REPLY_TIMEOUT_S, run)
        if barge_in:
            await asyncio.sleep(0.3)  # the caller hears the start of the reply, then speaks over it
            mic.say(_speech())
            await asyncio.sleep(SPEECH_START_MS / 1000 + 1.5)
        else:  # the reply plays out
            while loop.time() - max(service.times("session.output_audio.delta")) < 1.0:
                await asyncio.sleep(0.05)
    finally:
        if listening is not None:
            listening.cancel()
        await worker.cancel()
        async with asyncio.timeout(30):
            await run
    return Conversation(service, mic.said_at, first_audio)


def _stopped_after_onset(conversation: Conversation) -> float:
    """How long after the onset of the speech over the reply its audio kept coming (s)."""
    onset = conversation.said_at[1] + SPEECH_START_MS / 1000
    every = conversation.service.times("session.output_audio.delta")
    assert any(onset - 0.2 < t <= onset for t in every), "the reply was not playing when the caller spoke"
    deltas = [t for t in every if t > onset]
    last = onset
    for t in deltas:
        if t - last > QUIET_S:
            break
        last = t
    return last - onset


def _answered_after(conversation: Conversation) -> float:
    """From the end of the question to the first reply audio the client got (s)."""
    return conversation.first_audio_at - (conversation.said_at[0] + SPEECH_END_MS / 1000)


@pytest.fixture(scope="module")
def echo_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start({"server": {"web_demo": False}}, name="live-echo")


@pytest.fixture(scope="module")
def embedded_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    config = {"server": {"web_demo": False}, "engine": {"name": "embedded"}}
    return module_gateway_factory.start(config, name="live-embedded")


def _assert_started_without_error(service: TappedLiveService) -> None:
    kinds = service.kinds()
    assert service.sent[0] == "session.start", service.sent
    assert kinds[0] == "session.started", kinds
    assert "error" not in kinds, [m for _, m in service.received if m["type"] == "error"]


async def test_a_spoken_question_gets_spoken_audio_back_from_echo(echo_gateway: Gateway) -> None:
    conversation = await _converse(echo_gateway, barge_in=False)
    _assert_started_without_error(conversation.service)
    assert "session.input_audio.append" in conversation.service.sent
    deltas = conversation.service.times("session.output_audio.delta")
    assert len(deltas) > 10
    # Real time: the reply's audio arrives over about as long as it plays, not in a burst.
    audio_s = sum(
        len(message["delta"]) * 3 / 4 / 2 / 24_000
        for _, message in conversation.service.received
        if message["type"] == "session.output_audio.delta"
    )
    assert deltas[-1] - deltas[0] >= audio_s - 0.3


async def test_speaking_over_the_echo_reply_stops_it(echo_gateway: Gateway, record_property: Any) -> None:
    conversation = await _converse(echo_gateway, barge_in=True)
    _assert_started_without_error(conversation.service)
    stopped = _stopped_after_onset(conversation)
    logger.info("echo: the reply stopped %.0f ms after the speech over it began", stopped * 1000)
    record_property("barge_in_stop_ms", round(stopped * 1000))
    assert stopped < BARGE_IN_BOUND_S


async def test_a_spoken_question_gets_a_spoken_answer_with_its_words_from_embedded(
    embedded_gateway: Gateway, record_property: Any
) -> None:
    conversation = await _converse(embedded_gateway, barge_in=False)
    latency = _answered_after(conversation)
    logger.info("embedded: first reply audio %.0f ms after the end of the question", latency * 1000)
    record_property("first_audio_ms", round(latency * 1000))
    _assert_started_without_error(conversation.service)
    words = "".join(
        message["delta"]
        for _, message in conversation.service.received
        if message["type"] == "session.output_transcript.delta"
    )
    heard = "".join(
        message["delta"]
        for _, message in conversation.service.received
        if message["type"] == "session.input_transcript.delta"
    )
    assert words.strip(), conversation.service.kinds()
    assert "weather" in heard.lower(), heard
    assert len(conversation.service.times("session.output_audio.delta")) > 10


async def test_speaking_over_the_embedded_reply_stops_it(
    embedded_gateway: Gateway, record_property: Any
) -> None:
    conversation = await _converse(embedded_gateway, barge_in=True)
    _assert_started_without_error(conversation.service)
    stopped = _stopped_after_onset(conversation)
    logger.info("embedded: the reply stopped %.0f ms after the speech over it began", stopped * 1000)
    record_property("barge_in_stop_ms", round(stopped * 1000))
    assert stopped < BARGE_IN_BOUND_S


#: What the weather function says; the engine's spoken words read it back.
FORECAST = "sunny and nineteen degrees on Tuesday morning"


async def test_a_function_the_callers_words_call_runs_in_pipecat_and_its_output_is_spoken_by_embedded(
    embedded_gateway: Gateway,
) -> None:
    """A function registered with Pipecat as its docs show, called by the caller's words, its output spoken.

    Pipecat's default (no ``delegation``) is client delegation with no backend: it declines every
    delegation and runs no registered function. Its functions run under Responses delegation, where
    a delegated response's function calls come in ``response.event`` envelopes, Pipecat runs the
    handler and answers with ``response.item.create`` and ``response.create``; so that is the mode
    set here, everything else at its defaults. The gateway has no Responses backend: the embedded
    engine's own tool router calls the function and speaks its output.
    """
    from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
    from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
    from pipecat.services.llm_service import FunctionCallParams
    from pipecat.services.openai.responses.llm import OpenAIResponsesLLMService

    calls: list[dict[str, Any]] = []

    async def fetch_weather_report(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await params.result_callback({"forecast": FORECAST})

    weather = FunctionSchema(
        name="get_weather_report",
        description="Get the weather report for a day",
        properties={"day": {"type": "string", "description": "The day of the week"}},
        required=["day"],
    )
    service = TappedLiveService(
        api_key="sk-test",
        base_url=f"{embedded_gateway.ws_url}/v1/live/sessions",
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
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while "response.create" not in service.sent:
                if run.done():
                    run.result()
                await asyncio.sleep(0.05)
        # The reply that speaks the output: wait for its words to stop coming.
        async with asyncio.timeout(REPLY_TIMEOUT_S):
            while not _spoken_after_output(service) or (
                loop.time() - max(service.times("session.output_transcript.delta")) < 1.5
            ):
                await asyncio.sleep(0.05)
    finally:
        if listening is not None:
            listening.cancel()
        await worker.cancel()
        async with asyncio.timeout(30):
            await run
    _assert_started_without_error(service)
    # The router reads "Tuesday" as that day's date.
    assert len(calls) == 1 and calls[0].get("day"), calls
    envelopes = [m["event"] for _, m in service.received if m["type"] == "response.event"]
    called = [e["item"] for e in envelopes if e["type"] == "response.output_item.done"]
    assert [item["name"] for item in called] == ["get_weather_report"], envelopes
    assert service.sent.index("response.item.create") < service.sent.index("response.create")
    words = _spoken_after_output(service).lower()
    assert "sunny" in words and "nineteen" in words, words


def _spoken_after_output(service: TappedLiveService) -> str:
    """The engine's words (output transcript) after the function call reached the client."""
    called_at = [
        t
        for t, m in service.received
        if m["type"] == "response.event" and m["event"]["type"] == "response.output_item.done"
    ]
    if "response.create" not in service.sent or not called_at:
        return ""
    after = called_at[0]
    return "".join(
        m["delta"]
        for t, m in service.received
        if m["type"] == "session.output_transcript.delta" and t > after
    )


async def _realtime_first_audio_after_speech(gateway: Gateway) -> float:
    """The same question through ``/v1/realtime`` with OpenAI's SDK at its defaults (server VAD): s to first audio."""
    from openai import AsyncOpenAI

    from tests.fixtures import load_speech

    rate = 24_000  # the Realtime API's default input format
    speech = (np.clip(load_speech(rate), -1.0, 1.0) * 32767).astype(np.int16)
    step = rate * MIC_FRAME_MS // 1000
    client = AsyncOpenAI(api_key="sk-test", websocket_base_url=f"{gateway.ws_url}/v1")
    loop = asyncio.get_running_loop()
    async with client.realtime.connect(model="gpt-realtime") as connection:
        said_at = loop.time()

        async def speak() -> None:
            frames = [speech[i : i + step] for i in range(0, len(speech), step)]
            silence = np.zeros(step, dtype=np.int16)
            next_at = loop.time()
            for n in range(10**6):
                chunk = frames[n] if n < len(frames) else silence
                audio = base64.b64encode(np.pad(chunk, (0, step - len(chunk))).tobytes()).decode("ascii")
                await connection.input_audio_buffer.append(audio=audio)
                next_at += MIC_FRAME_MS / 1000
                await asyncio.sleep(max(0.0, next_at - loop.time()))

        speaking = asyncio.create_task(speak())
        try:
            async with asyncio.timeout(REPLY_TIMEOUT_S):
                async for event in connection:
                    assert event.type != "error", event
                    if event.type == "response.output_audio.delta":
                        return loop.time() - (said_at + SPEECH_END_MS / 1000)
        finally:
            speaking.cancel()
    raise AssertionError("the Realtime session ended before any reply audio")


async def test_end_of_speech_to_first_reply_audio_through_live_and_through_realtime(
    embedded_gateway: Gateway, capsys: Any, record_property: Any
) -> None:
    """One run, one embedded gateway: the same question through Live (Pipecat) and Realtime (OpenAI's SDK).

    Prints the two latencies and their ratio (Live over Realtime); asserts nothing about them.
    """
    # A first conversation warms the engine's models, so neither measurement pays for loading them.
    await _converse(embedded_gateway, barge_in=False)
    live = _answered_after(await _converse(embedded_gateway, barge_in=False))
    realtime = await _realtime_first_audio_after_speech(embedded_gateway)
    record_property("live_first_audio_ms", round(live * 1000))
    record_property("realtime_first_audio_ms", round(realtime * 1000))
    with capsys.disabled():
        print(
            f"\nembedded, end of speech -> first reply audio: Live {live * 1000:.0f} ms, "
            f"Realtime {realtime * 1000:.0f} ms, ratio {live / realtime:.2f}"
        )
