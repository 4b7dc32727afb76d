"""The embedded CPU engine through a real gateway: real speech in, a spoken reply out, barge-in.

The gateway is started with its default configuration file (the embedded engine,
as ``make run`` does), and clients speak the fixture sentence "Please send me the
weather report for Tuesday morning." in real time.
"""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile
import soxr

from tests.e2e.helpers import (
    PYTHON,
    REPO,
    EventLog,
    Gateway,
    GatewayFactory,
    audio_of,
    encode,
    gateway_env,
    load_speech,
    silence,
    speech_turn,
    stream_audio,
    ws_connect,
)
from tests.fixtures import PHRASES, SPEECH_TEXT
from tests.fixtures import load_speech as load_fixture_speech
from tests.wer import corpus_wer, wer

pytestmark = pytest.mark.e2e

FIXTURE = REPO / "tests" / "fixtures" / "speech_16k.wav"


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    config: dict[str, Any] = {
        "server": {"web_demo": False},
        "engine": {"name": "embedded"},
        "limits": {"max_sessions": 4},
    }
    return module_gateway_factory.start(config, name="embedded")


def test_default_config_runs_the_embedded_engine(gateway: Gateway) -> None:
    body = gateway.readyz()
    assert body["engine"] == "embedded" and body["status"] == "ready"


def _transcripts(events: list[dict[str, Any]]) -> tuple[list[str], str]:
    partials = [
        e["delta"] for e in events if e["type"] == "conversation.item.input_audio_transcription.delta"
    ]
    finals = [
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    return partials, " ".join(finals)


async def test_spoken_turn_is_heard_and_answered_aloud(gateway: Gateway) -> None:
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await ws.send(
            '{"type":"session.update","session":{"type":"realtime","audio":{"input":'
            '{"transcription":{"model":"whisper-1"}}}}}'
        )
        await log.wait_for("session.updated")
        await stream_audio(ws, speech_turn(24_000), realtime=True)
        _, done = await log.wait_for("response.done", timeout=30)
        events = log.events
        partials, final = _transcripts(events)
        assert partials, "no partial transcript while the caller spoke"
        assert wer(SPEECH_TEXT, final) <= 0.25, final
        # Partials arrive before the turn ends; the final after it.
        first_partial = next(i for i, e in enumerate(events) if e["type"].endswith("transcription.delta"))
        stopped = next(i for i, e in enumerate(events) if e["type"] == "input_audio_buffer.speech_stopped")
        assert first_partial < stopped
        assert done["response"]["status"] == "completed"
        reply = audio_of(events)
        assert len(reply) / 2 / 24_000 > 1.0, "the spoken reply is too short"
        spoken = "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")
        assert "weather" in spoken.lower(), spoken
        await log.aclose()


async def test_caller_speech_cuts_the_reply_within_one_chunk(gateway: Gateway) -> None:
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await stream_audio(ws, speech_turn(24_000, after_ms=700), realtime=True)
        index, first_audio = await log.wait_for("response.output_audio.delta", timeout=30)
        response_id = first_audio["response_id"]
        # The caller talks over the reply (keep a silence tail so the new turn ends).
        await stream_audio(ws, load_speech(24_000) + silence(1200), realtime=True)
        started_at, _ = await log.wait_for("input_audio_buffer.speech_started", start=index)
        _, done = await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id,
            start=index,
            timeout=10,
        )
        assert done["response"]["status"] == "cancelled"
        assert done["response"]["status_details"]["reason"] == "turn_detected"
        # Not one byte of the interrupted reply after speech_started (Piper's 22.05 kHz audio is
        # resampled for this 24 kHz client: the resampler's tail must not leak either).
        assert audio_of(log.events[started_at:], response_id) == b""
        # The next turn proceeds: the interruption itself is heard and answered.
        _, second = await log.wait_for(
            lambda e: e["type"] == "response.done" and e["response"]["id"] != response_id,
            start=started_at,
            timeout=30,
        )
        assert second["response"]["status"] == "completed"
        await log.aclose()


@pytest.mark.parametrize("kind", ["silence", "noise", "clipped"])
async def test_no_speech_and_bad_audio_never_break_the_session(gateway: Gateway, kind: str) -> None:
    rng = np.random.default_rng(7)
    if kind == "silence":
        audio = silence(3000)
    elif kind == "noise":
        audio = (rng.normal(0, 0.05, 24_000 * 3) * 32767).astype("<i2").tobytes()
    else:  # speech driven far into clipping
        speech = np.frombuffer(load_speech(24_000), "<i2").astype(np.float32) * 20
        audio = np.clip(speech, -32768, 32767).astype("<i2").tobytes() + silence(1200)
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await stream_audio(ws, audio, realtime=True)
        await asyncio.sleep(1.0)
        errors = [e for e in log.events if e["type"] == "error"]
        assert not errors, errors
        if kind == "clipped":
            _, done = await log.wait_for("response.done", timeout=30)
            assert done["response"]["status"] == "completed"
        await ws.send('{"type":"session.heartbeat"}')
        await log.wait_for("session.heartbeat_ack")
        await log.aclose()


#: Word error rate bound at 8 kHz G.711 over the telephone test's phrases (43 words): measured
#: 2 % through the gateway and 9-12 % offline across CPU kernels (the greedy recognizer before:
#: 14-21 %). The bound leaves room for kernels not tried; test_asr.py holds the tight bounds.
_TELEPHONE_WER_BOUND = 0.2


def _telephone_phrases() -> list[tuple[str, np.ndarray]]:
    """The fixture sentence, two espeak-ng phrases (the robotic voice is the hard case on the
    telephone band) and one of Piper's, as 16 kHz samples."""
    recorded = [(p.text, p.load()) for p in (PHRASES[1], PHRASES[5], PHRASES[13])]
    return [(SPEECH_TEXT, load_fixture_speech()), *recorded]


async def _telephone_turn(gateway: Gateway, samples: np.ndarray, slots: asyncio.Semaphore) -> str:
    audio = encode(soxr.resample(samples, 16_000, 8_000).astype(np.float32), "g711_ulaw")
    turn = silence(600, 8_000, "g711_ulaw") + audio + silence(1000, 8_000, "g711_ulaw")
    async with slots, ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await ws.send(
            '{"type":"session.update","session":{"type":"realtime","audio":{"input":'
            '{"format":{"type":"audio/pcmu"},"transcription":{"model":"whisper-1"}}}}}'
        )
        await log.wait_for("session.updated")
        await stream_audio(ws, turn, rate=8_000, fmt="g711_ulaw", realtime=True)
        _, done = await log.wait_for("response.done", timeout=60)
        assert done["response"]["status"] == "completed"
        _, final = _transcripts(log.events)
        await log.aclose()
        return final


async def test_audio_at_another_rate_is_understood(gateway: Gateway) -> None:
    phrases = _telephone_phrases()
    # Two callers at a time: well inside max_sessions even while an earlier test's session closes.
    slots = asyncio.Semaphore(2)
    heard = await asyncio.gather(*(_telephone_turn(gateway, samples, slots) for _, samples in phrases))
    pairs = [(text, hyp) for (text, _), hyp in zip(phrases, heard, strict=True)]
    score = corpus_wer(pairs)
    report = "\n".join(f"  {wer(ref, hyp):.0%} {hyp!r}" for ref, hyp in pairs)
    print(f"\n8 kHz G.711 through the gateway: WER {score:.1%}\n{report}")
    assert score <= _TELEPHONE_WER_BOUND, f"WER {score:.1%} at 8 kHz G.711:\n{report}"
    assert all(wer(ref, hyp) < 0.75 for ref, hyp in pairs), report  # no phrase lost whole


def test_call_command_gets_a_spoken_reply(gateway: Gateway, tmp_path: Path) -> None:
    out = tmp_path / "reply.wav"
    proc = subprocess.run(
        [
            PYTHON,
            "-m",
            "duplex_gateway",
            "call",
            str(FIXTURE),
            "--url",
            gateway.ws_url + "/v1/realtime",
            "--out",
            str(out),
            "--timeout",
            "40",
        ],
        cwd=REPO,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    heard = [line for line in proc.stdout.splitlines() if "] you: " in line]
    assert heard and wer(SPEECH_TEXT, heard[0].split("] you: ", 1)[1]) <= 0.25, proc.stdout
    assert "assistant: You said" in proc.stdout, proc.stdout
    assert "after the end of your speech" in proc.stdout
    audio, rate = soundfile.read(str(out))
    assert rate == 24_000 and len(audio) / rate > 1.0
    assert np.abs(audio).max() > 0.05  # speech, not silence


async def test_twelve_seconds_uploaded_at_once_are_transcribed_whole(gateway: Gateway) -> None:
    """A recorded file sent as fast as the socket takes it: none of it is lost, all of it is heard."""
    chosen = [SPEECH_TEXT, PHRASES[0].text, PHRASES[13].text, PHRASES[14].text]
    parts: list[bytes] = []
    for text in chosen:
        phrase = next((p.load() for p in PHRASES if p.text == text), None)
        samples = load_fixture_speech() if phrase is None else phrase
        parts.append(encode(soxr.resample(samples, 16_000, 24_000).astype(np.float32)) + silence(300))
    upload = b"".join(parts)
    assert len(upload) / 2 / 24_000 >= 12.0
    async with ws_connect(gateway) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        await ws.send(
            '{"type":"session.update","session":{"type":"realtime","audio":{"input":'
            '{"turn_detection":null,"transcription":{"model":"whisper-1"}}}}}'
        )
        await log.wait_for("session.updated")
        await stream_audio(ws, upload, realtime=False)
        await ws.send('{"type":"input_audio_buffer.commit"}')
        _, final = await log.wait_for("conversation.item.input_audio_transcription.completed", timeout=60)
        assert not [e for e in log.events if e["type"] == "error"]
        assert wer(" ".join(chosen), final["transcript"]) <= 0.2, final["transcript"]
        await log.aclose()
