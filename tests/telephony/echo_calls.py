"""An echo-engine call for any carrier's wire: answered, then cut off by the caller (shared by the carrier tests)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import numpy as np

from tests.e2e.helpers import Gateway, ws_connect
from tests.telephony.acceptance import caller_turn, observing
from tests.telephony.phone import Phone, Wire

__all__ = ["echo_call", "say_shuffled", "similarity"]


_CROSSING_S = 0.05


def similarity(part: np.ndarray, whole: np.ndarray) -> float:
    """How closely ``part`` matches some stretch of ``whole``: the peak normalized cross-correlation."""
    part, whole = part.astype(np.float64), whole.astype(np.float64)
    if not 0 < len(part) <= len(whole):
        return 0.0
    size = 1 << (len(part) + len(whole)).bit_length()
    lags = len(whole) - len(part) + 1
    corr = np.fft.irfft(np.fft.rfft(whole, size) * np.conj(np.fft.rfft(part, size)), size)[:lags]
    energy = np.concatenate([[0.0], np.cumsum(whole**2)])
    local = np.sqrt(np.maximum(energy[len(part) :] - energy[:lags], 1e-9))
    return float(np.max(corr / (local * max(float(np.linalg.norm(part)), 1e-9))))


async def say_shuffled(phone: Phone, audio: bytes, *, seed: int = 7) -> None:
    """Stream ``audio`` in real time with neighbouring frames swapped now and then, as Telnyx may deliver them."""
    wire, step = phone.wire, phone.wire.frame_bytes
    messages = [
        wire.media(audio[offset : offset + step], n) for n, offset in enumerate(range(0, len(audio), step))
    ]
    rng = random.Random(seed)
    for n in range(0, len(messages) - 1, 2):
        if rng.random() < 0.5:
            messages[n], messages[n + 1] = messages[n + 1], messages[n]
    frame_s = step / wire.bytes_per_second
    start = time.monotonic()
    for n, message in enumerate(messages):
        await phone.ws.send(message)
        delay = start + (n + 1) * frame_s - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)


def _played_since(phone: Phone, since: float) -> int:
    buffered = {id(o) for o in phone._buffer}
    return sum(len(o.audio) for o in phone.media() if o.at >= since and id(o) not in buffered)


def _heard_ms_at(phone: Phone, since: float, cutoff: float, bytes_per_second: int) -> int:
    """The reply audio sent since ``since`` up to the last mark the phone had played by ``cutoff``."""
    played = {name for name, at in phone.played_marks if at <= cutoff}
    total = heard = 0
    for out in phone.sent:
        if since <= out.at <= cutoff:
            if out.kind == "media":
                total += len(out.audio)
            elif out.kind == "mark" and out.name in played:
                heard = total
    return round(heard * 1000 / bytes_per_second)


def _heard_at_clear(phone: Phone, since: float, cleared_at: float, bytes_per_second: int) -> set[int]:
    """What the gateway may have known the caller heard when it cleared: the last mark played by
    the clear's arrival, or one played while the clear was on its way (the echo crossed it)."""
    crossing = [at for _, at in phone.played_marks if cleared_at - _CROSSING_S <= at <= cleared_at]
    cutoffs = [cleared_at - _CROSSING_S, *crossing, cleared_at]
    return {_heard_ms_at(phone, since, cutoff, bytes_per_second) for cutoff in cutoffs}


async def echo_call(
    gateway: Gateway,
    path: str,
    wire: Wire,
    call_id: str,
    *,
    rate: int,
    encode: Callable[[np.ndarray], bytes],
    decode: Callable[[bytes], np.ndarray],
    marks_echoed_on_clear: bool,
    shuffle: bool = False,
) -> None:
    """One call against the echo engine: answered in the carrier's media, then the caller talks over a reply.

    The echo of the caller's first turn must come back as the carrier's media and sound like
    what was said. Then, while the next reply plays, the caller talks again: the carrier gets
    its clear, no media of the cut reply follows it, the marks that come back after the clear
    are exactly the ones the clear dropped (all of them where the carrier returns them, none
    where it does not), and the reply is truncated at the last mark the caller really heard.
    """
    echoed: list[tuple[str, float]] = wire.echoed  # type: ignore[attr-defined]
    async with (
        ws_connect(gateway, path) as ws,
        Phone(ws, wire) as phone,
        observing(gateway, call_id) as observer,
    ):
        # -- answered: the echo of the caller's turn, in the carrier's media --------------------------
        turn = encode(caller_turn(rate))
        await (say_shuffled(phone, turn) if shuffle else phone.say(turn))
        _, done = await observer.wait(lambda e: e["type"] == "response.done", timeout=30)
        assert done["response"]["status"] == "completed", done
        await phone.wait(lambda p: not p._buffer and len(p.media()) > 0, timeout=20)
        # The echo is the caller's turn as the gateway heard it, up to the end of speech it detected.
        reply = decode(bytes(phone.played))
        assert len(reply) > 2 * rate, len(reply)
        assert similarity(reply, decode(turn)) > 0.8
        await phone.press("5")
        _, dtmf = await observer.wait(
            lambda e: e["type"] == "input_audio_buffer.dtmf_event_received", timeout=5
        )
        assert dtmf["event"] == "5"

        # -- barge-in: the caller talks over the next reply ----------------------------------------------
        turn_two = time.monotonic()
        await phone.say(encode(caller_turn(rate, pad_after_s=0.8)))
        await phone.wait(lambda p: _played_since(p, turn_two) >= 0.8 * wire.bytes_per_second, timeout=30)
        await phone.say(encode(caller_turn(rate)))
        await phone.wait(lambda p: bool(p.clears), timeout=20)
        cleared_at = phone.clears[0]
        async with asyncio.timeout(30):
            while not (after := [at for at, _ in observer.of("response.created") if at > cleared_at]):
                await asyncio.sleep(0.01)
        next_reply = after[0]
        # Nothing of the cut reply after the clear: no media, no marks until the next reply.
        late = [o for o in phone.sent if cleared_at < o.at < next_reply and o.kind in ("media", "mark")]
        assert not late, f"{len(late)} frames of the cut reply after the clear"
        # The marks that came back after the clear are the ones it dropped.
        returned = [name for name, at in echoed if cleared_at <= at < next_reply]
        if marks_echoed_on_clear:
            assert phone.dropped_marks and returned == phone.dropped_marks, (returned, phone.dropped_marks)
        else:
            assert phone.dropped_marks and returned == [], returned
        # What the caller heard of the cut reply is what the marks played before the clear prove.
        _, truncated = await observer.wait(lambda e: e["type"] == "conversation.item.truncated", timeout=10)
        heard = _heard_at_clear(phone, turn_two, cleared_at, wire.bytes_per_second)
        assert truncated["audio_end_ms"] in heard, (truncated, heard)
        # The call goes on: the caller's words over the reply are answered in turn.
        await phone.wait(lambda p: any(o.at > next_reply for o in p.media()), timeout=20)
        await phone.hang_up()
        async with asyncio.timeout(10):
            await ws.wait_closed()
