"""A session's life as a table: its phases, what moves it between them, and nothing else.

:class:`Lifecycle` holds a session's :class:`Phase` and moves it only as
:data:`PHASE_TRANSITIONS` says; an impossible move raises :class:`PhaseError`. Pure.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["PHASE_TRANSITIONS", "Happening", "Lifecycle", "Phase", "PhaseError"]


class Phase(enum.Enum):
    """Where a session is in its life."""

    #: A duplex handshake: nothing but ``session.update`` (and keep-alives) until it comes.
    AWAITING_CONFIG = "awaiting_config"
    #: The engine session is being opened with the client's configuration.
    OPENING = "opening"
    #: Configured: every command is handled (a Realtime handshake starts here).
    OPEN = "open"
    #: Over: nothing more is handled.
    CLOSED = "closed"


class Happening(enum.Enum):
    """What moves a session from one phase to the next."""

    #: The duplex client's first ``session.update``: the engine is asked to open.
    CONFIGURED = "configured"
    #: The engine session asked for by :class:`OpenEngine` is ready.
    ENGINE_OPENED = "engine_opened"
    #: Taken over from another gateway, which opened it: it goes on, open, with nothing to announce.
    CARRIED_ON = "carried_on"
    #: The client, the gateway or the engine ended the session.
    CLOSED = "closed"


_P, _H = Phase, Happening

#: Every move a session's life can make; any other (phase, happening) pair raises :class:`PhaseError`.
PHASE_TRANSITIONS: Mapping[tuple[Phase, Happening], Phase] = {
    (_P.AWAITING_CONFIG, _H.CONFIGURED): _P.OPENING,
    (_P.OPENING, _H.ENGINE_OPENED): _P.OPEN,
    (_P.AWAITING_CONFIG, _H.CARRIED_ON): _P.OPEN,
    (_P.OPEN, _H.CARRIED_ON): _P.OPEN,
    (_P.AWAITING_CONFIG, _H.CLOSED): _P.CLOSED,
    (_P.OPENING, _H.CLOSED): _P.CLOSED,
    (_P.OPEN, _H.CLOSED): _P.CLOSED,
    # The engine finished opening after the session ended (a shutdown raced it): it stays over.
    (_P.CLOSED, _H.ENGINE_OPENED): _P.CLOSED,
}


class PhaseError(RuntimeError):
    """A happening the session's phase does not allow (a host or session bug, never a client's)."""


class Lifecycle:
    """A session's phase, moved only by :data:`PHASE_TRANSITIONS`."""

    __slots__ = ("closed_from", "phase")

    def __init__(self, phase: Phase) -> None:
        self.phase = phase
        #: The phase the session was in when it closed.
        self.closed_from: Phase | None = None

    def move(self, happening: Happening) -> None:
        """Take the move ``happening`` makes; :class:`PhaseError` if the phase allows none."""
        try:
            after = PHASE_TRANSITIONS[self.phase, happening]
        except KeyError:
            raise PhaseError(f"a {self.phase.value} session cannot be {happening.value}") from None
        if after is Phase.CLOSED and self.phase is not Phase.CLOSED:
            self.closed_from = self.phase
        self.phase = after
