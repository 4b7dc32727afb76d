"""How long the reader waits for the client's next message: one timer per connection, not one per message.

``asyncio.timeout`` around every ``receive`` makes, schedules and cancels a timer for each
message; at 50 audio frames a second per caller that was a large share of a connection's
own work. :class:`ReadDeadline` keeps one timer for the whole connection and moves it only
when it fires early: the reader marks when each wait begins (one clock read), and the
timer, due at the earliest the wait could run out, checks when it fires whether it really
has, and sleeps again if not. The bounds are the same as before: the idle timeout counts
from the start of each wait for a message, the session's deadline is absolute.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["ReadDeadline"]


class ReadDeadline:
    """Cancels ``task`` once a wait for a message has lasted ``idle_s``, or at ``deadline()`` (loop time).

    The reader calls :meth:`begin` before each ``receive`` and :meth:`end` after it; a
    ``CancelledError`` out of the ``receive`` is this deadline's when :meth:`expired` says so.
    """

    def __init__(self, task: asyncio.Task[object], idle_s: float, deadline: Callable[[], float]) -> None:
        self._loop = asyncio.get_running_loop()
        self._task = task
        self._idle_s = idle_s
        self._deadline = deadline
        self._since = self._loop.time()
        self._waiting = False
        self._fired = False
        self._timer: asyncio.TimerHandle | None = None

    def begin(self) -> None:
        """A wait for the client's next message starts now."""
        self._since = self._loop.time()
        self._waiting = True
        if self._timer is None:
            self._timer = self._loop.call_at(self._due(), self._check)

    def end(self) -> None:
        """The wait is over (a message came, or the wait was cancelled)."""
        self._waiting = False

    def expired(self) -> bool:
        """Whether the ``CancelledError`` just raised in the wait was this deadline's alone.

        Takes back this deadline's cancellation; False when the task was not cancelled by it,
        or is being cancelled for another reason too (which then goes on).
        """
        if not self._fired:
            return False
        self._fired = False
        self._task.uncancel()
        return self._task.cancelling() == 0

    def close(self) -> None:
        """The reader is done: no timer is left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _due(self) -> float:
        return min(self._since + self._idle_s, self._deadline())

    def _check(self) -> None:
        self._timer = None
        if not self._waiting:
            return  # rearmed by the next begin()
        due = self._due()
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._check)
            return
        self._fired = True
        self._task.cancel()
