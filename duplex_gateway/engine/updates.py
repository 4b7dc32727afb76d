"""Session updates an engine sent and is waiting to hear about (the ``vllm-omni`` and ``remote`` engines).

vLLM-Omni answers each ``session.update`` with ``session.updated``, in order, or
with an error naming it; the engine's ``update`` call returns once it did. The
waiting needs the event loop, so it lives here, beside the pure translation in
:mod:`duplex_gateway.engine.omni`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from duplex_gateway.engine.port import EngineRefused

__all__ = ["PendingUpdates"]


class PendingUpdates:
    """Session updates sent to vLLM-Omni and not answered yet, by event id, oldest first.

    vLLM-Omni answers an update with ``session.updated`` (in order) or an error naming
    it; :meth:`send` returns once it did, or raises :class:`EngineRefused`.
    """

    def __init__(self) -> None:
        self._answers: dict[str, asyncio.Future[None]] = {}

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._answers

    async def send(self, event_id: str, sending: Awaitable[None]) -> None:
        """Send an update (``sending``) under ``event_id`` and wait for vLLM-Omni's answer to it."""
        answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._answers[event_id] = answer
        try:
            await sending
            await answer
        finally:
            self._answers.pop(event_id, None)

    def settle(self, event_id: str | None, refusal: EngineRefused | None = None) -> None:
        """Update ``event_id`` (None: the oldest) was taken, or refused with ``refusal``."""
        if event_id is None:
            event_id = next(iter(self._answers), None)
        answer = self._answers.pop(event_id, None) if event_id is not None else None
        if answer is None or answer.done():
            return
        if refusal is None:
            answer.set_result(None)
        else:
            answer.set_exception(refusal)

    def refuse_all(self, code: str, message: str) -> None:
        """The session ended: no update still waiting will be answered."""
        for event_id in list(self._answers):
            self.settle(event_id, EngineRefused(code, message))
