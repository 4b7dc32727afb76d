"""The bounded queue between an engine session's producers and its one reader."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from duplex_gateway.engine import port

__all__ = ["EngineEventQueue", "EngineEventStream"]

#: Takes one event where it is put; False: not now (the event is queued for the stream instead).
Taker = Callable[[port.EngineEvent], bool]


class EngineEventQueue:
    """Engine events in order, bounded; :meth:`stream` ends after :class:`port.EngineClosed`.

    ``put`` waits for room (backpressure on a reply that outruns its reader);
    ``put_urgent`` never waits, dropping the oldest event if it must, so a
    terminal event still gets through to a reader that has stopped reading;
    ``offer`` drops the event instead (for output that a later event supersedes).

    An event put while nothing is queued goes straight to the reader's taker, if it
    set one (:meth:`EngineEventStream.take_at_once`) and the taker takes it: the
    reader's task is then not woken once per reply chunk.
    """

    def __init__(self, maxsize: int) -> None:
        self._queue: asyncio.Queue[port.EngineEvent] = asyncio.Queue(maxsize)
        self._taker: Taker | None = None

    async def put(self, event: port.EngineEvent) -> None:
        if not self._taken(event):
            await self._queue.put(event)

    def offer(self, event: port.EngineEvent) -> None:
        if not self._taken(event):
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(event)

    def put_urgent(self, event: port.EngineEvent) -> None:
        if self._taken(event):
            return
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

    def stream(self) -> EngineEventStream:
        """The events, for the queue's one reader."""
        return EngineEventStream(self)

    def _taken(self, event: port.EngineEvent) -> bool:
        # Only past an empty queue: an event queued earlier (even one the reader's task was
        # already woken for, which stays queued until that task runs) must be read first.
        # EngineClosed ends the stream, so the stream itself must read it.
        taker = self._taker
        return (
            taker is not None
            and self._queue.empty()
            and not isinstance(event, port.EngineClosed)
            and taker(event)
        )


class EngineEventStream(AsyncIterator[port.EngineEvent]):
    """An :class:`EngineEventQueue`'s events in order, ending after :class:`port.EngineClosed`."""

    def __init__(self, queue: EngineEventQueue) -> None:
        self._queue = queue
        self._ended = False

    def take_at_once(self, taker: Taker | None) -> None:
        """Have ``taker`` take each event where it is put, while nothing is queued before it.

        ``taker`` runs in the producer's task, and returns False to have the event queued
        for this stream instead (e.g. while the reader is in the middle of a step of its
        own that the event must not interleave with). None: stop.
        """
        self._queue._taker = taker

    def __aiter__(self) -> EngineEventStream:
        return self

    async def __anext__(self) -> port.EngineEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue._queue.get()
        if isinstance(event, port.EngineClosed):
            self._ended = True
        return event
