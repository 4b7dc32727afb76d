"""Caller input held back while a vLLM-Omni backend would take it for talking over a reply.

vLLM-Omni treats input that reaches a session while a reply is in progress, or
while the client has not reported the reply played (its ``ACK_ONLY`` playback
ledger), as overlap: quiet chunks are dropped, the rest is set aside, and what was
set aside is discarded when the reply is cancelled or slips into a later commit.
A commit sent then can find its buffer empty (``input_audio_buffer_empty``) while
the turn's audio lands in the next one. Where the gateway decides the turns, what
the caller says must reach the backend as a turn of its own, so
:class:`~duplex_gateway.engine.remote.protocol.BackendWire` holds caller input here
until the backend is free and sends it then, in order, with whatever came after it.

Pure: no asyncio, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

__all__ = ["InputGate"]

R = TypeVar("R")


@dataclass(slots=True)
class _Held(Generic[R]):
    event: dict[str, Any]
    #: The reply this event asks for (a commit with ``response_create``, a ``response.create``).
    request: R | None


class InputGate(Generic[R]):
    """A FIFO of client events waiting for the backend to be free."""

    def __init__(self) -> None:
        self._held: deque[_Held[R]] = deque()

    @property
    def waiting(self) -> bool:
        """Some event waits: everything sent after it must wait behind it."""
        return bool(self._held)

    def hold(self, event: dict[str, Any], request: R | None = None) -> None:
        self._held.append(_Held(event, request))

    def release(
        self, busy: Callable[[], bool], started: Callable[[R], None], *, force: bool = False
    ) -> list[dict[str, Any]]:
        """The events that may go now, in order: all of them up to one that asks for a reply.

        ``busy``: whether the backend still holds the turn; ``started``: told of each
        reply asked for as its event is released (it makes the backend busy again, so
        what follows waits for that reply in turn). ``force``: everything, busy or not.
        """
        out: list[dict[str, Any]] = []
        while self._held and (force or not busy()):
            held = self._held.popleft()
            out.append(held.event)
            if held.request is not None:
                started(held.request)
        return out

    def withdraw(self, matches: Callable[[R], bool]) -> bool:
        """Take back the reply a held event asks for (cancelled before it was sent); True if one was."""
        found = False
        for held in list(self._held):
            if held.request is None or not matches(held.request):
                continue
            found = True
            held.request = None
            if held.event.get("type") == "response.create":
                self._held.remove(held)
            else:  # the commit still commits the turn, without asking for a reply
                held.event["response_create"] = False
        return found
