"""``duplex-gateway call``: talk to any gateway from a WAV file, as a caller would.

The file is streamed in real time in 20 ms frames (followed by silence so the
server's turn detection can end the turn), transcripts and timings are printed
as they arrive, and the spoken reply is written to a WAV file.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import soundfile
import websockets

from duplex_gateway.audio.resample import StreamResampler

__all__ = ["CallResult", "call"]

FRAME_MS = 20
OUTPUT_RATE = 24_000


@dataclass(slots=True)
class CallResult:
    """What one call heard and measured."""

    caller_transcript: str = ""
    reply_transcript: str = ""
    reply_audio: bytearray = field(default_factory=bytearray)  # PCM16 mono at OUTPUT_RATE
    #: End of the caller's speech (by the server's VAD) to the first reply audio, seconds.
    first_audio_latency_s: float | None = None
    response_status: str | None = None
    errors: list[dict[str, Any]] = field(default_factory=list)


def _load_wav(path: Path) -> tuple[np.ndarray, int]:
    samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    mono = samples.mean(axis=1).astype(np.float32)
    if not 8_000 <= rate <= 48_000:
        # The gateway takes 8-48 kHz; bring anything else into range here.
        mono = StreamResampler(rate, 16_000).process(mono)
        rate = 16_000
    return mono, int(rate)


def _pcm16(samples: np.ndarray) -> bytes:
    return bytes((np.clip(samples, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes())


async def call(
    url: str,
    wav: Path,
    *,
    api_key: str | None = None,
    trailing_silence_s: float = 1.5,
    timeout_s: float = 60.0,
    out: TextIO | None = sys.stdout,
    now: Callable[[], float] = time.monotonic,
) -> CallResult:
    """Stream ``wav`` to the gateway at ``url`` and collect the reply to it."""
    samples, rate = _load_wav(wav)
    audio = _pcm16(np.concatenate([samples, np.zeros(int(rate * trailing_silence_s), np.float32)]))
    frame_bytes = rate * FRAME_MS // 1000 * 2
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    result = CallResult()

    def say(t0: float, text: str) -> None:
        if out is not None:
            print(f"[{now() - t0:6.2f}s] {text}", file=out, flush=True)

    async with websockets.connect(url, additional_headers=headers, max_size=None) as ws:
        created = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
        if created.get("type") == "error":
            raise RuntimeError(f"gateway refused the session: {created['error']}")
        silence_ms = 500
        detection = created.get("session", {}).get("audio", {}).get("input", {}).get("turn_detection")
        if isinstance(detection, dict):
            silence_ms = int(detection.get("silence_duration_ms", silence_ms))
        await ws.send(json.dumps({
            "type": "session.update",
            "session": {
                "type": "realtime",
                "audio": {
                    # The call prints what it heard the caller say, so it asks for transcripts.
                    "input": {"format": {"type": "audio/pcm", "rate": rate}, "transcription": {"model": "whisper-1"}},
                    "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}},
                },
            },
        }))
        t0 = now()

        async def send_audio() -> None:
            for index, offset in enumerate(range(0, len(audio), frame_bytes)):
                chunk = audio[offset : offset + frame_bytes]
                await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                          "audio": base64.b64encode(chunk).decode()}))
                delay = t0 + (index + 1) * FRAME_MS / 1000 - now()
                if delay > 0:
                    await asyncio.sleep(delay)

        sender = asyncio.create_task(send_audio())
        speech_end: float | None = None
        partial = ""
        try:
            async with asyncio.timeout(timeout_s):
                async for message in ws:
                    event = json.loads(message)
                    kind = event.get("type", "")
                    if kind == "input_audio_buffer.speech_started":
                        say(t0, f"speech started at {event['audio_start_ms']} ms")
                    elif kind == "input_audio_buffer.speech_stopped":
                        # The server ends a turn after silence_duration_ms of silence.
                        speech_end = t0 + (event["audio_end_ms"] - silence_ms) / 1000
                        say(t0, f"speech stopped at {event['audio_end_ms']} ms")
                    elif kind == "conversation.item.input_audio_transcription.delta":
                        partial = event.get("delta", "")
                        say(t0, f"you (partial): {partial}")
                    elif kind == "conversation.item.input_audio_transcription.completed":
                        result.caller_transcript = event.get("transcript", "")
                        say(t0, f"you: {result.caller_transcript}")
                    elif kind in ("response.output_audio.delta", "response.audio.delta"):
                        if result.first_audio_latency_s is None and speech_end is not None:
                            result.first_audio_latency_s = now() - speech_end
                            say(t0, f"first reply audio, {result.first_audio_latency_s * 1000:.0f} ms "
                                    "after the end of your speech")
                        result.reply_audio += base64.b64decode(event["delta"])
                    elif kind in ("response.output_audio_transcript.delta", "response.audio_transcript.delta"):
                        result.reply_transcript += event.get("delta", "")
                        say(t0, f"assistant: {event.get('delta', '')}")
                    elif kind == "error":
                        result.errors.append(event["error"])
                        say(t0, f"error {event['error'].get('code')}: {event['error'].get('message')}")
                    elif kind == "response.done":
                        result.response_status = event["response"]["status"]
                        say(t0, f"reply {result.response_status}, "
                                f"{len(result.reply_audio) / 2 / OUTPUT_RATE:.2f} s of audio")
                        break
        finally:
            sender.cancel()
        with_partial = result.caller_transcript or partial
        result.caller_transcript = with_partial
    return result


def write_wav(path: Path, pcm16: bytes | bytearray, rate: int = OUTPUT_RATE) -> None:
    """Save PCM16 mono audio as a WAV file."""
    soundfile.write(str(path), np.frombuffer(bytes(pcm16), dtype="<i2"), rate, subtype="PCM_16")
