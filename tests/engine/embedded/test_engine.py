"""The embedded engine behind the engine port, driven directly with real speech."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duplex_gateway.config import load_settings
from duplex_gateway.engine import port
from duplex_gateway.engine.embedded import DIDNT_CATCH, EmbeddedEngine
from duplex_gateway.engine.embedded.asr import Heard
from duplex_gateway.engine.embedded.workers import Priority
from duplex_gateway.engine.registry import build_engine
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.engine.embedded.conftest import to_pcm16
from tests.fixtures import SPEECH_TEXT
from tests.wer import wer

RATE = 16_000
CHUNK = RATE // 10 * 2  # 100 ms of PCM16


@asynccontextmanager
async def opened(engine: EmbeddedEngine, session_id: str) -> AsyncIterator[port.EngineSession]:
    session = await engine.open_session(session_id, SessionConfig())
    try:
        yield session
    finally:
        await session.close("test over")


async def read_until(
    events: AsyncIterator[port.EngineEvent], until: type[port.EngineEvent], timeout: float = 20.0
) -> list[port.EngineEvent]:
    seen: list[port.EngineEvent] = []

    async def run() -> None:
        async for event in events:
            seen.append(event)
            if isinstance(event, until):
                return

    await asyncio.wait_for(run(), timeout)
    return seen


def audio_bytes(events: list[port.EngineEvent], response_id: str | None = None) -> int:
    return sum(
        len(e.pcm)
        for e in events
        if isinstance(e, port.EngineAudio) and (response_id is None or e.response_id == response_id)
    )


def reply_text(events: list[port.EngineEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, port.EngineTranscript))


async def speak(session: port.EngineSession, pcm: bytes, *, pace_s: float = 0.025) -> None:
    """Append ``pcm`` in 100 ms chunks, four times faster than real time."""
    for offset in range(0, len(pcm), CHUNK):
        await session.append_audio(pcm[offset : offset + CHUNK])
        await asyncio.sleep(pace_s)


def test_capabilities(engine: EmbeddedEngine) -> None:
    caps = engine.capabilities
    assert (caps.name, caps.input_rate, caps.output_rate) == ("embedded", 16_000, 22_050)
    assert caps.detects_turns is False and caps.input_transcription is True and caps.barge_in is True
    assert engine.ready
    print(f"\nembedded engine load times: {engine.load_times}")


async def test_a_spoken_turn_is_heard_and_answered(engine: EmbeddedEngine, speech_pcm: bytes) -> None:
    async with opened(engine, "turn") as session:
        seen: list[port.EngineEvent] = []

        async def read() -> None:
            async for event in session.events():
                seen.append(event)
                if isinstance(event, port.EngineResponseDone):
                    return

        reader = asyncio.create_task(read())
        await speak(session, speech_pcm)
        await asyncio.sleep(0.3)  # a live caller's pause lets the partial recognizer catch up
        before_commit = list(seen)
        committed = time.perf_counter()
        await session.commit(item_id="item_1", response_id="resp_for_item_1")
        assert time.perf_counter() - committed < 0.2  # transcription runs in the background
        await asyncio.wait_for(reader, 20)
    partials = [e for e in before_commit if isinstance(e, port.EngineInputTranscript)]
    assert partials and all(not e.final and e.item_id == "" for e in partials)
    finals = [e for e in seen if isinstance(e, port.EngineInputTranscript) and e.final]
    assert len(finals) == 1 and finals[0].item_id == "item_1"
    assert wer(SPEECH_TEXT, finals[0].text) <= 0.25, finals[0].text
    started = [e for e in seen if isinstance(e, port.EngineResponseStarted)]
    assert len(started) == 1
    rid = started[0].response_id
    assert seen[-1] == port.EngineResponseDone(response_id=rid, status="completed")
    assert reply_text(seen).startswith("You said: please send me the weather report for Tuesday morning")
    assert audio_bytes(seen, rid) > 0
    # The final transcript comes before any of the reply's output.
    first_output = next(
        i for i, e in enumerate(seen) if isinstance(e, port.EngineTranscript | port.EngineAudio)
    )
    assert seen.index(finals[0]) < first_output
    chunks = [e for e in seen if isinstance(e, port.EngineAudio)]
    assert all(0 < len(c.pcm) <= 4410 and len(c.pcm) % 2 == 0 for c in chunks)  # ~100 ms at 22.05 kHz


async def test_two_callers_at_once_each_get_their_own_answer(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    async with opened(engine, "caller_a") as first, opened(engine, "caller_b") as second:
        await first.append_audio(speech_pcm)
        await second.add_item(item_id="item_b", role="user", text="What time is it?")
        await first.commit(item_id="item_a", response_id="resp_for_item_a")
        await second.create_response(response_id="resp_b", instructions=None)
        seen_a, seen_b = await asyncio.gather(
            read_until(first.events(), port.EngineResponseDone),
            read_until(second.events(), port.EngineResponseDone),
        )
    assert "weather" in reply_text(seen_a).lower() and "time" not in reply_text(seen_a).lower()
    assert reply_text(seen_b) == "You said: what time is it? It's 3:15 PM UTC."
    assert not any(isinstance(e, port.EngineInputTranscript) for e in seen_b)


async def test_text_item_is_answered_like_a_turn(engine: EmbeddedEngine) -> None:
    async with opened(engine, "text") as session:
        await session.add_item(item_id="item_t", role="user", text="What time is it?")
        await session.create_response(response_id="resp_t", instructions=None)
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert seen[0] == port.EngineResponseStarted(response_id="resp_t")
    assert reply_text(seen) == "You said: what time is it? It's 3:15 PM UTC."
    transcripts = [e.delta for e in seen if isinstance(e, port.EngineTranscript)]
    assert transcripts == ["You said: what time is it?", " It's 3:15 PM UTC."]  # one delta per sentence
    assert audio_bytes(seen, "resp_t") > 0
    assert seen[-1] == port.EngineResponseDone(response_id="resp_t", status="completed")


async def test_commit_then_create_response_answers_the_turn(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    async with opened(engine, "late") as session:
        await session.append_audio(speech_pcm)
        await session.commit(item_id="item_l", response_id=None)
        await session.create_response(response_id="resp_l", instructions="ignored by this engine")
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert "weather" in reply_text(seen).lower()
    assert seen[-1] == port.EngineResponseDone(response_id="resp_l", status="completed")


@pytest.mark.parametrize("paced", [False, True], ids=["unpaced", "paced"])
@pytest.mark.parametrize("how", ["barge_in", "cancel"])
async def test_stopping_a_reply_stops_its_audio_at_once(
    engine: EmbeddedEngine, how: str, paced: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if paced:
        engine = EmbeddedEngine(pace=1.0, lead_ms=300, whisper_cpu_threads=2, tts_threads=2)
        await engine.start()
    voice = engine.models.voice
    synthesized: list[str] = []
    real_synthesize = voice.synthesize

    def counting(sentence: str, *, speed: float = 1.0) -> bytes:
        synthesized.append(sentence)
        return real_synthesize(sentence, speed=speed)

    monkeypatch.setattr(voice, "synthesize", counting)
    try:
        async with opened(engine, f"stop_{how}") as session:
            await session.add_item(item_id="item_h", role="user", text="Help")  # a four-sentence reply
            await session.create_response(response_id="resp_h", instructions=None)
            events = session.events()
            seen: list[port.EngineEvent] = []
            while not any(isinstance(e, port.EngineAudio) for e in seen):
                seen.append(await asyncio.wait_for(anext(events), 20))
            stopped = time.perf_counter()
            if how == "barge_in":
                await session.barge_in()
            else:
                await session.cancel_response("resp_h")
            rest = await read_until(events, port.EngineResponseDone, timeout=1.0)
            elapsed = time.perf_counter() - stopped
            await asyncio.sleep(0.3)  # anything still on its way would arrive now
            await session.close("done")
            tail = await read_until(events, port.EngineClosed, timeout=2.0)
    finally:
        if paced:
            await engine.shutdown()
    assert elapsed < 0.5
    assert rest[-1] == port.EngineResponseDone(response_id="resp_h", status="cancelled")
    # Nothing more of the stopped reply arrives, not even what was made before the stop.
    assert not any(isinstance(e, port.EngineAudio | port.EngineTranscript) for e in rest + tail)
    assert not any(isinstance(e, port.EngineResponseDone) for e in tail)
    assert reply_text(seen) == "You said: help."
    if paced:
        # The listener had heard a fraction of the first sentence: the next one is made while it
        # plays, and no later one was even started.
        assert synthesized[0] == "You said: help." and len(synthesized) <= 2, synthesized


async def test_a_paced_reply_plays_out_in_real_time() -> None:
    engine = EmbeddedEngine(pace=4.0, lead_ms=200, whisper_cpu_threads=2, tts_threads=2)
    await engine.start()
    try:
        async with opened(engine, "paced") as session:
            await session.add_item(item_id="item_p", role="user", text="Please send me the weather report.")
            await session.create_response(response_id="resp_p", instructions=None)
            events = session.events()
            seen: list[port.EngineEvent] = []
            first_audio_at = None
            async for event in events:
                seen.append(event)
                if isinstance(event, port.EngineAudio) and first_audio_at is None:
                    first_audio_at = time.perf_counter()
                if isinstance(event, port.EngineResponseDone):
                    break
            assert first_audio_at is not None
            elapsed = time.perf_counter() - first_audio_at
    finally:
        await engine.shutdown()
    audio_s = audio_bytes(seen) / 2 / engine.capabilities.output_rate
    # At 4x real time with a 200 ms lead, the reply takes (audio - lead) / 4 to send.
    assert elapsed >= (audio_s - 0.2) / 4.0 - 0.1
    assert elapsed < audio_s / 4.0 + 1.0


async def test_the_next_sentence_is_made_while_the_one_before_it_plays(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # So the pacer's lead covers network jitter only, not a sentence's synthesis.
    engine = EmbeddedEngine(pace=1.0, lead_ms=100, whisper_cpu_threads=2, tts_threads=2)
    await engine.start()
    voice = engine.models.voice
    real_synthesize = voice.synthesize
    sent_at_start: list[tuple[str, float]] = []
    replies: list[Any] = []

    def recording(sentence: str, *, speed: float = 1.0) -> bytes:
        # Runs in a worker thread; a float read is atomic enough for a record.
        sent_at_start.append((sentence, replies[0].audio_s if replies else -1.0))
        return real_synthesize(sentence, speed=speed)

    monkeypatch.setattr(voice, "synthesize", recording)
    try:
        async with opened(engine, "ahead") as session:
            await session.add_item(item_id="item_n", role="user", text="Help")  # a four-sentence reply
            await session.create_response(response_id="resp_n", instructions=None)
            replies.append(session._replies._runs["resp_n"])  # type: ignore[attr-defined]
            await until(lambda: len(sent_at_start) >= 2)
            first_s = replies[0].pieces[0][1] / 1000.0 if replies[0].pieces else None
            await session.barge_in()
    finally:
        await engine.shutdown()
    (first, at_first), (second, at_second) = sent_at_start[:2]
    assert first == "You said: help." and at_first == 0.0
    # The second sentence was started with the first still being sent, not once it all was.
    assert first_s is not None and at_second < first_s - 0.5, (second, at_second, first_s)


async def test_a_new_reply_after_barge_in_works(engine: EmbeddedEngine) -> None:
    async with opened(engine, "again") as session:
        await session.add_item(item_id="item_a", role="user", text="Help")
        await session.create_response(response_id="resp_1", instructions=None)
        await session.barge_in()
        await session.add_item(item_id="item_b", role="user", text="What day is it?")
        await session.create_response(response_id="resp_2", instructions=None)
        seen = await read_until(session.events(), port.EngineResponseDone)
        while not (isinstance(seen[-1], port.EngineResponseDone) and seen[-1].response_id == "resp_2"):
            seen += await read_until(session.events(), port.EngineResponseDone)
    assert port.EngineResponseDone(response_id="resp_1", status="cancelled") in seen
    assert audio_bytes(seen, "resp_1") == 0
    assert reply_text(seen).endswith("Today is Tuesday, May 6, 2025.")
    assert audio_bytes(seen, "resp_2") > 0


@pytest.mark.parametrize("kind", ["silence", "noise"])
async def test_no_speech_gets_didnt_catch_that(engine: EmbeddedEngine, kind: str) -> None:
    if kind == "silence":
        pcm = bytes(RATE * 2 * 2)
    else:
        pcm = to_pcm16(np.random.default_rng(7).standard_normal(RATE * 2).astype(np.float32) * 0.3)
    async with opened(engine, kind) as session:
        await session.append_audio(pcm)
        await session.commit(item_id="item_n", response_id="resp_for_item_n")
        seen = await read_until(session.events(), port.EngineResponseDone)
    finals = [e for e in seen if isinstance(e, port.EngineInputTranscript) and e.final]
    assert finals == [port.EngineInputTranscript(item_id="item_n", text="", final=True)]
    assert reply_text(seen) == DIDNT_CATCH
    assert audio_bytes(seen) > 0
    assert isinstance(seen[-1], port.EngineResponseDone) and seen[-1].status == "completed"
    assert not any(isinstance(e, port.EngineError) for e in seen)


async def test_clipped_speech_and_odd_chunks_do_not_fail(engine: EmbeddedEngine) -> None:
    from tests.fixtures import load_speech

    pcm = to_pcm16(load_speech() * 20.0)  # hard clipping
    async with opened(engine, "clipped") as session:
        await session.append_audio(pcm[:3])  # odd sizes, split samples
        await session.append_audio(pcm[3:])
        await session.commit(item_id="item_c", response_id="resp_for_item_c")
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert not any(isinstance(e, port.EngineError) for e in seen)
    assert isinstance(seen[-1], port.EngineResponseDone) and seen[-1].status == "completed"


async def test_commit_without_audio_and_reply_without_input(engine: EmbeddedEngine) -> None:
    async with opened(engine, "empty") as session:
        await session.commit(item_id="item_e", response_id=None)
        await session.create_response(response_id="resp_e", instructions=None)
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert port.EngineInputTranscript(item_id="item_e", text="", final=True) in seen
    assert reply_text(seen) == DIDNT_CATCH


async def test_clear_input_drops_the_turn(engine: EmbeddedEngine, speech_pcm: bytes) -> None:
    async with opened(engine, "clear") as session:
        await session.append_audio(speech_pcm)
        await session.clear_input()
        await session.commit(item_id="item_x", response_id="resp_for_item_x")
        seen = await read_until(session.events(), port.EngineResponseDone)
    assert port.EngineInputTranscript(item_id="item_x", text="", final=True) in seen
    assert reply_text(seen) == DIDNT_CATCH


async def test_a_monologue_keeps_memory_bounded() -> None:
    engine = EmbeddedEngine(max_sessions=1, max_turn_s=5.0, whisper_cpu_threads=2, tts_threads=2)
    await engine.start()
    try:
        async with opened(engine, "monologue") as session:
            second = to_pcm16(np.random.default_rng(1).standard_normal(RATE).astype(np.float32) * 0.01)
            tracemalloc.start()
            try:
                for index in range(600):  # ten minutes, arriving faster than it can be decoded
                    await session.append_audio(second)
                    if index % 50 == 0:
                        await asyncio.sleep(0)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            await session.clear_input()
        # 5 s of turn (160 kB) + 5 s of partial backlog (160 kB) + chunks in flight; not 19 MB.
        assert peak < 3_000_000
    finally:
        await engine.shutdown()


async def until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.01)

    await asyncio.wait_for(poll(), timeout)


async def test_idle_sessions_hold_no_decoder_and_a_talking_caller_holds_one_for_the_turn(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    pool = engine.models.partials
    assert pool is not None
    await until(lambda: pool.in_use == 0)  # earlier tests' decoders are handed back in the background
    created = pool.created
    sessions = [await engine.open_session(f"idle_{i}", SessionConfig()) for i in range(8)]
    try:
        assert engine.leased_recognizers == 0 and pool.in_use == 0 and pool.created == created
        talker = sessions[0]
        await talker.append_audio(speech_pcm[: RATE // 2 * 2])
        await until(lambda: engine.leased_recognizers == 1)
        await talker.append_audio(speech_pcm[RATE // 2 * 2 :])
        await talker.commit(item_id="item_lease", response_id=None)
        await until(lambda: engine.leased_recognizers == 0 and pool.in_use == 0)
        # The next turn finds the decoder the last one gave back.
        await talker.append_audio(speech_pcm[: RATE // 2 * 2])
        await until(lambda: engine.leased_recognizers == 1)
        await talker.clear_input()
        await until(lambda: engine.leased_recognizers == 0 and pool.in_use == 0)
        # Whatever was made for the talker, the idle sessions took none of it.
        assert pool.created - created <= 2
    finally:
        for session in sessions:
            await session.close("test over")
    assert engine.leased_recognizers == 0


async def test_a_session_closed_mid_turn_gives_its_decoder_back(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    pool = engine.models.partials
    assert pool is not None
    session = await engine.open_session("closing", SessionConfig())
    await session.append_audio(speech_pcm)
    await until(lambda: engine.leased_recognizers == 1 and pool.in_use == 1)
    await session.close("bye")
    await until(lambda: pool.in_use == 0)


IDLE_RSS_SCRIPT = """
import asyncio, json, sys
from duplex_gateway.engine.embedded import EmbeddedEngine
from duplex_gateway.vocabulary.session_config import SessionConfig

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

async def main():
    engine = EmbeddedEngine(max_sessions=16, whisper_cpu_threads=1, tts_threads=1, workers=1)
    await engine.start()
    before = rss()
    sessions = [await engine.open_session(f"s{i}", SessionConfig()) for i in range(16)]
    after = rss()
    for session in sessions:
        await session.close("bye")
    await engine.shutdown()
    print(json.dumps({"per_session": (after - before) / len(sessions)}))

asyncio.run(main())
"""


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="reads RSS from /proc")
def test_an_idle_session_costs_under_10_mb_beyond_the_models() -> None:
    # Its own process: the suite's other engines and models would blur the RSS.
    done = subprocess.run(
        [sys.executable, "-c", IDLE_RSS_SCRIPT], capture_output=True, text=True, timeout=300, check=True
    )
    per_session = json.loads(done.stdout.strip().splitlines()[-1])["per_session"]
    print(f"\nRSS per idle embedded session: {per_session / 1024:.0f} KB")
    assert per_session <= 10 * 1024 * 1024


async def test_session_limit_close_and_events_end() -> None:
    engine = EmbeddedEngine(max_sessions=2, whisper_cpu_threads=2, tts_threads=2)
    with pytest.raises(port.EngineUnavailable):
        await engine.open_session("early", SessionConfig())
    await engine.start()
    try:
        first = await engine.open_session("a", SessionConfig())
        second = await engine.open_session("b", SessionConfig())
        assert engine.active_sessions == 2
        with pytest.raises(port.EngineSessionLimit):
            await engine.open_session("c", SessionConfig())
        await first.close("bye")
        await first.close("again")  # idempotent
        assert engine.active_sessions == 1
        assert await read_until(first.events(), port.EngineClosed) == [port.EngineClosed(reason="bye")]
        third = await engine.open_session("c", SessionConfig())
        await first.append_audio(bytes(CHUNK))  # a closed session ignores input
        await third.close("bye")
        await second.close("bye")
        assert engine.active_sessions == 0
    finally:
        await engine.shutdown()
    assert not engine.ready


async def test_concurrent_opens_respect_the_limit() -> None:
    engine = EmbeddedEngine(max_sessions=2, whisper_cpu_threads=2, tts_threads=2)
    await engine.start()
    try:
        results = await asyncio.gather(
            *(engine.open_session(f"s{i}", SessionConfig()) for i in range(4)), return_exceptions=True
        )
        sessions = [r for r in results if isinstance(r, port.EngineSession)]
        assert len(sessions) == 2
        assert sum(isinstance(r, port.EngineSessionLimit) for r in results) == 2
        for session in sessions:
            await session.close("bye")
    finally:
        await engine.shutdown()


async def test_close_during_a_reply_cancels_it_then_ends(engine: EmbeddedEngine) -> None:
    session = await engine.open_session("closing", SessionConfig())
    await session.add_item(item_id="item_h", role="user", text="Help")
    await session.create_response(response_id="resp_c", instructions=None)
    events = session.events()
    first = await asyncio.wait_for(anext(events), 5)
    assert first == port.EngineResponseStarted(response_id="resp_c")
    await session.close("hang up")
    rest = await read_until(events, port.EngineClosed, timeout=2.0)
    assert rest[-2:] == [
        port.EngineResponseDone(response_id="resp_c", status="cancelled"),
        port.EngineClosed(reason="hang up"),
    ]


async def test_a_speed_update_speeds_up_the_next_reply_and_other_calls_change_nothing(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    async def reply_seconds(session: port.EngineSession, item_id: str) -> float:
        await session.append_audio(speech_pcm)
        await session.commit(item_id=item_id, response_id=f"resp_{item_id}")
        seen = await read_until(session.events(), port.EngineResponseDone)
        assert seen[-1] == port.EngineResponseDone(response_id=f"resp_{item_id}", status="completed")
        return audio_bytes(seen, f"resp_{item_id}") / 2 / engine.capabilities.output_rate

    async with opened(engine, "update") as session:
        normal = await reply_seconds(session, "item_n1")
        await session.update(SessionConfig(speed=1.5))
        # None of these may disturb the session: the next turn is answered as before.
        await session.ack_playback(response_id="resp_item_n1", played_ms=100)
        await session.add_item(item_id="item_s", role="system", text="Be brief.")
        await session.cancel_response("resp_unknown")
        fast = await reply_seconds(session, "item_n2")
    # The same words said half again as fast take about two thirds of the time.
    assert fast < normal * 0.85, (normal, fast)


def test_registry_builds_the_embedded_engine() -> None:
    overrides: dict[str, Any] = {
        "engine.name": "embedded",
        "engine.embedded.max_turn_s": 12.0,
        "engine.embedded.max_sessions": 3,
        "engine.embedded.partials": False,
    }
    settings = load_settings(**overrides)
    engine = build_engine(settings)
    assert isinstance(engine, EmbeddedEngine)
    assert engine.capabilities.max_sessions == 3 and engine.max_turn_s == 12.0 and engine.partials is False
    assert not engine.ready  # building loads nothing; start() does


class CountingTranscriber:
    """Wraps the shared Whisper recognizer to count the transcriptions it runs."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.calls = 0
        self._real = engine.models.final.hear

    def __call__(self, pcm: Any, **options: Any) -> Heard:
        self.calls += 1
        return self._real(pcm, **options)


async def test_a_pause_starts_the_transcription_the_commit_reuses(
    engine: EmbeddedEngine, speech_pcm: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = CountingTranscriber(engine)
    monkeypatch.setattr(engine.models.final, "hear", counter)
    async with opened(engine, "early") as session:
        await speak(session, speech_pcm, pace_s=0)
        await session.caller_paused()
        await session.caller_paused()  # the same pause twice starts nothing new
        await speak(session, bytes(CHUNK * 3), pace_s=0)  # the silence the gateway waits through
        await session.commit(item_id="item_e", response_id=None)
        seen = await read_until(session.events(), port.EngineInputTranscript)
        while not (isinstance(seen[-1], port.EngineInputTranscript) and seen[-1].final):
            seen += await read_until(session.events(), port.EngineInputTranscript)
    assert wer(SPEECH_TEXT, seen[-1].text) <= 0.25  # type: ignore[attr-defined]
    assert counter.calls == 1


async def test_the_words_heard_at_a_pause_stand_as_the_partial_while_the_caller_stays_quiet(
    engine: EmbeddedEngine, speech_pcm: bytes
) -> None:
    # The gateway's semantic_vad reads the partial's last word: Whisper's, not pocketsphinx's guesses.
    async with opened(engine, "words") as session:
        await speak(session, speech_pcm, pace_s=0.01)
        await session.caller_paused()
        for _ in range(15):  # 1.5 s of an open microphone's quiet: pocketsphinx goes on decoding it
            await session.append_audio(bytes(CHUNK))
            await asyncio.sleep(0.1)
        await session.commit(item_id="item_w", response_id=None)
        seen: list[port.EngineEvent] = []
        while not any(isinstance(e, port.EngineInputTranscript) and e.final for e in seen):
            seen += await read_until(session.events(), port.EngineInputTranscript)
    partials = [e for e in seen if isinstance(e, port.EngineInputTranscript) and not e.final]
    final = next(e.text for e in seen if isinstance(e, port.EngineInputTranscript) and e.final)
    assert wer(SPEECH_TEXT, final) <= 0.25, final
    assert partials and partials[-1].text == final, [e.text for e in partials]
    # Whisper says how sure it is of the last word (semantic_vad's words cue reads it); pocketsphinx does not.
    confidence = partials[-1].last_word_confidence
    assert confidence is not None and 0.0 < confidence <= 1.0
    assert any(e.last_word_confidence is None for e in partials[:-1])


async def test_speech_after_the_pause_is_transcribed_afresh(
    engine: EmbeddedEngine, speech_pcm: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = CountingTranscriber(engine)
    monkeypatch.setattr(engine.models.final, "hear", counter)
    half = len(speech_pcm) // 2 // CHUNK * CHUNK
    async with opened(engine, "resumed") as session:
        await speak(session, speech_pcm[:half], pace_s=0)
        await session.caller_paused()
        await speak(session, speech_pcm[half:], pace_s=0)  # the caller went on talking
        await session.commit(item_id="item_f", response_id=None)
        seen: list[port.EngineEvent] = []
        while not any(isinstance(e, port.EngineInputTranscript) and e.final for e in seen):
            seen += await read_until(session.events(), port.EngineInputTranscript)
    final = next(e for e in seen if isinstance(e, port.EngineInputTranscript) and e.final)
    assert wer(SPEECH_TEXT, final.text) <= 0.25, final.text  # both halves, not just the last
    # The guess at the pause is dropped if it had not started by the commit.
    assert counter.calls in (1, 2)


async def test_a_turn_the_recognizer_fails_on_is_reported_and_still_answered(
    engine: EmbeddedEngine, speech_pcm: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(
        pcm: bytes, **options: Any
    ) -> Heard:  # fault injection: the real recognizer, made to fail once
        raise RuntimeError("decoder crashed")

    monkeypatch.setattr(engine.models.final, "hear", broken)
    async with opened(engine, "failing-asr") as session:
        await session.append_audio(speech_pcm[: CHUNK * 10])
        await session.commit(item_id="item_f1", response_id="resp_f1")
        seen = await read_until(session.events(), port.EngineResponseDone)
    failed = [e for e in seen if isinstance(e, port.EngineInputTranscriptFailed)]
    assert failed and failed[0].item_id == "item_f1" and "decoder crashed" in failed[0].message
    assert not [e for e in seen if isinstance(e, port.EngineInputTranscript) and e.final]
    assert not [e for e in seen if isinstance(e, port.EngineError)]
    # The caller is told the turn was not caught, instead of silence.
    assert seen[-1] == port.EngineResponseDone(response_id="resp_f1", status="completed")
    assert DIDNT_CATCH.split()[0].lower() in reply_text(seen).lower()


class HeldTranscriber:
    """The shared Whisper recognizer, recording the audio of each call; the first call waits for ``release``."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.heard: list[bytes] = []
        self.release = threading.Event()
        self._real = engine.models.final.hear

    def __call__(self, pcm: Any, **options: Any) -> Heard:
        if not self.heard:
            self.heard.append(bytes(pcm))
            self.release.wait(20)
        else:
            self.heard.append(bytes(pcm))
        return self._real(pcm, **options)


async def test_a_turn_is_transcribed_from_the_same_audio_whether_or_not_its_pause_guess_had_started(
    engine: EmbeddedEngine, speech_pcm: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whisper's words shift with the silence after them: the commit must not hand it more than the pause did."""
    held = HeldTranscriber(engine)
    monkeypatch.setattr(engine.models.final, "hear", held)
    async with opened(engine, "busy") as other, opened(engine, "queued") as session:
        # Another caller's pause-time guess holds the one thread such guesses may take ...
        await speak(other, speech_pcm, pace_s=0)
        await other.caller_paused()
        async with asyncio.timeout(10):
            while not held.heard:
                await asyncio.sleep(0.01)
        # ... so this caller's guess is still queued when its silence ends the turn.
        await speak(session, speech_pcm, pace_s=0)
        await session.caller_paused()
        await speak(session, bytes(CHUNK * 5), pace_s=0)
        await session.commit(item_id="item_q", response_id=None)
        held.release.set()
        seen: list[port.EngineEvent] = []
        while not any(isinstance(e, port.EngineInputTranscript) and e.final for e in seen):
            seen += await read_until(session.events(), port.EngineInputTranscript)
    final = next(e for e in seen if isinstance(e, port.EngineInputTranscript) and e.final)
    assert wer(SPEECH_TEXT, final.text) <= 0.25, final.text
    # The guess was dropped unstarted; the turn was transcribed from the audio it would have had.
    assert held.heard[1:] == [speech_pcm], [len(pcm) for pcm in held.heard]


async def test_a_guess_the_commit_does_not_reuse_can_no_longer_start_once_it_returns(
    engine: EmbeddedEngine, speech_pcm: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between the commit and the loop's next turn a free worker could start the dropped guess."""
    held = HeldTranscriber(engine)
    monkeypatch.setattr(engine.models.final, "hear", held)
    submitted: list[tuple[Priority, concurrent.futures.Future[Any]]] = []
    submit = engine.submit

    def recording(
        priority: Priority, fn: Any, /, *args: Any, **kwargs: Any
    ) -> concurrent.futures.Future[Any]:
        job = submit(priority, fn, *args, **kwargs)
        submitted.append((priority, job))
        return job

    monkeypatch.setattr(engine, "submit", recording)
    async with opened(engine, "busy") as other, opened(engine, "dropped") as session:
        await speak(other, speech_pcm, pace_s=0)
        await other.caller_paused()  # holds the one thread guesses may take
        async with asyncio.timeout(10):
            while not held.heard:
                await asyncio.sleep(0.01)
        await speak(session, speech_pcm, pace_s=0)
        await session.caller_paused()
        guess = submitted[-1][1]
        assert submitted[-1][0] is Priority.EARLY and not guess.running()
        await session.commit(item_id="item_d", response_id=None)
        # No await between: this is the moment a worker freed now would take the guess.
        cancelled_at_commit = guess.cancelled()
        held.release.set()
        seen: list[port.EngineEvent] = []
        while not any(isinstance(e, port.EngineInputTranscript) and e.final for e in seen):
            seen += await read_until(session.events(), port.EngineInputTranscript)
    assert cancelled_at_commit
    assert len(held.heard) == 2, [len(pcm) for pcm in held.heard]  # the other's guess, and this turn once
