"""Every wire format and rate, end to end: the echo must be the caller's turn, intact.

The caller streams the speech fixture (silence, speech, silence) in 20 ms frames in
one input format/rate; server VAD finds the turn; the echo engine answers with it;
the reply arrives in the session's output format/rate. Checked against a pcm16
24 kHz baseline run on the same gateway: the turn boundaries match, the reply starts
where ``speech_started.audio_start_ms`` says (so the prefix padding is in it) and
sounds like the input (cross-correlation). The baseline itself is checked against where
the fixture's speech is.

The embedded engine speaks at 22.05 kHz (Piper): an echo engine at that rate checks
that such output reaches every client rate, whole and in place.

VAD and turns run on the audio clock, so the audio is sent as fast as the socket
takes it (the gateway paces it with backpressure) and the echo comes back unpaced.

Interrupting a reply at every output format and rate: after ``speech_started``,
``response.cancel`` or ``output_audio_buffer.clear`` not one more delta of that
reply reaches the client, not even the output resampler's held-back tail.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import soxr

from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    audio_of,
    b64,
    bytes_per_sample,
    decode,
    done_of,
    is_delta_of,
    load_speech,
    send_json,
    silence,
    stream_audio,
    wait_answered_turn,
    ws_connect,
)
from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS

pytestmark = pytest.mark.e2e

GA_TYPE = {
    "pcm16": "audio/pcm",
    "pcm_f32le": "audio/pcm_f32le",
    "g711_ulaw": "audio/pcmu",
    "g711_alaw": "audio/pcma",
}
BEFORE_MS, AFTER_MS = 1000, 1000
# The gateway's default server VAD settings (configs/default.yaml).
PREFIX_PADDING_MS, SILENCE_DURATION_MS = 300, 500


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 0}},
        },
        name="formats",
    )


def _lag(reply: np.ndarray, reference: np.ndarray) -> tuple[int, float]:
    """Where ``reply`` best fits inside ``reference`` (samples) and the normalised correlation there."""
    n = len(reply) + len(reference)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(reference, size) * np.conj(np.fft.rfft(reply, size)), size)
    lag = int(np.argmax(corr[: len(reference)]))
    window = reference[lag : lag + len(reply)]
    m = min(len(window), len(reply))
    a, b = reply[:m], window[:m]
    return lag, float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))


def _to_24k(samples: np.ndarray, rate: int) -> np.ndarray:
    return samples if rate == 24000 else soxr.resample(samples, rate, 24000).astype(np.float32)


async def echo_turn(gw: Gateway, in_fmt: str, in_rate: int, out_fmt: str, out_rate: int) -> dict[str, Any]:
    """Stream one turn in (in_fmt, in_rate); measure the echo in (out_fmt, out_rate)."""
    stream = (
        silence(BEFORE_MS, in_rate, in_fmt)
        + load_speech(in_rate, in_fmt)
        + silence(AFTER_MS, in_rate, in_fmt)
    )
    async with ws_connect(gw) as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 5)
            await send_json(
                ws,
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {
                            "input": {"format": {"type": GA_TYPE[in_fmt], "rate": in_rate}},
                            "output": {"format": {"type": GA_TYPE[out_fmt], "rate": out_rate}},
                        },
                    },
                },
            )
            _, updated = await log.wait_for("session.updated", 5)
            audio = updated["session"]["audio"]
            assert audio["input"]["format"]["type"] == GA_TYPE[in_fmt]
            assert audio["input"]["format"].get("rate", 8000) == in_rate
            assert audio["output"]["format"]["type"] == GA_TYPE[out_fmt]
            assert audio["output"]["format"].get("rate", 8000) == out_rate
            await stream_audio(ws, stream, frame_ms=20, realtime=False, rate=in_rate, fmt=in_fmt, timeout=30)
            turn = await wait_answered_turn(log, 10)
            started, stopped = turn.started, turn.stopped
            assert turn.done["response"]["status"] == "completed", turn.done
            deltas = [e for e in turn.reply_events if e["type"] == "response.output_audio.delta"]
            assert {d["sample_rate_hz"] for d in deltas} == {out_rate}
            reply = audio_of(turn.reply_events, turn.response_id)
            assert not [e for e in log.events if e["type"] == "error"]
        finally:
            await log.aclose()
    assert len(reply) % bytes_per_sample(out_fmt) == 0
    reply_24k = _to_24k(decode(reply, out_fmt), out_rate)
    reference = _to_24k(decode(stream, in_fmt), in_rate)
    lag, similarity = await asyncio.to_thread(_lag, reply_24k, reference)
    return {
        "start": started["audio_start_ms"],
        "end": stopped["audio_end_ms"],
        "reply_ms": len(reply) / bytes_per_sample(out_fmt) * 1000 / out_rate,
        "reply_start_ms": lag / 24,
        "similarity": similarity,
    }


@pytest.fixture(scope="module")
def baseline(gateway: Gateway) -> dict[str, Any]:
    """The pcm16 24 kHz turn (the engine's own format: no conversion anywhere)."""
    result = asyncio.run(echo_turn(gateway, "pcm16", 24000, "pcm16", 24000))
    assert BEFORE_MS - 300 <= result["start"] <= BEFORE_MS + 1000, result
    return result


def _check(result: dict[str, Any], baseline: dict[str, Any], min_similarity: float) -> None:
    # VAD windows are 32 ms: the same speech gives the same turn at any rate/format.
    assert abs(result["start"] - baseline["start"]) <= 64, (result, baseline)
    assert abs(result["end"] - baseline["end"]) <= 128, (result, baseline)
    turn_ms = result["end"] - result["start"]
    assert -100 <= result["reply_ms"] - turn_ms <= 250, result
    # The reply begins where speech_started says the turn begins (prefix padding included).
    assert -120 <= result["reply_start_ms"] - result["start"] <= 60, result
    assert result["similarity"] >= min_similarity, result


def test_baseline_pcm16_24k(baseline: dict[str, Any]) -> None:
    """The baseline the other cases are compared with finds the fixture's own speech."""
    speech_start, speech_end = BEFORE_MS + SPEECH_START_MS, BEFORE_MS + SPEECH_END_MS
    # The turn starts prefix_padding_ms before the speech (VAD windows are 32 ms) ...
    assert 0 <= baseline["start"] - (speech_start - PREFIX_PADDING_MS) <= 96, baseline
    # ... and ends once silence_duration_ms of silence has followed it.
    assert 0 <= baseline["end"] - (speech_end + SILENCE_DURATION_MS) <= 128, baseline
    _check(baseline, baseline, 0.99)


@pytest.mark.parametrize(
    ("in_fmt", "in_rate", "out_fmt", "out_rate", "min_similarity"),
    [
        pytest.param("pcm16", 24000, "g711_ulaw", 8000, 0.9, id="out-ulaw-8k"),
        pytest.param("pcm16", 24000, "pcm_f32le", 48000, 0.99, id="out-f32-48k"),
        pytest.param("pcm16", 24000, "pcm16", 16000, 0.95, id="out-pcm16-16k"),
        pytest.param(
            "pcm16",
            16000,
            "pcm16",
            24000,
            0.99,
            id="in-pcm16-16k",
        ),
        pytest.param(
            "pcm_f32le",
            48000,
            "pcm16",
            24000,
            0.99,
            id="in-f32-48k",
        ),
        pytest.param(
            "g711_ulaw",
            8000,
            "g711_ulaw",
            8000,
            0.9,
            id="ulaw-8k-both-ways",
        ),
        pytest.param(
            "g711_alaw",
            8000,
            "pcm16",
            16000,
            0.9,
            id="in-alaw-8k",
        ),
        pytest.param("pcm16", 24000, "g711_alaw", 8000, 0.9, id="out-alaw-8k"),
        pytest.param("g711_alaw", 8000, "g711_alaw", 16000, 0.9, id="alaw-8k-in-16k-out"),
    ],
)
async def test_formats_and_rates(
    gateway: Gateway,
    baseline: dict[str, Any],
    in_fmt: str,
    in_rate: int,
    out_fmt: str,
    out_rate: int,
    min_similarity: float,
) -> None:
    result = await echo_turn(gateway, in_fmt, in_rate, out_fmt, out_rate)
    _check(result, baseline, min_similarity)
    await gateway.wait_sessions(0)


@pytest.fixture(scope="module")
def gateway_22k(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 0, "rate": 22050}}},
        name="formats-22k",
    )


@pytest.mark.parametrize(
    ("in_fmt", "in_rate", "out_fmt", "out_rate", "min_similarity"),
    [
        pytest.param("pcm16", 24000, "pcm16", 24000, 0.98, id="pcm16-24k"),
        pytest.param("pcm16", 16000, "pcm16", 16000, 0.95, id="pcm16-16k"),
        pytest.param("pcm16", 24000, "pcm_f32le", 48000, 0.98, id="out-f32-48k"),
        pytest.param("g711_alaw", 8000, "g711_alaw", 8000, 0.9, id="alaw-8k"),
    ],
)
async def test_engine_output_at_22050_hz_reaches_the_clients_rate(
    gateway_22k: Gateway,
    baseline: dict[str, Any],
    in_fmt: str,
    in_rate: int,
    out_fmt: str,
    out_rate: int,
    min_similarity: float,
) -> None:
    result = await echo_turn(gateway_22k, in_fmt, in_rate, out_fmt, out_rate)
    _check(result, baseline, min_similarity)
    await gateway_22k.wait_sessions(0)


# ---------------------------------------------------------------------------------------
# Interrupted replies: nothing of them after the trigger, at any output format and rate


@pytest.fixture(scope="module")
def paced_gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    # Echo chunks of 1 s at real-time pace: a reply is still playing when the caller interrupts
    # it, and a reply of one chunk has all its audio out a second before it ends.
    return module_gateway_factory.start(
        {"server": {"web_demo": False}, "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 1000}}},
        name="interrupt",
    )


# The echo engine speaks at 24 kHz: every other rate goes through the output resampler.
OUTPUTS = [
    pytest.param(fmt, rate, id=f"{fmt}-{rate // 1000}k")
    for fmt, rate in [
        ("pcm16", 8000),
        ("pcm16", 16000),
        ("pcm16", 24000),
        ("pcm16", 48000),
        ("pcm_f32le", 16000),
        ("pcm_f32le", 24000),
        ("pcm_f32le", 48000),
        ("g711_ulaw", 8000),
        ("g711_alaw", 8000),
        ("g711_alaw", 16000),
    ]
]


async def _configure(ws: Any, log: EventLog, out_fmt: str, out_rate: int, *, vad: bool) -> None:
    audio: dict[str, Any] = {"output": {"format": {"type": GA_TYPE[out_fmt], "rate": out_rate}}}
    if not vad:
        audio["input"] = {"turn_detection": None}
    start = len(log.events)
    await send_json(ws, {"type": "session.update", "session": {"type": "realtime", "audio": audio}})
    await log.wait_for("session.updated", 5, start=start)


def _stale(log: EventLog, response_id: str, after: int) -> list[str]:
    return [
        f"{e['type']} #{i}" for i, e in enumerate(log.events) if i > after and is_delta_of(response_id)(e)
    ]


@pytest.mark.parametrize(("out_fmt", "out_rate"), OUTPUTS)
async def test_barge_in_sends_nothing_more_of_the_reply(
    paced_gateway: Gateway, out_fmt: str, out_rate: int
) -> None:
    await _barge_in(paced_gateway, out_fmt, out_rate)


@pytest.fixture(scope="module")
def paced_gateway_22k(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0, "chunk_ms": 1000, "rate": 22050}},
        },
        name="interrupt-22k",
    )


@pytest.mark.parametrize(("out_fmt", "out_rate"), [("pcm16", 24000), ("g711_alaw", 8000)])
async def test_barge_in_sends_nothing_more_of_a_22050_hz_reply(
    paced_gateway_22k: Gateway, out_fmt: str, out_rate: int
) -> None:
    """The embedded engine's rate: its output goes through the resampler at every client rate."""
    await _barge_in(paced_gateway_22k, out_fmt, out_rate)


async def _barge_in(gw: Gateway, out_fmt: str, out_rate: int) -> None:
    async with ws_connect(gw) as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 5)
            await _configure(ws, log, out_fmt, out_rate, vad=True)
            await stream_audio(ws, silence(300) + load_speech() + silence(1000), realtime=False)
            i_created, created = await log.wait_for("response.created", 10)
            response_id = created["response"]["id"]
            await log.wait_for(is_delta_of(response_id), 5, start=i_created)
            mark = len(log.events)
            # The caller talks over the reply (≈5 s of echo, one delta a second).
            await stream_audio(ws, load_speech(), realtime=False)
            i_speech, _ = await log.wait_for("input_audio_buffer.speech_started", 10, start=mark)
            _, done = await log.wait_for(done_of(response_id), 5, start=i_speech)
            assert done["response"]["status"] == "cancelled", done
            # Everything the gateway sent up to here, including what followed response.done.
            await _round_trip(ws, log)
            stale = _stale(log, response_id, i_speech)
            assert not stale, (
                f"audio of the interrupted reply after speech_started: {stale}; {log.types(i_speech)}"
            )
            assert not [e for e in log.events if e["type"] == "error"]
        finally:
            await log.aclose()


async def _round_trip(ws: Any, log: EventLog) -> None:
    """Wait until the gateway has answered a message sent now: all it sent before is in ``log``."""
    start = len(log.events)
    await send_json(ws, {"type": "session.heartbeat", "event_id": "evt_marker"})
    await log.wait_for("session.heartbeat_ack", 5, start=start)


@pytest.mark.parametrize("trigger", ["response.cancel", "output_audio_buffer.clear"])
@pytest.mark.parametrize(("out_fmt", "out_rate"), OUTPUTS)
async def test_cancel_and_clear_send_nothing_more_of_the_reply(
    paced_gateway: Gateway, out_fmt: str, out_rate: int, trigger: str
) -> None:
    async with ws_connect(paced_gateway) as ws:
        log = EventLog(ws.recv)
        try:
            await log.wait_for("session.created", 5)
            await _configure(ws, log, out_fmt, out_rate, vad=False)
            # Half a second of speech: the echo sends it as one chunk, then plays it for a second.
            await stream_audio(ws, load_speech()[24000 : 24000 * 2], realtime=False)
            await send_json(ws, {"type": "input_audio_buffer.commit"})
            await send_json(ws, {"type": "response.create"})
            i_created, created = await log.wait_for("response.created", 5)
            response_id = created["response"]["id"]
            # The engine has nothing more to send: any later delta of this reply is stale.
            mark, _ = await log.wait_for(is_delta_of(response_id), 5, start=i_created)
            await send_json(ws, {"type": trigger})
            _, done = await log.wait_for(done_of(response_id), 5, start=mark)
            assert done["response"]["status"] == "cancelled", (
                f"the reply ended before the gateway handled {trigger}: {done}"
            )
            await _round_trip(ws, log)
            stale = _stale(log, response_id, mark)
            assert not stale, f"audio of the reply after {trigger}: {stale}; {log.types(mark)}"
            assert not [e for e in log.events if e["type"] == "error"]
        finally:
            await log.aclose()


async def test_a_chunk_declared_in_its_own_format_is_converted(gateway: Gateway) -> None:
    """vLLM-Omni's per-chunk ``format`` / ``sample_rate_hz``: telephone audio into a 24 kHz session."""
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await send_json(
            ws,
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            },
        )
        await log.wait_for("session.updated")
        ulaw = load_speech(8_000, "g711_ulaw")
        for offset in range(0, len(ulaw), 1600):  # 200 ms chunks, each saying what it is
            chunk = ulaw[offset : offset + 1600]
            await send_json(
                ws,
                {
                    "type": "input_audio_buffer.append",
                    "audio": b64(chunk),
                    "format": "g711_ulaw",
                    "sample_rate_hz": 8000,
                    "is_speech": True,
                },
            )
        await send_json(ws, {"type": "input_audio_buffer.commit", "response_create": True})
        _, done = await log.wait_for("response.done", timeout=20)
        assert not [e for e in log.events if e["type"] == "error"], log.events
        reply = decode(audio_of(log.events, done["response"]["id"]))  # pcm16 at 24 kHz
        sent = soxr.resample(decode(ulaw, "g711_ulaw"), 8_000, 24_000)
        assert abs(len(reply) - len(sent)) < 24_000 * 0.05
        n = min(len(reply), len(sent))
        similarity = float(np.corrcoef(reply[:n], sent[:n])[0, 1])
        assert similarity > 0.9, similarity
        await log.aclose()
    await gateway.wait_sessions(0)
