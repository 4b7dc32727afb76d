"""A simulated caller: a Realtime client that talks in real time, listens, and interrupts.

Each caller holds one WebSocket. One task sends: a 20 ms frame on a fixed
real-time schedule (an open microphone), with the turn's control events slotted
between frames, so the order on the wire is exactly what a real client would
produce. Another task reads every server event and timestamps what matters.

Two ways to end a turn:

* ``commit``: after ``turn_ms`` of audio the caller sends
  ``input_audio_buffer.commit`` and asks for the reply (``response.create``; a
  vLLM-Omni client says ``response_create: true`` on the commit instead). The
  next turn starts with ``input_audio_buffer.clear`` so the audio sent while
  listening does not join it. First audio is timed from the commit.
* ``vad``: the caller sends the whole recording and then silence; the server's
  VAD ends the turn. First audio is timed from the frame holding the last
  speech sample (the true end of speech, on the caller's clock).

Barge-in: on a chosen share of turns the caller interrupts the reply
``barge_after_ms`` after its first audio. With ``commit`` it sends
``response.cancel`` (the interrupting event is the cancel it sent); with ``vad``
it starts speaking again (the interrupting event is the server's
``input_audio_buffer.speech_started``). The cut-off is the time from that event
to the cancelled reply's ``response.done``; any audio of that reply arriving
after its ``response.done`` is counted as stale.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from duplex_gateway.bench.audio import FRAME_MS, CallerAudio

__all__ = ["CallerPlan", "CallerStats", "SimulatedCaller", "TurnEnd", "Wire"]

Wire = Literal["realtime", "vllm-omni", "webrtc"]
TurnEnd = Literal["commit", "vad"]

_AUDIO_DELTAS = frozenset({"response.output_audio.delta", "response.audio.delta"})
_OUTPUT_RATE = 24_000


@dataclass(frozen=True)
class CallerPlan:
    """What every caller of one run does."""

    url: str
    wire: Wire
    turn_end: TurnEnd
    audio: CallerAudio
    turn_ms: int = 1000
    barge_in: float = 0.2
    barge_after_ms: int = 300
    turn_timeout_s: float = 20.0
    connect_timeout_s: float = 30.0


@dataclass
class CallerStats:
    """What one caller saw; the run adds these up."""

    first_audio_ms: list[float] = field(default_factory=list)
    gaps_ms: list[float] = field(default_factory=list)
    cutoff_ms: list[float] = field(default_factory=list)
    send_lag_ms: list[float] = field(default_factory=list)
    frames: int = 0
    late_frames: int = 0
    turns: int = 0
    completed: int = 0
    cancelled: int = 0
    barge_ins: int = 0
    timeouts: int = 0
    stale_replies: int = 0
    stale_bytes: int = 0
    late_cancels: int = 0
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class _Reply:
    response_id: str
    turn: int
    ended_at: float | None
    first_at: float | None = None
    last_at: float | None = None
    audio_bytes: int = 0
    interrupted_at: float | None = None


def _b64_len(text: object) -> int:
    if not isinstance(text, str):
        return 0
    return len(text) * 3 // 4 - text[-2:].count("=")


class SimulatedCaller:
    """One caller; :meth:`connect`, then :meth:`talk` until the run's end, then :meth:`close`."""

    def __init__(self, plan: CallerPlan, *, rng: random.Random) -> None:
        self.plan = plan
        self.stats = CallerStats()
        self._rng = rng
        self._ws: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._replies: dict[str, _Reply] = {}
        self._finished: set[str] = set()
        self._stale: set[str] = set()
        self._turn = 0  # the latest turn that ended (0: none yet)
        self._turn_ended_at: float | None = None
        self._turn_over = asyncio.Event()
        self._answer: _Reply | None = None  # the reply to the latest turn, once announced
        self._handshake: asyncio.Future[None] | None = None

    # -- connection ---------------------------------------------------------------

    async def connect(self) -> None:
        """Open the socket and configure the session; raises when the server refuses."""
        from websockets.asyncio.client import connect

        plan = self.plan
        self._ws = await asyncio.wait_for(
            connect(
                plan.url,
                open_timeout=plan.connect_timeout_s,
                max_size=None,
                ping_interval=None,
                compression=None,
            ),
            plan.connect_timeout_s,
        )
        self._handshake = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(), name="bench:caller-reader")
        await self._ws.send(json.dumps({"type": "session.update", "session": self._session()}))
        await asyncio.wait_for(asyncio.shield(self._handshake), plan.connect_timeout_s)

    def _session(self) -> dict[str, Any]:
        plan = self.plan
        vad = {"type": "server_vad"} if plan.turn_end == "vad" else None
        if plan.wire == "vllm-omni":
            # vLLM-Omni DuplexClient's session shape; its server answers a commit only when asked.
            return {
                "modalities": ["text", "audio"],
                "input_audio_format": "pcm16",
                "output_audio_format": "pcm16",
                "sample_rate_hz": plan.audio.rate,
                "audio": {
                    "input": {"sample_rate_hz": plan.audio.rate},
                    "output": {"sample_rate_hz": _OUTPUT_RATE},
                },
                "turn_detection": vad,
                "extra_body": {"auto_response": False},
            }
        return {
            "type": "realtime",
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": plan.audio.rate}, "turn_detection": vad},
                "output": {"format": {"type": "audio/pcm", "rate": _OUTPUT_RATE}},
            },
        }

    async def close(self) -> None:
        """Close the socket and stop reading."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 5)
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader

    # -- receiving ----------------------------------------------------------------

    async def _read(self) -> None:
        # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds, too coarse here.
        clock = time.perf_counter
        try:
            async for message in self._ws:
                event = json.loads(message)
                if isinstance(event, dict):
                    self._on_event(event, clock())
        except Exception as exc:  # noqa: BLE001 - a dropped connection is a result, not a crash
            self.stats.errors[f"connection:{type(exc).__name__}"] += 1
        if self._handshake is not None and not self._handshake.done():
            self._handshake.set_exception(ConnectionError("closed during the handshake"))

    def _on_event(self, event: dict[str, Any], now: float) -> None:
        kind = event.get("type")
        if kind in _AUDIO_DELTAS:
            self._on_audio(str(event.get("response_id")), _b64_len(event.get("delta")), now)
        elif kind == "response.created":
            response = event.get("response")
            rid = response.get("id") if isinstance(response, dict) else None
            if isinstance(rid, str):
                self._reply(rid)
        elif kind == "response.done":
            response = event.get("response") or {}
            self._on_done(str(response.get("id")), str(response.get("status")), now)
        elif kind == "input_audio_buffer.speech_started":
            answer = self._answer
            if (
                answer is not None
                and answer.response_id not in self._finished
                and answer.interrupted_at is None
            ):
                answer.interrupted_at = now
        elif kind == "error":
            error = event.get("error") or {}
            code = str(error.get("code") or error.get("type") or "error")
            if code == "response_cancel_not_active":
                # The cancel crossed the reply's own end on the wire: a race any client meets, not a fault.
                self.stats.late_cancels += 1
            else:
                self.stats.errors[code] += 1
        elif self._handshake is not None and not self._handshake.done():
            ready = "session.created" if self.plan.wire == "vllm-omni" else "session.updated"
            if kind == ready:
                self._handshake.set_result(None)

    def _reply(self, rid: str) -> _Reply:
        reply = self._replies.get(rid)
        if reply is None:
            reply = _Reply(response_id=rid, turn=self._turn, ended_at=self._turn_ended_at)
            self._replies[rid] = reply
            if self._turn_ended_at is not None:  # the first reply after a turn answers it
                self._turn_ended_at = None
                self._answer = reply
        return reply

    def _on_audio(self, rid: str, size: int, now: float) -> None:
        if rid in self._finished:
            self.stats.stale_bytes += size
            if rid not in self._stale:
                self._stale.add(rid)
                self.stats.stale_replies += 1
            return
        reply = self._reply(rid)
        if reply.first_at is None:
            reply.first_at = now
            if reply.ended_at is not None:
                self.stats.first_audio_ms.append((now - reply.ended_at) * 1000.0)
        elif reply.last_at is not None and reply.interrupted_at is None:
            self.stats.gaps_ms.append((now - reply.last_at) * 1000.0)
        reply.last_at = now
        reply.audio_bytes += size

    def _on_done(self, rid: str, status: str, now: float) -> None:
        reply = self._replies.pop(rid, None)
        if rid in self._finished:
            return
        self._finished.add(rid)
        if status == "completed":
            self.stats.completed += 1
        elif status == "cancelled":
            self.stats.cancelled += 1
        if reply is None:
            return
        if reply.interrupted_at is not None and status == "cancelled":
            self.stats.cutoff_ms.append((now - reply.interrupted_at) * 1000.0)
        # Speaking over a reply under server VAD starts the next turn; the cancel does not end it.
        barged_by_voice = self.plan.turn_end == "vad" and reply.interrupted_at is not None
        if reply is self._answer and reply.turn == self._turn and not barged_by_voice:
            self._turn_over.set()

    # -- sending ------------------------------------------------------------------

    async def talk(self, *, start_in_s: float, stop_at: float) -> None:
        """Take turns from ``start_in_s`` from now until the loop time ``stop_at``."""
        loop = asyncio.get_running_loop()
        await asyncio.sleep(start_in_s)
        plan = self.plan
        audio = plan.audio
        frame_s = FRAME_MS / 1000.0
        turn_frames = max(1, plan.turn_ms // FRAME_MS)
        hard_stop = stop_at + plan.turn_timeout_s
        start = loop.time()
        tick = 0
        talking, index, barge = True, 0, False
        listen_since = 0.0
        self._begin_turn()
        while True:
            due = start + tick * frame_s
            delay = due - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            now = loop.time()
            lag_ms = (now - due) * 1000.0
            self.stats.send_lag_ms.append(lag_ms)
            self.stats.frames += 1
            if lag_ms > FRAME_MS:
                self.stats.late_frames += 1
            tick += 1
            if now >= hard_stop:
                break
            if plan.turn_end == "commit":
                await self._send_frame((tick - 1) % len(audio.frames))
            else:
                await self._send_frame(index if talking else None)
            if talking:
                index += 1
                ended = self._turn_ended(index, turn_frames, time.perf_counter())
                if ended:
                    talking, listen_since = False, time.perf_counter()
                    barge = self._rng.random() < plan.barge_in
                    await self._end_turn()
                continue
            answer = self._answer
            if (
                barge
                and answer is not None
                and answer.first_at is not None
                and answer.interrupted_at is None
                and time.perf_counter() - answer.first_at >= plan.barge_after_ms / 1000.0
            ):
                barge = False
                self.stats.barge_ins += 1
                if plan.turn_end == "commit":
                    answer.interrupted_at = time.perf_counter()
                    await self._send({"type": "response.cancel", "response_id": answer.response_id})
                else:  # speak over the reply: that speech is the next turn
                    talking, index = True, max(0, audio.speech_start - 10)
                    self._begin_turn()
                    continue
            over = self._turn_over.is_set()
            if not over and time.perf_counter() - listen_since > plan.turn_timeout_s:
                self.stats.timeouts += 1
                over = True
            if over:
                await self._after_reply()
                if now >= stop_at:
                    break
                talking, index = True, 0
                self._begin_turn()
                if plan.turn_end == "commit":
                    await self._send({"type": "input_audio_buffer.clear"})

    def _begin_turn(self) -> None:
        self._turn_over.clear()

    def _turn_ended(self, index: int, turn_frames: int, now: float) -> bool:
        audio = self.plan.audio
        if self.plan.turn_end == "commit":
            if index < turn_frames:
                return False
            self._mark_turn_end(now)
            return True
        if index == audio.speech_end + 1:
            self._mark_turn_end(now)
        return index >= len(audio.frames)

    def _mark_turn_end(self, now: float) -> None:
        self._turn += 1
        self.stats.turns += 1
        self._turn_ended_at = now
        self._answer = None

    async def _end_turn(self) -> None:
        if self.plan.turn_end != "commit":
            return
        if self.plan.wire == "vllm-omni":
            await self._send({"type": "input_audio_buffer.commit", "final": True, "response_create": True})
        else:
            await self._send({"type": "input_audio_buffer.commit"})
            await self._send({"type": "response.create"})

    async def _after_reply(self) -> None:
        answer = self._answer
        if self.plan.wire == "vllm-omni" and answer is not None:
            # vLLM-Omni answers the next turn only once the last reply is reported as played.
            played_ms = answer.audio_bytes * 1000 // (2 * _OUTPUT_RATE)
            await self._send(
                {"type": "playback.ack", "response_id": answer.response_id, "played_ms": played_ms}
            )

    async def _send_frame(self, index: int | None) -> None:
        """The microphone's next 20 ms: frame ``index`` of the recording (None: silence)."""
        audio = self.plan.audio
        await self._ws.send(audio.silence if index is None else audio.frames[index])

    async def _send(self, event: dict[str, Any]) -> None:
        await self._ws.send(json.dumps(event))
