"""The acceptance script every carrier's call runs against the embedded engine.

A scripted call over a real socket in the carrier's own message shapes: the caller
asks for the weather report in real speech encoded as the carrier sends it; the
reply comes back as the carrier's media and, played out as the carrier would, is
transcribed back by the embedded recognizer. Then the caller talks over the next
reply: the carrier's clear must come once the caller talks and at the latest 50 ms
after the gateway announced their turn (seen by a Realtime observer of the call; the
clear comes first, when the reply is held while the speech is judged), no media of
the cut reply may follow it, and the reply is truncated exactly at the last mark the
carrier had played before the clear.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import soxr

from duplex_gateway.engine.embedded.asr import FinalRecognizer
from tests.e2e.helpers import Gateway, ws_connect
from tests.fixtures import load_speech
from tests.telephony.phone import Phone, Wire
from tests.wer import wer

#: The gateway's announcement of the caller's turn to the carrier's clear, at most.
CLEAR_WITHIN_S = 0.05


@dataclass
class Observer:
    """A Realtime client watching the call: every event, with when it arrived."""

    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    ws: Any = None

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(at, e) for at, e in self.events if e["type"] == kind]

    async def wait(
        self, match: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> tuple[float, dict[str, Any]]:
        async with asyncio.timeout(timeout):
            while True:
                for at, event in self.events:
                    if match(event):
                        return at, event
                await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def observing(gateway: Gateway, call_id: str) -> AsyncIterator[Observer]:
    observer = Observer()
    async with asyncio.timeout(10):
        while True:  # the call is known once the carrier's start has been read
            try:
                ws = await ws_connect(gateway, f"/v1/realtime?call_id={call_id}").__aenter__()
                break
            except Exception:  # noqa: BLE001 - refused until the call exists
                await asyncio.sleep(0.05)

    async def read() -> None:
        async for frame in ws:
            observer.events.append((time.monotonic(), json.loads(frame)))

    observer.ws = ws
    task = asyncio.create_task(read())
    try:
        yield observer
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        await ws.close()


def caller_turn(rate: int, pad_after_s: float = 1.2) -> np.ndarray:
    speech = load_speech(rate)
    return np.concatenate(
        [np.zeros(rate // 2, np.float32), speech, np.zeros(int(rate * pad_after_s), np.float32)]
    )


def _to_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    return samples if rate == 16_000 else soxr.resample(samples, rate, 16_000).astype(np.float32)


async def run_call(
    gateway: Gateway,
    path: str,
    wire: Wire,
    call_id: str,
    *,
    rate: int,
    encode: Callable[[np.ndarray], bytes],
    decode: Callable[[bytes], np.ndarray],
    subprotocols: tuple[str, ...] = (),
) -> None:
    """The whole acceptance script for one carrier (see the module docstring)."""
    connect = {"subprotocols": list(subprotocols)} if subprotocols else {}
    async with (
        ws_connect(gateway, path, **connect) as ws,
        Phone(ws, wire) as phone,
        observing(gateway, call_id) as observer,
    ):
        # -- a spoken request, a spoken answer ------------------------------------------------
        await phone.say(encode(caller_turn(rate)))
        _, first = await observer.wait(lambda e: e["type"] == "response.done", timeout=40)
        assert first["response"]["status"] == "completed", first
        await phone.wait(lambda p: not p._buffer and len(p.media()) > 0, timeout=30)
        said = "".join(e["delta"] for _, e in observer.of("response.output_audio_transcript.delta"))
        assert "weather" in said.lower(), said
        heard = FinalRecognizer.shared().transcribe(_to_16k(decode(bytes(phone.played)), rate))
        assert wer(said, heard) <= 0.4, (said, heard)

        # -- the caller talks over the next reply ------------------------------------------------
        turn_two = time.monotonic()
        await phone.say(encode(caller_turn(rate, pad_after_s=0.8)))
        await phone.wait(lambda p: _played_since(p, turn_two) >= 0.8 * wire.bytes_per_second, timeout=40)
        talked_at = time.monotonic()
        await phone.say(encode(caller_turn(rate)))
        await phone.wait(lambda p: bool(p.clears), timeout=20)
        cleared_at = phone.clears[0]
        await observer.wait(lambda e: e["type"] == "conversation.item.truncated", timeout=10)
        # The reply is held (the carrier cleared) as soon as the caller is heard over it, before
        # the gateway has judged the speech an interruption and announced the turn.
        detected_at = _detection_after(observer, talked_at)
        assert talked_at < cleared_at <= detected_at + CLEAR_WITHIN_S, (cleared_at - talked_at, detected_at)
        _, truncated = await observer.wait(lambda e: e["type"] == "conversation.item.truncated", timeout=10)
        # The truncation is the last mark the carrier played before the clear, as the gateway
        # heard of it: the last playback report of the call before the truncation ...
        index = next(i for i, (_, e) in enumerate(observer.events) if e is truncated)
        acks = [e for _, e in observer.events[:index] if e["type"] == "playback.acknowledged"]
        assert acks and truncated["audio_end_ms"] == acks[-1]["played_ms"], (truncated, acks[-1:])
        # ... which is the phone's own count at the clear, unless the echo of its very last mark
        # was still on the wire when the clear crossed it (then the one before).
        heard = _heard_ms_at_marks(phone, turn_two, cleared_at, wire)
        assert truncated["audio_end_ms"] in heard[-2:], (truncated, heard[-2:])
        # Nothing of the cut reply after the clear: the next media belongs to the next reply.
        async with asyncio.timeout(40):
            while not (after := [at for at, _ in observer.of("response.created") if at > cleared_at]):
                await asyncio.sleep(0.01)
        late = [o for o in phone.media() if cleared_at < o.at < after[0]]
        assert not late, f"{len(late)} media frames of the cut reply after the clear"
        await phone.hang_up()


def _detection_after(observer: Observer, talked_at: float) -> float:
    """When the observer heard of the caller's turn that cut the reply (the first detection since they talked)."""
    started = [at for at, _ in observer.of("input_audio_buffer.speech_started") if at > talked_at]
    assert started, "the gateway did not detect the caller talking over the reply"
    return started[0]


def _played_since(phone: Phone, since: float) -> int:
    """Bytes of media received after ``since`` that the phone has played out."""
    buffered = {id(o) for o in phone._buffer}
    return sum(len(o.audio) for o in phone.media() if o.at >= since and id(o) not in buffered)


def _heard_ms_at_marks(phone: Phone, since: float, cleared_at: float, wire: Wire) -> list[int]:
    """The reply heard (ms) at each mark the phone played before the clear, in order."""
    played_names = {name for name, at in phone.played_marks if at <= cleared_at}
    heard = [0]
    total = 0
    for out in phone.sent:
        if out.at < since or out.at > cleared_at:
            continue
        if out.kind == "media":
            total += len(out.audio)
        elif out.kind == "mark" and out.name in played_names:
            heard.append(round(total * 1000 / wire.bytes_per_second))
    return heard
