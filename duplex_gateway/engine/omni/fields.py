"""vLLM-Omni's session fields as its engines read them, shared by the ``vllm-omni`` and ``remote`` engines.

The gateway keeps these fields in :class:`~duplex_gateway.session_config.SessionConfig`
(validated where it has an opinion); here they become the keys of a vLLM-Omni
``session`` object. An update carries only what changed (:func:`changed_fields`):
vLLM-Omni refuses some fields once a session has produced audio (``voice``) or
at all after the open (``ref_audio``), so an update must never repeat them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping

from duplex_gateway.engine.port import EngineRefused
from duplex_gateway.session_config import VLLM_OMNI_FIELDS, SessionConfig

__all__ = ["PendingUpdates", "changed_fields", "omni_session_fields"]

#: The vLLM-Omni key of each configuration field whose name differs.
_WIRE_NAMES = {"noise_reduction": "input_audio_noise_reduction"}


def omni_session_fields(config: SessionConfig) -> dict[str, object]:
    """The vLLM-Omni session fields ``config`` sets (those left at the engine's default are absent)."""
    fields: dict[str, object] = {}
    for name in VLLM_OMNI_FIELDS:
        value = getattr(config, name)
        if value is None or (isinstance(value, Mapping) and not value and name == "extra_body"):
            continue
        fields[_WIRE_NAMES.get(name, name)] = dict(value) if isinstance(value, Mapping) else value
    return fields


def changed_fields(before: Mapping[str, object], after: Mapping[str, object]) -> dict[str, object]:
    """The keys of ``after`` whose values differ from ``before``; a key ``after`` dropped is sent as null."""
    changes = {key: value for key, value in after.items() if key not in before or before[key] != value}
    for key in before:
        if key not in after:
            changes[key] = None
    return changes


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
