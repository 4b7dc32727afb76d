"""The seam between a wire protocol and the gateway's one vocabulary.

A :class:`Dialect` is a pure translator (no socket, no clock): client frames in,
:mod:`~duplex_gateway.vocabulary.commands` out; :mod:`~duplex_gateway.vocabulary.events` in, frames
out. The connection holds one per socket and knows nothing else of the protocol,
so the OpenAI Realtime dialect and the telephony carriers' dialects plug in the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.events import ServerEvent
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["Dialect", "Frame", "PacedDialect"]


class Dialect(Protocol):
    """Translates one connection's frames and events; one instance per connection."""

    def parse(self, frame: Frame) -> Sequence[Command]:
        """The commands one client frame carries (any number); raises only ``ProtocolError``."""
        ...

    def render(self, event: ServerEvent, *, seq: int) -> Frame | None:
        """``event`` as the frame the client gets, numbered ``seq``; None if the dialect has no form for it."""
        ...

    def render_unsequenced(self, event: ServerEvent) -> Frame:
        """``event`` outside the numbered stream (a resume's greeting, a takeover's farewell).

        It carries no sequence number, as in vLLM-Omni's resume contract: a client drops
        any event numbered at or below the last one it saw as a replayed duplicate, so a
        greeting that repeated that number would be lost with the new token it brings.
        """
        ...


@runtime_checkable
class PacedDialect(Protocol):
    """A dialect that sends some frames at its own pace (a phone call's reply audio).

    The connection asks it for what is due whenever it rendered something and when the
    time it named comes, and passes on the commands the dialect has for the session.
    """

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        """The frames due at ``now``, and when to ask again (None: after the next render)."""
        ...

    def tick(self, now: float) -> None:
        """The time of the next :meth:`Dialect.render` call."""
        ...

    def take_commands(self) -> list[Command]:
        """Commands the dialect has for the session (e.g. a truncation after a clear)."""
        ...

    @property
    def wants_pump(self) -> bool:
        """A client frame it parsed may let paced frames go out now (flow control resumed)."""
        ...
