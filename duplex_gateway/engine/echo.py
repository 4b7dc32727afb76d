"""The ``echo`` engine: a loopback for people integrating a client.

Each committed caller turn is answered by streaming the caller's own audio back
in chunks, paced like speech, with a transcript event saying what it is. A
cancel or barge-in stops the reply mid-way. No model, no GPU: it exercises
every part of a client's audio path (capture, framing, turn-taking, playback,
interruption) against the real gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from duplex_gateway.engine import port
from duplex_gateway.engine.event_queue import EngineEventQueue
from duplex_gateway.engine.spec import EngineSpec, SettingsSection
from duplex_gateway.vocabulary.session_config import SessionConfig

if TYPE_CHECKING:
    from duplex_gateway.config import GatewaySettings

__all__ = ["SPEC", "EchoEngine", "EchoSession", "EchoSettings"]

_EVENT_QUEUE_SIZE = 256


class EchoSession(port.EngineSession):
    """One caller's loopback."""

    appends_without_waiting = True  # the audio is only kept

    def __init__(self, engine: EchoEngine, session_id: str) -> None:
        self._engine = engine
        self._session_id = session_id
        self._rate = engine.capabilities.input_rate
        self._max_turn_bytes = int(engine.max_turn_s * self._rate) * 2
        self._turn = bytearray()
        self._last_turn = b""
        self._events = EngineEventQueue(_EVENT_QUEUE_SIZE)
        self._reply: asyncio.Task[None] | None = None
        self._reply_id: str | None = None
        self._closed = False

    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        # The client's chunk hints are not read: this engine hears the audio itself.
        self._turn += pcm
        overflow = len(self._turn) - self._max_turn_bytes
        if overflow > 0:  # a monologue: keep its most recent max_turn_s
            del self._turn[: overflow + (overflow & 1)]

    async def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> None:
        self._last_turn = bytes(self._turn)
        self._turn.clear()
        if response_id is not None:
            await self.create_response(response_id=response_id, instructions=None)

    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        # Text has no audio to echo; the loopback only repeats sound.
        return None

    async def clear_input(self) -> None:
        self._turn.clear()

    async def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> None:
        await self._stop_reply()
        self._reply_id = response_id
        self._reply = asyncio.create_task(
            self._speak(response_id, self._last_turn), name=f"echo:{response_id}"
        )

    async def cancel_response(self, response_id: str) -> None:
        if self._reply_id == response_id:
            await self._stop_reply()

    async def barge_in(self) -> None:
        await self._stop_reply()

    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        return None  # a loopback has nothing to resume from what was heard

    async def update(self, config: SessionConfig) -> None:
        return None

    async def close(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        await self._stop_reply()
        self._engine._release(self._session_id)
        self._events.put_urgent(port.EngineClosed(reason=reason))

    def events(self) -> AsyncIterator[port.EngineEvent]:
        return self._events.stream()

    # -- the reply ----------------------------------------------------------------

    async def _speak(self, response_id: str, audio: bytes) -> None:
        chunk_bytes = max(2, int(self._rate * self._engine.chunk_ms / 1000) * 2)
        pace_s = self._engine.chunk_ms / 1000.0 / self._engine.pace if self._engine.pace > 0 else 0.0
        seconds = len(audio) / (2 * self._rate)
        loop = asyncio.get_running_loop()
        try:
            if self._engine.start_delay_s > 0:
                await asyncio.sleep(self._engine.start_delay_s)
            await self._events.put(port.EngineResponseStarted(response_id=response_id))
            text = f"(echo of {seconds:.1f} s of your audio)" if audio else "(nothing to echo yet)"
            await self._events.put(port.EngineTranscript(response_id=response_id, delta=text))
            started = loop.time()
            for index, offset in enumerate(range(0, len(audio), chunk_bytes)):
                await self._events.put(
                    port.EngineAudio(response_id=response_id, pcm=audio[offset : offset + chunk_bytes])
                )
                # Pace against a fixed schedule so the reply plays out in (scaled) real time.
                delay = started + (index + 1) * pace_s - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await self._events.put(port.EngineResponseDone(response_id=response_id, status="completed"))
        except asyncio.CancelledError:
            self._events.put_urgent(port.EngineResponseDone(response_id=response_id, status="cancelled"))
            raise

    async def _stop_reply(self) -> None:
        task, self._reply, self._reply_id = self._reply, None, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class EchoEngine(port.Engine):
    """Answers every turn with the caller's own audio.

    ``rate``: sample rate of the engine side (both directions); ``chunk_ms``:
    size of each reply chunk; ``pace``: speed of the reply relative to real time
    (0 sends as fast as the client reads); ``max_turn_s``: longest turn kept;
    ``start_delay_ms``: time before a requested reply starts, to let clients meet
    the gap a real model leaves between a turn's end and its first audio.
    """

    def __init__(
        self,
        *,
        rate: int = 24_000,
        chunk_ms: int = 100,
        pace: float = 1.0,
        max_turn_s: float = 60.0,
        start_delay_ms: int = 0,
        max_sessions: int | None = None,
    ) -> None:
        self._caps = port.EngineCapabilities(
            name="echo", input_rate=rate, output_rate=rate, max_sessions=max_sessions
        )
        self.chunk_ms = chunk_ms
        self.pace = pace
        self.max_turn_s = max_turn_s
        self.start_delay_s = start_delay_ms / 1000.0
        self._sessions: dict[str, EchoSession] = {}
        self._started = False

    @property
    def capabilities(self) -> port.EngineCapabilities:
        return self._caps

    @property
    def ready(self) -> bool:
        return self._started

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    async def start(self) -> None:
        self._started = True

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        if not self._started:
            raise port.EngineUnavailable("the echo engine is not started")
        limit = self._caps.max_sessions
        if limit is not None and len(self._sessions) >= limit:
            raise port.EngineSessionLimit(f"the echo engine holds {limit} sessions already")
        session = EchoSession(self, session_id)
        self._sessions[session_id] = session
        return session

    def _release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            await session.close("shutdown")
        self._started = False


class EchoSettings(SettingsSection):
    # No docstring: the configuration reference (docs/configuration.md) prints it above the section.
    rate: int = Field(24_000, ge=8_000, le=48_000)
    chunk_ms: int = Field(100, ge=10, le=1000)
    #: Speed of the echoed reply relative to real time; 0 sends it as fast as possible.
    pace: float = Field(1.0, ge=0)
    max_turn_s: float = Field(60.0, gt=0)
    #: Time from a reply's request to its start, as a model's time to first audio would be.
    start_delay_ms: int = Field(0, ge=0, le=60_000)


def _build(settings: GatewaySettings) -> port.Engine:
    echo = SPEC.settings_of(settings)
    return EchoEngine(
        rate=echo.rate,
        chunk_ms=echo.chunk_ms,
        pace=echo.pace,
        max_turn_s=echo.max_turn_s,
        start_delay_ms=echo.start_delay_ms,
        max_sessions=settings.limits.max_sessions,
    )


SPEC = EngineSpec(
    name="echo",
    section="echo",
    settings=EchoSettings,
    build=_build,
    summary="a loopback: each turn comes back as the reply",
)
