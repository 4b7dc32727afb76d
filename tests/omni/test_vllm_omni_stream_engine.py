"""Engine ``vllm-omni-stream``: turn-based streaming input on a real ``AsyncOmni``, behind a real gateway.

The gateway process runs ``serve --engine vllm-omni-stream --omni-factory
tests.omni.fake_stage:async_omni``; the fake stage records every engine-side call
(``FAKE_OMNI_CALL_LOG``), so the tests check the request protocol the engine was
driven with: ``add_request(resumable=True)`` -> ``add_streaming_update(resumable=True)*``
-> ``add_streaming_update(TokensPrompt([0]), resumable=False)``, one engine chunk per
audio delta, and ``abort_async`` acknowledged on barge-in.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from openai import AsyncOpenAI

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    load_speech,
    send_json,
    speech_turn,
    stream_audio,
    ws_connect,
)
from tests.omni.conftest import CHUNK_DELAY_MS, CHUNKS, read_calls, start_omni_gateway, wait_calls

pytestmark = pytest.mark.e2e

TURN_S = 1.5
FRAME = 4800  # 100 ms of 24 kHz PCM16


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory, calls_path: Path) -> Gateway:
    return start_omni_gateway(
        module_gateway_factory,
        engine="vllm-omni-stream",
        omni_factory="tests.omni.fake_stage:async_omni",
        calls=calls_path,
        name="vllm-omni-stream",
        config={"limits": {"input_rate_factor": 50, "input_burst_ms": 60_000}},
    )


class TimedLog(EventLog):
    """An :class:`EventLog` that also notes when each event arrived (``time.monotonic``).

    The fake stage stamps its calls with the same system-wide monotonic clock.
    """

    def __init__(self, recv: Callable[[], Awaitable[str | bytes]]) -> None:
        self.received: list[float] = []

        async def timed() -> str | bytes:
            message = await recv()
            self.received.append(time.monotonic())
            return message

        super().__init__(timed)


@contextlib.asynccontextmanager
async def manual_session(gw: Gateway) -> AsyncIterator[tuple[Any, TimedLog]]:
    """A ``/v1/realtime`` session with turn detection off: the client commits its turns."""
    async with ws_connect(gw) as ws:
        log = TimedLog(ws.recv)
        try:
            await log.wait_for("session.created", 10)
            await send_json(
                ws,
                {
                    "type": "session.update",
                    "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
                },
            )
            await log.wait_for("session.updated", 5)
            yield ws, log
        finally:
            await log.aclose()


async def _round_trip(ws: Any, log: EventLog) -> None:
    """Wait until the gateway answers a message sent now: everything it sent before is in ``log``."""
    start = len(log.events)
    await send_json(ws, {"type": "session.heartbeat"})
    await log.wait_for("session.heartbeat_ack", 5, start=start)


def _speech(seconds: float, offset_s: float = 0.5) -> bytes:
    speech = load_speech()[int(offset_s * 24000) * 2 :]
    return speech[: int(seconds * 24000) * 2]


async def _append(ws: Any, pcm: bytes) -> None:
    """Append ``pcm`` in 100 ms frames, 10 ms apart (ten times real time): the engine takes it
    as it comes, in several updates, instead of as one append coalesced behind a busy engine."""
    for offset in range(0, len(pcm), FRAME):
        await send_json(ws, {"type": "input_audio_buffer.append", "audio": b64(pcm[offset : offset + FRAME])})
        await asyncio.sleep(0.01)


async def _text_item(ws: Any, log: EventLog, text: str) -> None:
    start = len(log.events)
    await send_json(
        ws,
        {
            "type": "conversation.item.create",
            "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]},
        },
    )
    await log.wait_for(
        lambda e: e["type"] in ("conversation.item.added", "conversation.item.created"), 5, start=start
    )


async def _reply(ws: Any, log: EventLog) -> dict[str, Any]:
    """Ask for a reply and wait for its ``response.done``."""
    start = len(log.events)
    await send_json(ws, {"type": "response.create"})
    index, created = await log.wait_for("response.created", 5, start=start)
    rid = created["response"]["id"]
    _, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 10, start=index
    )
    return done


async def turn(ws: Any, log: EventLog) -> tuple[int, str]:
    """Append a turn, commit it, ask for a reply: (index of response.created, response id)."""
    speech = load_speech()[int(0.5 * 24000) * 2 :][: int(TURN_S * 24000) * 2]
    start = len(log.events)
    await _append(ws, speech)
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    index, _ = await log.wait_for("input_audio_buffer.committed", 5, start=start)
    await send_json(ws, {"type": "response.create"})
    index, created = await log.wait_for("response.created", 5, start=index)
    return index, created["response"]["id"]


def requests_of(calls: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Engine-level calls per request id, in order."""
    by_id: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        if call["call"] in ("add_request", "add_streaming_update", "abort_async", "abort_async.result"):
            for rid in call.get("request_ids") or [call.get("request_id")]:
                by_id.setdefault(rid, []).append(call)
    return by_id


async def test_turns_stream_as_resumable_requests_and_barge_in_aborts(
    gateway: Gateway, calls_path: Path
) -> None:
    before = len(read_calls(calls_path))
    async with manual_session(gateway) as (ws, log):
        # -- one turn: streamed in, answered chunk by chunk
        i_created, rid = await turn(ws, log)
        i_done, done = await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 10, start=i_created
        )
        assert done["response"]["status"] == "completed", done
        deltas = [e for e in log.events[i_created:i_done] if e["type"] == "response.output_audio.delta"]
        transcript = "".join(
            e["delta"]
            for e in log.events[i_created:i_done]
            if e["type"] == "response.output_audio_transcript.delta"
        )
        assert transcript == f"(echo of {TURN_S:.1f} s of your audio)", transcript
        echoed = sum(len(base64.b64decode(e["delta"])) for e in deltas) / 2 / 24_000
        assert abs(echoed - TURN_S) < 0.05, echoed

        calls = read_calls(calls_path)[before:]
        chunks = [c for c in calls if c["call"] == "stage.chunk"]
        assert len(chunks) == CHUNKS
        # Each engine chunk is its own audio delta, the same size, in the same order.
        assert [len(base64.b64decode(e["delta"])) // 2 for e in deltas] == [c["samples"] for c in chunks]
        # ... and each was forwarded as it came: the first reached the client before the
        # stage had produced the last (chunks are CHUNK_DELAY_MS apart), each one before
        # the stage produced the one after next.
        arrivals = [log.received[log.events.index(e)] for e in deltas]
        produced = [c["t"] for c in chunks]
        assert arrivals[0] < produced[-1], (arrivals, produced)
        assert all(arrivals[i] < produced[i + 2] for i in range(CHUNKS - 2)), (arrivals, produced)

        # The request protocol: add_request(resumable) -> updates(resumable) -> end marker.
        (request_id,) = {c["request_id"] for c in chunks}
        sequence = requests_of(calls)[request_id]
        kinds = [(c["call"], c["resumable"], c["prompt"]) for c in sequence]
        assert kinds[0] == ("add_request", True, "audio"), kinds
        assert kinds[-1] == ("add_streaming_update", False, "tokens"), kinds
        assert sequence[-1]["token_ids"] == [0]
        assert all(k == ("add_streaming_update", True, "audio") for k in kinds[1:-1]), kinds
        assert len(kinds) >= 3, kinds
        # The turn's audio, at the engine's 16 kHz (the gateway's 24 -> 16 kHz resampler may
        # still hold its last few tens of ms at the commit).
        sent = sum(c["samples"] for c in sequence[:-1])
        assert int((TURN_S - 0.05) * 16_000) <= sent <= int(TURN_S * 16_000), sent

        # -- barge-in while the next reply plays: aborted in the engine, acknowledged, fenced
        mark = len(read_calls(calls_path))
        mark_results = len([c for c in read_calls(calls_path) if c["call"] == "abort_async.result"])
        i_created, rid = await turn(ws, log)
        await log.wait_for(
            lambda e: e["type"] == "response.output_audio.delta" and e["response_id"] == rid,
            5,
            start=i_created,
        )
        await send_json(ws, {"type": "barge_in"})
        i_done, done = await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 5, start=i_created
        )
        assert done["response"]["status"] == "cancelled", done
        # The engine acknowledged the abort: the stage produces nothing more for the reply.
        await wait_calls(calls_path, lambda c: c["call"] == "abort_async.result", count=mark_results + 1)
        # Deliberately let time pass: a chunk produced before the abort may still be on its
        # way through vLLM-Omni; none may reach the client.
        await asyncio.sleep(2 * CHUNK_DELAY_MS / 1000)
        await _round_trip(ws, log)
        late = [e["type"] for e in log.events[i_done + 1 :] if e.get("response_id") == rid]
        assert not late, f"events of the barged-in response after its response.done: {late}"
        calls = read_calls(calls_path)[mark:]
        aborts = [c for c in calls if c["call"] == "abort_async"]
        results = [c for c in calls if c["call"] == "abort_async.result"]
        assert len(aborts) == 1 and len(results) == 1, calls
        assert results[0]["ok"] is True and results[0]["request_ids"] == aborts[0]["request_ids"]
        (aborted,) = aborts[0]["request_ids"]
        stage_chunks = [c for c in calls if c["call"] == "stage.chunk" and c["request_id"] == aborted]
        assert 0 < len(stage_chunks) < CHUNKS, "the reply was stopped in the stage, mid-way"
        assert [c for c in calls if c["call"] == "stage.abort" and aborted in c["request_ids"]]

        # -- a cancel works the same, and the session still answers afterwards
        i_created, rid = await turn(ws, log)
        await log.wait_for(
            lambda e: e["type"] == "response.output_audio.delta" and e["response_id"] == rid,
            5,
            start=i_created,
        )
        await send_json(ws, {"type": "response.cancel"})
        await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 5, start=i_created
        )
        i_created, rid = await turn(ws, log)
        _, done = await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 10, start=i_created
        )
        assert done["response"]["status"] == "completed"
        assert not [e for e in log.events if e["type"] == "error"], [
            e for e in log.events if e["type"] == "error"
        ]
    body = await gateway.wait_sessions(0)
    assert body["status"] == "ready"


async def test_openai_sdk_server_vad_turn(gateway: Gateway, calls_path: Path) -> None:
    """The gateway's VAD finds the turn's end; the engine gets it as one streamed request."""
    before = len(read_calls(calls_path))
    client = AsyncOpenAI(api_key="test", websocket_base_url=f"ws://127.0.0.1:{gateway.port}/v1")
    async with client.realtime.connect(model="gpt-realtime") as conn:
        log = EventLog(conn.recv_bytes)
        try:
            await log.wait_for("session.created", 10)
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {
                        "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 400}}
                    },
                }
            )
            await log.wait_for("session.updated", 5)
            await stream_audio(
                conn, speech_turn(before_ms=400, after_ms=900), speed=1.4, lead_ms=1500, timeout=30
            )
            _, started = await log.wait_for("input_audio_buffer.speech_started", 10)
            _, stopped = await log.wait_for("input_audio_buffer.speech_stopped", 10)
            i_created, created = await log.wait_for("response.created", 10)
            rid = created["response"]["id"]
            i_done, done = await log.wait_for(
                lambda e: e["type"] == "response.done" and e["response"]["id"] == rid, 15, start=i_created
            )
            assert done["response"]["status"] == "completed"
            audio = [e for e in log.events[i_created:i_done] if e["type"] == "response.output_audio.delta"]
            assert len(audio) == CHUNKS
        finally:
            await log.aclose()
    await client.close()
    await gateway.wait_sessions(0)
    # The VAD's turn reached the engine as one streamed request, ended by the end marker ...
    requests = requests_of(read_calls(calls_path)[before:])
    assert len(requests) == 1, list(requests)
    (sequence,) = requests.values()
    kinds = [(c["call"], c["resumable"], c["prompt"]) for c in sequence]
    assert kinds[0] == ("add_request", True, "audio"), kinds
    assert kinds[-1] == ("add_streaming_update", False, "tokens"), kinds
    assert all(k == ("add_streaming_update", True, "audio") for k in kinds[1:-1]), kinds
    # ... carrying the turn the VAD found, prefix padding included, at the engine's 16 kHz.
    sent_ms = sum(c["samples"] for c in sequence[:-1]) / 16
    turn_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
    assert abs(sent_ms - turn_ms) <= 100, (sent_ms, turn_ms)


def _turn_requests(calls: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The engine requests that got audio, in order, each as its engine-level calls."""
    return [seq for seq in requests_of(calls).values() if seq[0]["call"] == "add_request"]


async def test_requests_stream_deltas_and_carry_the_conversation(gateway: Gateway, calls_path: Path) -> None:
    """DELTA sampling params, the prompt once per turn, and the conversation in the next turn's prompt."""
    before = len(read_calls(calls_path))
    async with manual_session(gateway) as (ws, log):
        start = len(log.events)
        await send_json(
            ws, {"type": "session.update", "session": {"type": "realtime", "instructions": "Answer briefly."}}
        )
        await log.wait_for("session.updated", 5, start=start)
        await _text_item(ws, log, "My name is Ada.")
        for _ in range(2):
            i_created, rid = await turn(ws, log)
            _, done = await log.wait_for(
                lambda e, rid=rid: e["type"] == "response.done" and e["response"]["id"] == rid,
                10,
                start=i_created,
            )
            assert done["response"]["status"] == "completed", done
    await gateway.wait_sessions(0)
    calls = read_calls(calls_path)[before:]
    first, second = _turn_requests(calls)

    # What stage 0 received: DELTA outputs (vLLM's CUMULATIVE default would re-send the whole
    # reply in every chunk), one sample, no stop strings -- vLLM-Omni's streaming-input contract.
    stage = [
        c
        for c in calls
        if c["call"] == "stage.add_request"
        and c["request_id"] in (first[0]["request_id"], second[0]["request_id"])
    ]
    assert len(stage) == len(first) + len(second), stage
    assert {(c["output_kind"], c["n"], tuple(c["stop"])) for c in stage} == {("DELTA", 1, ())}, stage

    # The prompt goes with the turn's first chunk only; later chunks carry audio alone.
    for sequence in (first, second):
        audio = [c for c in sequence if c["prompt"] == "audio"]
        assert len(audio) >= 3, audio
        assert audio[0]["call"] == "add_request" and audio[0]["text"], audio[0]
        assert all(c["text"] == "" for c in audio[1:]), [c["text"] for c in audio]

    # The first turn's prompt: the instructions and the text item; the second's also the first
    # turn (the caller's audio turn, then the reply by its transcript).
    prompt1, prompt2 = first[0]["text"], second[0]["text"]
    assert "Answer briefly." in prompt1 and "My name is Ada." in prompt1, prompt1
    assert prompt1.index("Answer briefly.") < prompt1.index("My name is Ada."), prompt1
    reply = f"(echo of {TURN_S:.1f} s of your audio)"
    assert reply not in prompt1, prompt1
    assert prompt2.startswith(prompt1.removesuffix("<|im_start|>user\n")), (prompt1, prompt2)
    assert (
        "<|im_start|>user\n<|im_end|>" in prompt2 and f"<|im_start|>assistant\n{reply}<|im_end|>" in prompt2
    ), prompt2


async def test_clear_drops_only_uncommitted_audio_and_keeps_the_conversation(
    gateway: Gateway, calls_path: Path
) -> None:
    before = len(read_calls(calls_path))
    async with manual_session(gateway) as (ws, log):
        await _text_item(ws, log, "Remember the word kiwi.")
        # Committed audio survives a clear; only what came after the commit is dropped.
        await _append(ws, _speech(1.0))
        start = len(log.events)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await log.wait_for("input_audio_buffer.committed", 5, start=start)
        await _append(ws, _speech(0.5, offset_s=2.0))
        start = len(log.events)
        await send_json(ws, {"type": "input_audio_buffer.clear"})
        await log.wait_for("input_audio_buffer.cleared", 5, start=start)
        done = await _reply(ws, log)
        assert done["response"]["status"] == "completed", done
        text = "".join(
            e["delta"] for e in log.events if e["type"] == "response.output_audio_transcript.delta"
        )
        assert text == "(echo of 1.0 s of your audio)", text

        # A clear of a turn nobody committed drops that audio -- and nothing of the conversation.
        mark = len(read_calls(calls_path))
        await _append(ws, _speech(0.6, offset_s=2.5))
        await wait_calls(
            calls_path,
            lambda c: c["call"] == "add_request",
            count=len([c for c in read_calls(calls_path)[:mark] if c["call"] == "add_request"]) + 1,
        )
        start = len(log.events)
        await send_json(ws, {"type": "input_audio_buffer.clear"})
        await log.wait_for("input_audio_buffer.cleared", 5, start=start)
        await _append(ws, _speech(0.8))
        start = len(log.events)
        await send_json(ws, {"type": "input_audio_buffer.commit"})
        await log.wait_for("input_audio_buffer.committed", 5, start=start)
        done = await _reply(ws, log)
        assert done["response"]["status"] == "completed", done
    await gateway.wait_sessions(0)
    calls = read_calls(calls_path)[before:]
    first, cleared, last = _turn_requests(calls)
    # The first turn: the committed second only (16 kHz), not the half second after the commit.
    sent = sum(c["samples"] for c in first if c["prompt"] == "audio")
    assert int(0.95 * 16_000) <= sent <= 16_000, sent
    # The uncommitted turn was aborted in the engine.
    assert [c for c in cleared if c["call"] == "abort_async"], cleared
    # The last turn's prompt still holds the text item and the first exchange.
    prompt = last[0]["text"]
    assert "Remember the word kiwi." in prompt, prompt
    assert "<|im_start|>assistant\n(echo of 1.0 s of your audio)<|im_end|>" in prompt, prompt


async def test_tools_are_not_offered_and_a_forced_call_is_refused(gateway: Gateway) -> None:
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        try:
            _, created = await log.wait_for("session.created", 10)
            assert created["session"]["capabilities"]["function_calling"] is False
            weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
            await send_json(
                ws,
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "tools": [weather],
                        "tool_choice": "required",
                    },
                },
            )
            _, error = await log.wait_for("error", 5)
            assert (error["error"]["code"], error["error"]["param"]) == (
                "unsupported_by_engine",
                "session.tool_choice",
            )
            # Offered with "auto", tools are taken (and never called).
            start = len(log.events)
            await send_json(
                ws, {"type": "session.update", "session": {"tools": [weather], "tool_choice": "auto"}}
            )
            _, updated = await log.wait_for("session.updated", 5, start=start)
            assert [t["name"] for t in updated["session"]["tools"]] == ["get_weather"]
        finally:
            await log.aclose()
    await gateway.wait_sessions(0)
