"""``duplex-gateway call``: talk to any gateway from a WAV file, as a caller would.

The file is streamed in real time in 20 ms frames (followed by silence so the
server's turn detection can end the turn), transcripts and timings are printed
as they arrive, and the spoken reply is written to a WAV file.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import soundfile
import websockets
from websockets.asyncio.client import ClientConnection

from duplex_gateway.audio.resample import StreamResampler

__all__ = ["CallError", "CallResult", "call", "check_output_path", "load_caller_audio"]

FRAME_MS = 20
OUTPUT_RATE = 24_000
#: After the last frame (its trailing silence included), how long the server's VAD may take to say it
#: heard speech before the call ends as one with none.
NO_SPEECH_GRACE_S = 1.0


class CallError(Exception):
    """Why a call could not be made or ended without a reply, in one line for the user."""


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


def load_caller_audio(path: Path) -> tuple[np.ndarray, int]:
    """``path``'s audio as mono float32 and its rate (brought into 8-48 kHz); :class:`CallError` if unreadable."""
    if not path.exists():
        raise CallError(f"no such file: {path}")
    if path.is_dir():
        raise CallError(f"{path} is a folder, not an audio file")
    try:
        samples, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except soundfile.LibsndfileError as exc:
        raise CallError(
            f"cannot read {path} as audio: {exc.error_string.rstrip('.')} (a WAV file, any rate)"
        ) from None
    except OSError as exc:
        raise CallError(f"cannot read {path}: {exc.strerror or exc}") from None
    if not len(samples):
        raise CallError(f"{path} holds no audio")
    mono = samples.mean(axis=1).astype(np.float32)
    if not 8_000 <= rate <= 48_000:
        # The gateway takes 8-48 kHz; bring anything else into range here.
        mono = StreamResampler(rate, 16_000).process(mono)
        rate = 16_000
    return mono, int(rate)


def check_output_path(path: Path) -> None:
    """:class:`CallError` unless a WAV file can be written at ``path`` (checked before the call, not after it)."""
    if path.is_dir():
        raise CallError(f"cannot write {path}: it is a folder")
    folder = path.parent
    if not folder.is_dir():
        raise CallError(f"cannot write {path}: no folder {folder}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise CallError(f"cannot write {path}: permission denied")


def _refusal_message(body: bytes | bytearray | None) -> str:
    """``": <message>"`` from the gateway's JSON refusal of a handshake, or ``""``."""
    try:
        message = json.loads(body or b"")["error"]["message"]
    except (ValueError, KeyError, TypeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""


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
    """Stream ``wav`` to the gateway at ``url`` and collect the reply to it.

    :class:`CallError` says, in one line, why there is no reply: an unreadable file, a gateway
    that cannot be reached or refuses the session, no speech in the file, no reply in ``timeout_s``.
    The session is always closed with a closing handshake, so the gateway does not keep it for a resume.
    """
    samples, rate = load_caller_audio(wav)
    audio = _pcm16(np.concatenate([samples, np.zeros(int(rate * trailing_silence_s), np.float32)]))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    result = CallResult()
    try:
        connection = await asyncio.wait_for(
            websockets.connect(url, additional_headers=headers, max_size=None), timeout_s
        )
    except TimeoutError:
        raise CallError(f"cannot reach the gateway at {url}: no answer within {timeout_s:g} s") from None
    except websockets.InvalidStatus as exc:
        said = _refusal_message(exc.response.body)
        raise CallError(
            f"the gateway at {url} refused the connection: HTTP {exc.response.status_code}{said}"
            + (" (--api-key)" if exc.response.status_code in (401, 403) else "")
        ) from None
    except ConnectionRefusedError:
        raise CallError(
            f"cannot reach the gateway at {url}: nothing listens there (is it running?)"
        ) from None
    except (OSError, websockets.InvalidHandshake, websockets.InvalidURI) as exc:
        why = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise CallError(f"cannot reach the gateway at {url}: {why}") from None
    async with connection as ws:
        try:
            await _converse(
                ws,
                wav,
                audio,
                rate,
                result,
                timeout_s=timeout_s,
                trailing_silence_s=trailing_silence_s,
                out=out,
                now=now,
            )
        except websockets.ConnectionClosed as exc:
            reason = exc.rcvd.reason if exc.rcvd is not None else ""
            code = exc.rcvd.code if exc.rcvd is not None else 1006
            raise CallError(
                f"the gateway closed the session ({code}{': ' + reason if reason else ''})"
            ) from None
        finally:
            # A closing handshake (1000): the gateway ends the session now instead of keeping it for a resume.
            await ws.close()
    return result


async def _converse(
    ws: ClientConnection,
    wav: Path,
    audio: bytes,
    rate: int,
    result: CallResult,
    *,
    timeout_s: float,
    trailing_silence_s: float,
    out: TextIO | None,
    now: Callable[[], float],
) -> None:
    frame_bytes = rate * FRAME_MS // 1000 * 2

    def say(t0: float, text: str) -> None:
        if out is not None:
            print(f"[{now() - t0:6.2f}s] {text}", file=out, flush=True)

    created = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
    if created.get("type") == "error":
        error = created.get("error", {})
        raise CallError(f"the gateway refused the session: {error.get('code')}: {error.get('message')}")
    silence_ms = 500
    detection = created.get("session", {}).get("audio", {}).get("input", {}).get("turn_detection")
    if isinstance(detection, dict):
        silence_ms = int(detection.get("silence_duration_ms", silence_ms))
    await ws.send(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {
                        # The call prints what it heard the caller say, so it asks for transcripts.
                        "input": {
                            "format": {"type": "audio/pcm", "rate": rate},
                            "transcription": {"model": "whisper-1"},
                        },
                        "output": {"format": {"type": "audio/pcm", "rate": OUTPUT_RATE}},
                    },
                },
            }
        )
    )
    t0 = now()
    speech_heard = asyncio.Event()

    async def send_audio() -> None:
        for index, offset in enumerate(range(0, len(audio), frame_bytes)):
            chunk = audio[offset : offset + frame_bytes]
            await ws.send(
                json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(chunk).decode()})
            )
            delay = t0 + (index + 1) * FRAME_MS / 1000 - now()
            if delay > 0:
                await asyncio.sleep(delay)
        if not isinstance(detection, dict):
            # The gateway's sessions start without turn detection: the caller ends the turn itself.
            await ws.send(json.dumps({"type": "input_audio_buffer.commit"}))
            await ws.send(json.dumps({"type": "response.create"}))
            speech_heard.set()
            return
        # The whole file and its trailing silence are sent: the server's VAD has had its chance.
        try:
            await asyncio.wait_for(speech_heard.wait(), NO_SPEECH_GRACE_S)
        except TimeoutError:
            return

    sender = asyncio.create_task(send_audio())
    receiver = asyncio.create_task(_receive(ws, result, speech_heard, silence_ms, t0, say, now))
    try:
        done, _ = await asyncio.wait(
            {sender, receiver}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if sender in done and not speech_heard.is_set():
            sender.result()
            seconds = (len(audio) / 2 - rate * trailing_silence_s) / rate
            raise CallError(
                f"no speech heard in {wav}: the gateway's voice activity detection found none in its "
                f"{seconds:.1f} s of audio, so nothing was answered"
            )
        if receiver not in done:
            done, _ = await asyncio.wait({receiver}, timeout=max(0.0, timeout_s - (now() - t0)))
        if receiver not in done:
            raise CallError(f"no reply within {timeout_s:g} s (--timeout)")
        receiver.result()
    finally:
        for task in (sender, receiver):
            task.cancel()
        await asyncio.gather(sender, receiver, return_exceptions=True)


async def _receive(
    ws: ClientConnection,
    result: CallResult,
    speech_heard: asyncio.Event,
    silence_ms: int,
    t0: float,
    say: Callable[[float, str], None],
    now: Callable[[], float],
) -> None:
    """Read the gateway's events until the reply is done, printing as they come."""
    speech_end: float | None = None
    partial = ""
    async for message in ws:
        event = json.loads(message)
        kind = event.get("type", "")
        if kind == "input_audio_buffer.speech_started":
            speech_heard.set()
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
                say(
                    t0,
                    f"first reply audio, {result.first_audio_latency_s * 1000:.0f} ms "
                    "after the end of your speech",
                )
            result.reply_audio += base64.b64decode(event["delta"])
        elif kind in ("response.output_audio_transcript.delta", "response.audio_transcript.delta"):
            result.reply_transcript += event.get("delta", "")
            say(t0, f"assistant: {event.get('delta', '')}")
        elif kind == "error":
            result.errors.append(event["error"])
            say(t0, f"error {event['error'].get('code')}: {event['error'].get('message')}")
        elif kind == "response.done":
            result.response_status = event["response"]["status"]
            say(
                t0,
                f"reply {result.response_status}, {len(result.reply_audio) / 2 / OUTPUT_RATE:.2f} s of audio",
            )
            break
    else:
        why = f"{ws.close_code}: {ws.close_reason}" if ws.close_reason else f"{ws.close_code}"
        raise CallError(f"the gateway closed the session before replying ({why})")
    if not result.caller_transcript:
        result.caller_transcript = partial


def write_wav(path: Path, pcm16: bytes | bytearray, rate: int = OUTPUT_RATE) -> None:
    """Save PCM16 mono audio as a WAV file."""
    soundfile.write(str(path), np.frombuffer(bytes(pcm16), dtype="<i2"), rate, subtype="PCM_16")
