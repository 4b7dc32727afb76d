"""OpenAI's Live API in front of vLLM-Omni: ``vllm-omni`` in-process and ``remote`` (run under ``.venv-omni``).

A Live client speaks to ``/v1/live/sessions`` the way Pipecat's ``OpenAILiveLLMService`` does at
its defaults: ``session.start`` with the model and client delegation, then the microphone as
``session.input_audio.append`` frames of 20 ms at 24 kHz, in real time and without pause
(silence included); it never commits a turn nor asks for a reply. Behind the gateway is
vLLM-Omni's ``DuplexOmni`` over the fake model stage (:mod:`tests.omni.fake_stage`): in this
process's gateway (engine ``vllm-omni``), or in vLLM-Omni's own server that a gateway with
engine ``remote`` fronts. The stage records what it got; the client records what it got and
when.

The fake model echoes a turn in chunks a little slower than real time, as a model streaming its
speech does, so a caller can speak over a reply the model is still making.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from tests.e2e import helpers
from tests.e2e.helpers import Gateway, GatewayFactory, load_speech, ws_connect
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS
from tests.omni.conftest import (
    OMNI_READY_TIMEOUT_S,
    Backend,
    read_calls,
    start_backend,
    start_omni_gateway,
    stop_backends,
    wait_calls,
    wait_healthy,
)

pytestmark = pytest.mark.e2e

logger = logging.getLogger(__name__)

#: The Live API's default format (Pipecat's and LiveKit's too): PCM16 at 24 kHz, both ways.
RATE = 24_000
FRAME_MS = 20
#: What the stage takes: the caller's audio at 16 kHz.
STAGE_RATE = 16_000
#: Each reply in 16 chunks 250 ms apart: about as fast as it plays, so it is still being made
#: while it plays.
CHUNKS = 16
CHUNK_DELAY_MS = 250
#: What Pipecat's OpenAILiveLLMService sends at its defaults (no instructions, voice or history).
PIPECAT_START = {
    "type": "session.start",
    "session": {"model": "gpt-live-1", "delegation": {"type": "client"}},
}
#: The reply stops this soon after the onset of the caller's speech over it (Pipecat's test: 500 ms
#: on echo and embedded; here a second, the machine running vLLM-Omni beside the gateway).
BARGE_IN_BOUND_S = 1.0
#: No reply audio for this long: the reply has stopped (Pipecat groups turns by a 0.8 s gap).
QUIET_S = 0.8


# -- servers -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def omni_calls(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("live-omni") / "calls.jsonl"


@pytest.fixture(scope="module")
def omni_gateway(module_gateway_factory: GatewayFactory, omni_calls: Path) -> Gateway:
    """``serve --engine vllm-omni`` over the fake stage, replies paced as above."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FAKE_OMNI_CALL_LOG", str(omni_calls))
        mp.setenv("FAKE_OMNI_CHUNKS", str(CHUNKS))
        mp.setenv("FAKE_OMNI_CHUNK_DELAY_MS", str(CHUNK_DELAY_MS))
        mp.setattr(helpers, "READY_TIMEOUT_S", OMNI_READY_TIMEOUT_S)
        return module_gateway_factory.start(
            {"server": {"web_demo": False}, "engine": {"name": "vllm-omni"}},
            args=["--engine", "vllm-omni", "--omni-factory", "tests.omni.fake_stage:duplex_omni"],
            name="live-vllm-omni",
        )


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    started = start_backend(
        tmp_path_factory.mktemp("live-remote"), "omni", chunks=CHUNKS, chunk_delay_ms=CHUNK_DELAY_MS
    )
    try:
        wait_healthy([started])
        yield started
    finally:
        stop_backends([started])


@pytest.fixture(scope="module")
def remote_gateway(module_gateway_factory: GatewayFactory, backend: Backend) -> Gateway:
    config = {
        "server": {"web_demo": False},
        "engine": {"name": "remote", "remote": {"backends": [{"url": backend.url, "max_sessions": 4}]}},
    }
    return module_gateway_factory.start(config, name="live-remote")


@dataclass
class Target:
    """A gateway in front of vLLM-Omni, and the file its model stage records its calls in."""

    gateway: Gateway
    calls: Path


@pytest.fixture(params=["vllm-omni", "remote"])
def target(request: pytest.FixtureRequest) -> Target:
    if request.param == "vllm-omni":
        return Target(request.getfixturevalue("omni_gateway"), request.getfixturevalue("omni_calls"))
    upstream: Backend = request.getfixturevalue("backend")
    return Target(request.getfixturevalue("remote_gateway"), upstream.calls)


# -- a Live client -----------------------------------------------------------------------------------


@dataclass
class LiveCaller:
    """One Live session: a microphone streaming in real time, and every server event with its arrival."""

    ws: Any
    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: Utterances waiting for the microphone, and when each one's first frame went out (loop time).
    queued: list[bytes] = field(default_factory=list)
    said_at: list[float] = field(default_factory=list)

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        async for message in self.ws:
            self.received.append((loop.time(), json.loads(message)))

    async def microphone(self) -> None:
        """20 ms appends in real time: what is queued to be said, else silence."""
        loop = asyncio.get_running_loop()
        step = RATE * FRAME_MS // 1000 * 2
        playing = b""
        next_at = loop.time()
        while True:
            if not playing and self.queued:
                playing = self.queued.pop(0)
                self.said_at.append(loop.time())
            chunk, playing = playing[:step], playing[step:]
            chunk = chunk.ljust(step, b"\x00")
            await self.ws.send(
                json.dumps({"type": "session.input_audio.append", "audio": base64.b64encode(chunk).decode()})
            )
            next_at += FRAME_MS / 1000
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    def say(self, pcm: bytes) -> None:
        self.queued.append(pcm)

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.received if e["type"] == kind]

    def kinds(self) -> list[str]:
        return [e["type"] for _, e in self.received]

    async def until(self, kind: str, timeout: float, after: float = 0.0) -> float:
        """When the first ``kind`` at or after ``after`` arrived (waiting for it)."""
        async with asyncio.timeout(timeout):
            while not (times := [t for t, _ in self.of(kind) if t >= after]):
                await asyncio.sleep(0.01)
        return times[0]

    async def quiet(self, timeout: float) -> float:
        """Wait until no reply audio came for ``QUIET_S``; when the last came."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while loop.time() - (last := max(t for t, _ in self.of("session.output_audio.delta"))) < QUIET_S:
                await asyncio.sleep(0.05)
        return last


@contextlib.asynccontextmanager
async def live_session(gateway: Gateway) -> AsyncIterator[LiveCaller]:
    """A started Live session, its microphone running (silence until something is said)."""
    async with ws_connect(
        gateway, "/v1/live/sessions", additional_headers={"Authorization": "Bearer sk-test"}
    ) as ws:
        caller = LiveCaller(ws)
        reader = asyncio.create_task(caller.read())
        mic: asyncio.Task[None] | None = None
        try:
            await ws.send(json.dumps(PIPECAT_START))
            await caller.until("session.started", 30)
            mic = asyncio.create_task(caller.microphone())
            yield caller
        finally:
            for task in (mic, reader):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
    await gateway.wait_sessions(0, timeout=15)


def _speech() -> bytes:
    """The speech fixture at 24 kHz: 0.5 s of silence, a 2.9 s question, 1 s of silence."""
    return load_speech(RATE)


def _audio_s(caller: LiveCaller, after: float = 0.0, before: float = float("inf")) -> float:
    """Seconds of reply audio that arrived in [after, before)."""
    return sum(
        len(base64.b64decode(e["delta"])) / 2 / RATE
        for t, e in caller.of("session.output_audio.delta")
        if after <= t < before
    )


def _turns(calls: Path, before: int) -> list[dict[str, Any]]:
    """The whole turns (non-resumable requests) the stage took after its first ``before`` calls."""
    return [
        c for c in read_calls(calls)[before:] if c.get("call") == "stage.add_request" and not c["resumable"]
    ]


def _stopped_after(caller: LiveCaller, onset: float) -> float:
    """How long after ``onset`` the reply playing then kept sending audio (s); it must have been playing."""
    deltas = [t for t, _ in caller.of("session.output_audio.delta")]
    assert any(onset - 0.3 < t <= onset for t in deltas), "the reply was not playing when the caller spoke"
    last = onset
    for t in (t for t in deltas if t > onset):
        if t - last > QUIET_S:
            break  # the next reply's audio
        last = t
    return last - onset


def _errors(caller: LiveCaller) -> list[dict[str, Any]]:
    return [e for _, e in caller.of("error")]


# -- tests ---------------------------------------------------------------------------------------------


async def test_the_callers_audio_reaches_duplex_omni_and_the_models_reply_reaches_the_caller(
    target: Target, record_property: Any
) -> None:
    """The microphone's stream reaches the model stage as one turn; the model's decision to speak
    reaches the caller as real-time audio of that turn with its words, and what it heard."""
    mark = len(read_calls(target.calls))
    async with live_session(target.gateway) as caller:
        (_, started), *_ = caller.of("session.started")
        assert started["session"]["model"] == "gpt-live-1"
        assert started["session"]["audio"]["format"] == {"type": "audio/pcm", "rate": RATE}
        assert started["session"]["delegation"] == {"type": "client"}
        # Silence alone: the model listens (nothing reaches the stage, nothing is said).
        await asyncio.sleep(1.5)
        assert not _turns(target.calls, mark) and not caller.of("session.output_audio.delta")
        caller.say(_speech())
        await caller.until("session.output_audio.delta", 30)
        first = caller.of("session.output_audio.delta")[0][0]
        last = await caller.quiet(30)
        spoken_end = caller.said_at[0] + SPEECH_END_MS / 1000
        first_audio_ms = round((first - spoken_end) * 1000)
        record_property("first_audio_ms", first_audio_ms)
        logger.info("live: first reply audio %d ms after the end of the question", first_audio_ms)
        assert _errors(caller) == [], _errors(caller)

    # What the stage got: one turn, the question with the VAD's padding, at the stage's rate.
    (turn,) = _turns(target.calls, mark)
    turn_s = turn["samples"] / STAGE_RATE
    assert (SPEECH_END_MS - SPEECH_START_MS) / 1000 < turn_s < 4.4, turn
    # What the caller got: that turn echoed (24 kHz), in real time, with the model's words...
    audio_s = _audio_s(caller)
    assert abs(audio_s - turn_s) < 0.05, (audio_s, turn_s)
    assert last - first >= audio_s - 0.5, (last - first, audio_s)
    words = "".join(e["delta"] for _, e in caller.of("session.output_transcript.delta"))
    assert words == f"(echo of {turn_s:.1f} s of your audio)", words
    # ...and what the model heard of the caller, on the session timeline.
    heard = caller.of("session.input_transcript.delta")
    assert "".join(e["delta"] for _, e in heard) == f"{round(turn_s, 1)} s of caller audio", heard
    assert all(0 <= e["start_ms"] <= e["end_ms"] for _, e in heard), heard
    kinds = set(caller.kinds())
    assert not {k for k in kinds if k.startswith("response.")}, kinds  # client delegation: none


async def test_speaking_over_the_reply_cuts_it_and_the_next_turn_is_answered(
    target: Target, record_property: Any
) -> None:
    """The caller speaks over a reply the model is still making: the stage stops making it, its
    audio stops reaching the caller, and the caller's new turn gets a reply of its own."""
    mark = len(read_calls(target.calls))
    async with live_session(target.gateway) as caller:
        caller.say(_speech())
        first = await caller.until("session.output_audio.delta", 30)
        await asyncio.sleep(0.5)  # the caller hears the start of the reply, then speaks over it
        caller.say(_speech())
        await asyncio.sleep(0.1)
        onset = caller.said_at[1] + SPEECH_START_MS / 1000
        # The model stops the reply: the stage aborts the request making it.
        (cut_turn,) = _turns(target.calls, mark)
        await wait_calls(
            target.calls,
            lambda c: c.get("call") == "stage.abort" and cut_turn["request_id"] in c["request_ids"],
            timeout=15,
        )
        # The reply to the turn spoken over it.
        second = await caller.until(
            "session.output_audio.delta", 30, after=onset + (SPEECH_END_MS - SPEECH_START_MS) / 1000
        )
        await caller.quiet(30)
        assert _errors(caller) == [], _errors(caller)

    stopped = _stopped_after(caller, onset)
    record_property("barge_in_stop_ms", round(stopped * 1000))
    logger.info("live barge-in: the reply's audio stopped %.0f ms after the onset", stopped * 1000)
    assert stopped < BARGE_IN_BOUND_S, stopped
    # The cut reply: the stage made only part of it, and the caller heard less than the turn.
    chunks = [c for c in read_calls(target.calls) if c.get("call") == "stage.chunk"]
    assert 0 < len([c for c in chunks if c["request_id"] == cut_turn["request_id"]]) < CHUNKS
    assert _audio_s(caller, before=onset + stopped + 0.01) < cut_turn["samples"] / STAGE_RATE
    # The second turn reached the stage and was answered in full.
    turns = _turns(target.calls, mark)
    assert len(turns) == 2, turns
    assert abs(_audio_s(caller, after=second) - turns[1]["samples"] / STAGE_RATE) < 0.05
    assert first < onset < second


@pytest.fixture
def fast_gateway(gateway_factory: GatewayFactory, tmp_path: Path) -> Gateway:
    """``vllm-omni`` whose model makes a reply in a fraction of the time it plays (8 chunks, 60 ms
    apart), for one test."""
    return start_omni_gateway(
        gateway_factory,
        engine="vllm-omni",
        omni_factory="tests.omni.fake_stage:duplex_omni",
        calls=tmp_path / "calls.jsonl",
        name="live-vllm-omni-fast",
    )


async def test_speaking_over_a_reply_made_faster_than_it_plays_cuts_it(fast_gateway: Gateway) -> None:
    """As a model on a fast accelerator does: the reply is whole in the gateway long before it has
    played; the caller speaking over it must still stop what they hear."""
    async with live_session(fast_gateway) as caller:
        caller.say(_speech())
        await caller.until("session.output_audio.delta", 30)
        await asyncio.sleep(0.5)
        caller.say(_speech())
        await asyncio.sleep(SPEECH_START_MS / 1000 + 2.0)
        onset = caller.said_at[1] + SPEECH_START_MS / 1000
        stopped = _stopped_after(caller, onset)
        logger.info(
            "live barge-in over a reply already made: audio stopped %.0f ms after the onset", stopped * 1000
        )
        assert _errors(caller) == [], _errors(caller)
    assert stopped < BARGE_IN_BOUND_S, stopped
