"""The socket side of a session: what goes out, in order, without the sender ever waiting.

An :class:`Attachment` is one WebSocket serving a session. The session's side
hands it frames with :meth:`Attachment.send`, which never blocks: frames wait in
an outbox that one writer task drains into the socket. A client that stops
reading is noticed here and only here: once the outbox holds more than its high
water mark for ``stall_timeout_s`` (or four times that mark at any moment, which
bounds the memory a stalled client can pin), the attachment reports the client
as stalled and stops writing.

A socket that can write without awaiting (the server's direct socket, see
:mod:`duplex_gateway.server.direct_socket`) gets each frame written at once while nothing is
queued before it: the writer task then wakes only for a client that does not keep up.

Its owner may watch it: ``on_queued`` hears the outbox depth after each frame is
queued, ``on_written`` the size of each frame written, and a frame sent with
``on_sent`` has that called, with the loop's time, once it is written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from duplex_gateway.host.closing import Close
from duplex_gateway.vocabulary.frames import Frame, Socket, frame_size

__all__ = ["Attachment", "Close"]


@dataclass(frozen=True, slots=True)
class _Tracked:
    """A frame whose owner wants to know when it was written."""

    frame: Frame
    on_sent: Callable[[float], None]


class Attachment:
    """One socket serving a session: a bounded outbox and the task that writes it out."""

    def __init__(
        self,
        socket: Socket,
        *,
        high_water: int,
        stall_timeout_s: float,
        on_stalled: Callable[[], None],
        name: str,
        on_queued: Callable[[int], None] | None = None,
        on_written: Callable[[int], None] | None = None,
    ) -> None:
        self.socket = socket
        self._outbox: deque[Frame | _Tracked | Close] = deque()
        self._on_queued = on_queued
        self._on_written = on_written
        self._high_water = high_water
        self._stall_timeout_s = stall_timeout_s
        self._on_stalled = on_stalled
        self._stall_timer: asyncio.TimerHandle | None = None
        self._wake = asyncio.Event()
        self._closing: Close | None = None
        self.stalled = False
        #: The close of a stalled client's socket, under way (see close_stalled).
        self._stalled_close: asyncio.Task[None] | None = None
        self._name = name
        self._write_now: Callable[[Frame], bool] | None = getattr(socket, "write_now", None)
        #: The writer holds a frame it has taken from the outbox and not written yet.
        self._writing = False
        self.writer = asyncio.create_task(self._write_loop(), name=f"writer:{name}")

    def send(self, frame: Frame, *, on_sent: Callable[[float], None] | None = None) -> None:
        """Queue ``frame`` after everything queued before; returns at once.

        ``on_sent`` is called with the loop's time once the frame is written (never if it is dropped).
        """
        if self._closing is not None or self.stalled:
            return
        write_now = self._write_now
        if write_now is not None and not self._outbox and not self._writing and write_now(frame):
            if self._on_queued is not None:
                self._on_queued(0)  # nothing waits behind the client
            self._written(frame, on_sent)
            return
        self._outbox.append(frame if on_sent is None else _Tracked(frame, on_sent))
        self._wake.set()
        backlog = len(self._outbox)
        if self._on_queued is not None:
            self._on_queued(backlog)
        if backlog > 4 * self._high_water:
            self._stall()
        elif backlog > self._high_water and self._stall_timer is None:
            loop = asyncio.get_running_loop()
            self._stall_timer = loop.call_later(self._stall_timeout_s, self._check_stalled)

    def close_after(self, close: Close) -> None:
        """Close the socket with ``close`` after what is queued; later sends are dropped."""
        if self._closing is not None or self.stalled:
            return
        self._closing = close
        self._outbox.append(close)
        self._wake.set()

    async def finish(self, close: Close | None, timeout_s: float) -> None:
        """Drain the outbox, then close with ``close`` (or just stop, leaving the socket open)."""
        self._cancel_stall_timer()
        if close is not None:
            self.close_after(close)
        else:
            self.writer.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(self.writer), timeout_s)
        except asyncio.CancelledError:
            # A writer stopped earlier (a stalled client, or no close wanted) has nothing
            # left to do; only a cancellation of this task itself goes on.
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
        except Exception:  # noqa: BLE001 - a writer stuck or failed in any way is stopped the same
            self.writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.writer
            if close is not None:
                with contextlib.suppress(Exception):
                    await self.socket.close(int(close.code), close.reason)

    def close_stalled(self, close: Close) -> None:
        """Close a stalled client's socket with ``close`` now: nothing queued can reach it any more."""
        self._stalled_close = asyncio.get_running_loop().create_task(
            self._close_now(close), name=f"stalled:{self._name}"
        )

    async def await_stalled_close(self, timeout_s: float) -> None:
        """Give a stalled client's close ``timeout_s`` to go out, then let the socket go.

        The close waits behind what the client has not read: returning before it is written
        would have the server drop the connection without it (the client saw 1006). A client
        that never reads again is not waited for longer, and no task is left behind.
        """
        task, self._stalled_close = self._stalled_close, None
        if task is None:
            return
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(task)
        except TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _close_now(self, close: Close) -> None:
        with contextlib.suppress(Exception):
            await self.socket.close(int(close.code), close.reason)

    # -- the writer ------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        outbox = self._outbox
        while True:
            if not outbox:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = outbox.popleft()
            if isinstance(item, Close):
                with contextlib.suppress(Exception):
                    await self.socket.close(int(item.code), item.reason)
                return
            frame = item.frame if isinstance(item, _Tracked) else item
            self._writing = True
            try:
                if isinstance(frame, str):
                    await self.socket.send_text(frame)
                else:
                    await self.socket.send_bytes(frame)  # type: ignore[attr-defined]
            except Exception:  # noqa: BLE001 - any send failure means the client is gone
                return  # the reader sees the disconnect
            finally:
                self._writing = False
            self._written(frame, item.on_sent if isinstance(item, _Tracked) else None)
            if self._stall_timer is not None and len(outbox) <= self._high_water:
                self._cancel_stall_timer()

    def _written(self, frame: Frame, on_sent: Callable[[float], None] | None) -> None:
        if self._on_written is not None:
            self._on_written(frame_size(frame))
        if on_sent is not None:
            on_sent(asyncio.get_running_loop().time())

    def _check_stalled(self) -> None:
        self._stall_timer = None
        if len(self._outbox) > self._high_water:
            self._stall()

    def _stall(self) -> None:
        if self.stalled:
            return
        self.stalled = True
        self._cancel_stall_timer()
        self._outbox.clear()
        self.writer.cancel()
        self._on_stalled()

    def _cancel_stall_timer(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
