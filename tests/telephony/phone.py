"""A carrier's side of a call, over a real socket: what a phone network does to the gateway.

:class:`Phone` streams the caller's audio in real time, frame by frame, as the carrier
would, and plays what the gateway sends back the way the carrier's playout buffer
does: audio is played at real time in the order received, a mark is echoed when the
audio before it has played, and a clear drops what is unplayed. Each carrier's wire
shapes are a :class:`Wire` (its messages, from the carrier's docs), so one phone
serves every carrier's tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, Self

from websockets.asyncio.client import ClientConnection


@dataclass(slots=True)
class Out:
    """What the gateway sent, parsed by the carrier's wire: media, a mark, a clear, a hang-up, or other."""

    kind: str  # "media" | "mark" | "clear" | "hangup" | "other"
    at: float
    audio: bytes = b""
    name: str = ""
    raw: Any = None


class Wire(Protocol):
    """One carrier's message shapes, as the carrier itself sends and reads them."""

    #: Caller audio: bytes per second of the stream's encoding and the frame the carrier sends.
    frame_bytes: int
    bytes_per_second: int
    #: Clear semantics: echo pending marks at once (Twilio), or drop them silently.
    echoes_marks_on_clear: bool

    def greeting(self) -> list[str | bytes]: ...
    def media(self, audio: bytes, index: int) -> str | bytes: ...
    def mark_played(self, name: str) -> str | bytes | None: ...
    def cleared(self) -> str | bytes | None: ...
    def dtmf(self, digit: str) -> str | bytes: ...
    def stop(self) -> str | bytes | None: ...
    def parse(self, frame: str | bytes) -> Out: ...


@dataclass
class Phone:
    """One call: send the caller's side, play and record the gateway's side."""

    ws: ClientConnection
    wire: Wire
    sent: list[Out] = field(default_factory=list)
    played: bytearray = field(default_factory=bytearray)
    #: Marks echoed as played, with when; marks echoed because of a clear are in ``dropped_marks``.
    played_marks: list[tuple[str, float]] = field(default_factory=list)
    dropped_marks: list[str] = field(default_factory=list)
    clears: list[float] = field(default_factory=list)
    _buffer: list[Out] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def __aenter__(self) -> Self:
        for frame in self.wire.greeting():
            await self.ws.send(frame)
        self._tasks = [asyncio.create_task(self._receive()), asyncio.create_task(self._play())]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def say(self, audio: bytes, *, realtime: float = 1.0) -> None:
        """Stream ``audio`` as the carrier does: one frame per frame time."""
        step = self.wire.frame_bytes
        frame_s = step / self.wire.bytes_per_second
        start = time.monotonic()
        for index, offset in enumerate(range(0, len(audio), step)):
            await self.ws.send(self.wire.media(audio[offset : offset + step], index))
            delay = start + (index + 1) * frame_s / realtime - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)

    async def press(self, digit: str) -> None:
        await self.ws.send(self.wire.dtmf(digit))

    async def hang_up(self) -> None:
        frame = self.wire.stop()
        if frame is not None:
            await self.ws.send(frame)
        else:
            await self.ws.close()

    def media(self) -> list[Out]:
        return [o for o in self.sent if o.kind == "media"]

    async def wait(self, match: Callable[[Phone], bool], timeout: float = 20.0) -> None:
        async with asyncio.timeout(timeout):
            while not match(self):
                await asyncio.sleep(0.01)

    async def _receive(self) -> None:
        async for frame in self.ws:
            out = self.wire.parse(frame)
            out.at = time.monotonic()
            self.sent.append(out)
            if out.kind in ("media", "mark"):
                self._buffer.append(out)
            elif out.kind == "clear":
                self.clears.append(out.at)
                await self._clear()

    async def _clear(self) -> None:
        dropped = [o for o in self._buffer if o.kind == "mark"]
        self._buffer.clear()
        for mark in dropped:
            self.dropped_marks.append(mark.name)
            if self.wire.echoes_marks_on_clear:
                await self._send(self.wire.mark_played(mark.name))
        await self._send(self.wire.cleared())

    async def _play(self) -> None:
        """The carrier's playout: each piece of audio takes its duration; marks come back after it."""
        while True:
            if not self._buffer:
                await asyncio.sleep(0.005)
                continue
            out = self._buffer.pop(0)
            if out.kind == "mark":
                self.played_marks.append((out.name, time.monotonic()))
                await self._send(self.wire.mark_played(out.name))
                continue
            self.played += out.audio
            await asyncio.sleep(len(out.audio) / self.wire.bytes_per_second)

    async def _send(self, frame: str | bytes | None) -> None:
        if frame is not None:
            with contextlib.suppress(Exception):
                await self.ws.send(frame)


Sender = Callable[[str | bytes], Awaitable[None]]
