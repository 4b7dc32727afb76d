"""The bounded queue between an engine session's producers and its one reader."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from duplex_gateway.engine import port

__all__ = ["EngineEventQueue"]


class EngineEventQueue:
    """Engine events in order, bounded; :meth:`stream` ends after :class:`port.EngineClosed`.

    ``put`` waits for room (backpressure on a reply that outruns its reader);
    ``put_urgent`` never waits, dropping the oldest event if it must, so a
    terminal event still gets through to a reader that has stopped reading;
    ``offer`` drops the event instead (for output that a later event supersedes).
    """

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[port.EngineEvent] = asyncio.Queue(maxsize)

    async def put(self, event: port.EngineEvent) -> None:
        await self._queue.put(event)

    def offer(self, event: port.EngineEvent) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(event)

    def put_urgent(self, event: port.EngineEvent) -> None:
        while True:
            try:
                self._queue.put_nowait(event)
                return
            except asyncio.QueueFull:
                self._queue.get_nowait()

    def discard(self, unwanted: Callable[[port.EngineEvent], bool]) -> None:
        """Take events the reader has not read yet back out (e.g. a stopped reply's output)."""
        kept = []
        while not self._queue.empty():
            event = self._queue.get_nowait()
            if not unwanted(event):
                kept.append(event)
        for event in kept:
            self._queue.put_nowait(event)

    async def stream(self) -> AsyncIterator[port.EngineEvent]:
        while True:
            event = await self._queue.get()
            yield event
            if isinstance(event, port.EngineClosed):
                return
