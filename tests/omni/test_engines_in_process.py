"""The two vLLM-Omni engines driven through the engine port, in this process.

The gateway-level tests (``test_vllm_omni*_engine.py``) cover what a client sees;
these cover the engine behaviours a client can hardly provoke on purpose: the
engine's session limit, a reply cancelled before the engine created it, vLLM-Omni's
own VAD finding turns, the stream engine on true delta outputs, clearing a
half-sent turn. Each engine is a real ``DuplexOmni`` / ``AsyncOmni`` over the fake
stage (≈3 s to build once vLLM is imported).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from duplex_gateway.engine import port
from duplex_gateway.engine.vllm_omni import VllmOmniEngine
from duplex_gateway.engine.vllm_omni_stream import VllmOmniStreamEngine
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.omni import fake_stage
from tests.omni.conftest import read_calls

REPO = Path(__file__).resolve().parents[2]
ONE_SECOND = (np.sin(np.arange(16_000) / 7.0) * 9000).astype("<i2").tobytes()


@pytest.fixture
def fake_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_OMNI_CALL_LOG", str(calls))
    monkeypatch.setenv("FAKE_OMNI_CHUNKS", "6")
    monkeypatch.setenv("FAKE_OMNI_CHUNK_DELAY_MS", "40")
    return calls


class Events:
    """Everything one engine session emitted, collected in the background."""

    def __init__(self, session: port.EngineSession) -> None:
        self.items: list[port.EngineEvent] = []
        self._task = asyncio.create_task(self._run(session))

    async def _run(self, session: port.EngineSession) -> None:
        async for event in session.events():
            self.items.append(event)

    async def wait(self, match: Callable[[port.EngineEvent], bool], timeout: float = 10) -> port.EngineEvent:
        async with asyncio.timeout(timeout):
            while True:
                for event in self.items:
                    if match(event):
                        return event
                await asyncio.sleep(0.01)

    def of(self, cls: type[port.EngineEvent], response_id: str | None = None) -> list[Any]:
        return [
            e
            for e in self.items
            if isinstance(e, cls) and response_id in (None, getattr(e, "response_id", None))
        ]

    async def closed(self) -> None:
        await asyncio.wait_for(self._task, 10)


@contextlib.asynccontextmanager
async def running(engine: port.Engine) -> AsyncIterator[port.Engine]:
    await engine.start()
    try:
        yield engine
    finally:
        await engine.shutdown()


async def send_turn(session: port.EngineSession, pcm: bytes = ONE_SECOND) -> None:
    for offset in range(0, len(pcm), 640):
        await session.append_audio(pcm[offset : offset + 640])


def done_of(response_id: str) -> Callable[[port.EngineEvent], bool]:
    return lambda e: isinstance(e, port.EngineResponseDone) and e.response_id == response_id


# -- vllm-omni ------------------------------------------------------------------------------------


async def test_duplex_limits_ids_and_late_cancel(fake_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni, max_sessions=64)
    async with running(engine):
        caps = engine.capabilities
        # The deploy YAML admits 4 engine sessions; the gateway learns that at start.
        assert caps.max_sessions == 4 and caps.barge_in and not caps.detects_turns
        sessions = [await engine.open_session(f"s{i}", SessionConfig()) for i in range(4)]
        with pytest.raises(port.EngineSessionLimit):
            await engine.open_session("s5", SessionConfig())
        for extra in sessions[1:]:
            await extra.close("done")
        assert engine.active_sessions == 1

        session = sessions[0]
        events = Events(session)
        await session.update(SessionConfig(instructions="Be brief.", voice="alloy", speed=1.1))
        # Client-driven reply: the gateway's response id stands for the engine's.
        await send_turn(session)
        await session.commit(item_id="item_1", response_id=None)
        await session.create_response(response_id="resp_gw_1", instructions=None)
        await events.wait(done_of("resp_gw_1"))
        assert events.of(port.EngineResponseStarted)[0].response_id == "resp_gw_1"
        assert len(events.of(port.EngineAudio, "resp_gw_1")) == 6
        assert (
            "".join(e.delta for e in events.of(port.EngineTranscript, "resp_gw_1"))
            == "(echo of 1.0 s of your audio)"
        )
        await session.ack_playback(response_id="resp_gw_1", played_ms=1000)

        # Cancelled before the engine even created it: nothing of that reply comes out.
        await send_turn(session)
        await session.commit(item_id="item_2", response_id=None)
        await session.create_response(response_id="resp_gw_2", instructions=None)
        await session.cancel_response("resp_gw_2")
        # The caller speaks again at once: that turn's reply is not the one cancelled.
        mark = len(events.items)
        await send_turn(session)
        await session.commit(item_id="item_3", response_id="resp_for_item_3")
        started = await events.wait(
            lambda e: isinstance(e, port.EngineResponseStarted) and events.items.index(e) >= mark
        )
        assert isinstance(started, port.EngineResponseStarted) and started.response_id == "resp_for_item_3"
        done = await events.wait(done_of("resp_for_item_3"))
        assert isinstance(done, port.EngineResponseDone) and done.status == "completed"
        # Nothing of the cancelled reply came out, before or after.
        assert not events.of(port.EngineResponseStarted, "resp_gw_2")
        assert not events.of(port.EngineAudio, "resp_gw_2")
        assert not events.of(port.EngineError)

        await session.close("bye")
        await events.closed()
        assert isinstance(events.items[-1], port.EngineClosed)
        assert engine.active_sessions == 0 and engine.omni.active_session_count() == 0
    assert not engine.ready


async def test_duplex_a_refused_response_create_ends_its_reply_and_the_next_keeps_its_id(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    engine = VllmOmniEngine(factory=fake_stage.duplex_omni)
    async with running(engine):
        session = await engine.open_session("s1", SessionConfig())
        events = Events(session)
        await send_turn(session)
        await session.commit(item_id="item_1", response_id=None)
        # vLLM-Omni's duplex sessions refuse per-reply instructions: that reply fails, named...
        await session.create_response(response_id="resp_instructed", instructions="Be brief.")
        refused = await events.wait(done_of("resp_instructed"))
        assert isinstance(refused, port.EngineResponseDone)
        assert (refused.status, refused.reason) == ("failed", "unsupported_native_response_options")
        (error,) = events.of(port.EngineError)
        assert error.code == "unsupported_native_response_options"
        # ...and the next reply is not taken for it.
        await send_turn(session)
        await session.commit(item_id="item_2", response_id="resp_2")
        done = await events.wait(done_of("resp_2"))
        assert isinstance(done, port.EngineResponseDone) and done.status == "completed"
        assert [e.response_id for e in events.of(port.EngineResponseStarted)] == ["resp_2"]
        await session.close("done")
        await events.closed()


async def test_duplex_engine_vad_finds_the_turn(fake_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    speech, rate = sf.read(REPO / "tests" / "fixtures" / "speech_16k.wav", dtype="float32")
    assert rate == 16_000
    audio = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(24_000, np.float32)])
    pcm = (audio * 32767).astype("<i2").tobytes()
    engine = VllmOmniEngine(factory="tests.omni.fake_stage:duplex_omni", engine_vad=True)
    async with running(engine):
        assert engine.capabilities.detects_turns
        session = await engine.open_session("vad", SessionConfig())
        events = Events(session)
        for offset in range(0, len(pcm), 640):  # 20 ms frames at 3x real time
            await session.append_audio(pcm[offset : offset + 640])
            await asyncio.sleep(0.02 / 3)
        started = await events.wait(lambda e: isinstance(e, port.EngineResponseStarted), 15)
        assert isinstance(started, port.EngineResponseStarted)
        await events.wait(done_of(started.response_id))
        kinds = [type(e).__name__ for e in events.items]
        assert (
            kinds.index("EngineSpeechStarted")
            < kinds.index("EngineSpeechStopped")
            < kinds.index("EngineResponseStarted")
        )
        speech_started = events.of(port.EngineSpeechStarted)[0]
        assert 300 <= speech_started.audio_start_ms <= 1500
        # The engine ended the turn: it says so under its own name for it, and what it heard of
        # the caller names that turn too (the gateway session maps it to the caller's item).
        (committed,) = events.of(port.EngineTurnCommitted)
        assert committed.item_id and committed.item_id == events.of(port.EngineSpeechStopped)[0].item_id
        assert kinds.index("EngineSpeechStopped") < kinds.index("EngineTurnCommitted")
        heard = [e for e in events.of(port.EngineInputTranscript) if e.final]
        assert [(e.item_id, e.text) for e in heard] == [(committed.item_id, f"{heard[0].text}")]
        assert heard[0].text.endswith("s of caller audio")
        echoed = sum(len(e.pcm) for e in events.of(port.EngineAudio)) / 2 / 24_000
        assert 2.5 < echoed < 5.0, echoed
        await session.close("bye")
        await events.closed()


# -- vllm-omni-stream -------------------------------------------------------------------------------


async def test_stream_delta_outputs_clear_and_no_audio(
    fake_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("FAKE_OMNI_OUTPUT_KIND", "delta")
    engine = VllmOmniStreamEngine(factory=fake_stage.async_omni, input_chunk_ms=200)
    async with running(engine):
        assert engine.cumulative_prior is False  # the deployment asks for deltas
        session = await engine.open_session("s1", SessionConfig())
        events = Events(session)

        # A reply asked for with no caller audio fails; the session goes on.
        await session.create_response(response_id="resp_none", instructions=None)
        done = await events.wait(done_of("resp_none"))
        assert isinstance(done, port.EngineResponseDone) and done.status == "failed"

        # A half-sent turn the client clears is aborted in the engine.
        await send_turn(session, ONE_SECOND[:16_000])
        await session.clear_input()
        calls = read_calls(fake_env)
        (cleared,) = {c["request_id"] for c in calls if c["call"] == "add_request"}
        assert [c for c in calls if c["call"] == "abort_async.result" and c["request_ids"] == [cleared]]

        # True delta outputs: each chunk is new audio, all of it arrives, once.
        await send_turn(session)
        await session.commit(item_id="item_1", response_id="resp_for_item_1")
        started = await events.wait(
            lambda e: isinstance(e, port.EngineResponseStarted) and e.response_id != "resp_none"
        )
        assert isinstance(started, port.EngineResponseStarted)
        await events.wait(done_of(started.response_id))
        audio = events.of(port.EngineAudio, started.response_id)
        assert len(audio) == 6
        assert sum(len(e.pcm) for e in audio) == 2 * 24_000
        assert "".join(e.delta for e in events.of(port.EngineTranscript, started.response_id)) == (
            "(echo of 1.0 s of your audio)"
        )
        # Updates of 200 ms: one add_request, then resumable updates, then the end marker.
        calls = [c for c in read_calls(fake_env) if c.get("request_id") not in (None, cleared)]
        kinds = [(c["call"], c["resumable"]) for c in calls if c["call"].startswith("add_")]
        assert kinds == [("add_request", True)] + [("add_streaming_update", True)] * 4 + [
            ("add_streaming_update", False)
        ], kinds

        # Closing with a reply in flight aborts it.
        await send_turn(session)
        await session.commit(item_id="item_2", response_id="resp_for_item_2")
        await events.wait(lambda e: isinstance(e, port.EngineAudio) and e.response_id != started.response_id)
        mark = len(read_calls(fake_env))
        await session.close("bye")
        await events.closed()
        assert isinstance(events.items[-1], port.EngineClosed)
        assert [c for c in read_calls(fake_env)[mark:] if c["call"] == "abort_async.result" and c["ok"]]
        assert engine.active_sessions == 0
