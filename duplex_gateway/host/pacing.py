"""Telephony pacing: a phone call's reply audio goes to the carrier in real time, not as fast as it is made.

A :class:`~duplex_gateway.dialects.base.PacedDialect` holds the frames it paces and
says, each time it is pumped, which are due now and when it next wants to be woken.
The dialect keeps no clock; the :class:`Pacer` is that clock: one loop timer, set to
the earliest wake-up asked for, that pumps the dialect and hands its frames on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from duplex_gateway.dialects.base import PacedDialect
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["Pacer"]

logger = logging.getLogger(__name__)


class Pacer:
    """Wakes a paced dialect when its frames are due and sends what it gives back."""

    def __init__(
        self,
        dialect: PacedDialect,
        *,
        send: Callable[[Frame], None],
        stopped: Callable[[], bool],
        failed: Callable[[], None],
        name: str,
    ) -> None:
        """``send`` takes each due frame; no pump runs once ``stopped()``; ``failed`` hears a pump that raised."""
        self.dialect = dialect
        self._send = send
        self._stopped = stopped
        self._failed = failed
        self._name = name
        self._timer: asyncio.Handle | None = None
        #: When the timer is set for (None with a timer: as soon as this step is done).
        self._at: float | None = None

    @property
    def wants_pump(self) -> bool:
        """The dialect has frames to pace again (e.g. the carrier takes audio again after a pause)."""
        return self.dialect.wants_pump

    def clock(self, now: float) -> None:
        """Tell the dialect the time (before it parses a frame or renders an event)."""
        self.dialect.tick(now)

    def take_commands(self) -> Sequence[Command]:
        """The commands the dialect made of the time passing (e.g. playback acknowledged)."""
        return self.dialect.take_commands()

    def pump_soon(self) -> None:
        """Pump the dialect as soon as this step is done (it may have queued frames)."""
        self._wake(None)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _wake(self, at: float | None) -> None:
        """Have the dialect's due frames sent at ``at`` (None: as soon as this step is done)."""
        loop = asyncio.get_running_loop()
        if at is None:
            if self._timer is not None and self._at is None:
                return  # already due
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._at = loop.call_soon(self._pump), None
            return
        if self._timer is not None and (self._at is None or self._at <= at):
            return  # an earlier wake-up is set
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._at = loop.call_at(at, self._pump), at

    def _pump(self) -> None:
        self._timer = self._at = None
        if self._stopped():
            return
        try:
            frames, wake = self.dialect.pump(asyncio.get_running_loop().time())
        except Exception:  # a bug must cost this session only
            logger.exception("pacing the output of session %s failed", self._name)
            self._failed()
            return
        for frame in frames:
            self._send(frame)
        if wake is not None:
            self._wake(wake)
