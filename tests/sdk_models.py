"""Server events checked against the official ``openai`` SDK's own models, exactly as sent.

openai-agents parses every server event with a pydantic ``TypeAdapter`` of the SDK's
server-event union (discriminated by ``type``) and drops, with an error, any event
that does not validate. These helpers do the same, in pydantic's strict mode, so a
test fails on anything a strict client would reject: an unknown ``type``, a missing
required field, a value outside a ``Literal``.
"""

from __future__ import annotations

from functools import cache
from typing import Annotated, Any

import pydantic
from pydantic import Field, TypeAdapter

__all__ = ["EXTENSION_EVENTS", "validate_server_event"]

#: vLLM-Omni duplex events, sent only to a client that spoke that dialect first: replies
#: to its own ``session.heartbeat`` / ``playback.ack`` / ``session.resume``, and
#: ``session.closed`` for the duplex handshake.
EXTENSION_EVENTS = frozenset(
    {
        "playback.acknowledged",
        "session.heartbeat_ack",
        "session.closed",
        "session.resumed",
        "session.replaced",
        "session.resync_required",
        # The gateway's latency breakdown, sent only to a client that asked (``session.include``).
        "turn.latency",
        # vLLM-Omni's overlap policy decisions: to duplex clients, and to clients that asked.
        "overlap.decision",
        # The gateway's drain warning: to duplex clients, and to clients that asked (``session.include``).
        "session.closing",
        # The gateway's word that the engine does not use some input (camera frames, pictures),
        # sent only to a client that sent such input.
        "input.ignored",
    }
)


@cache
def _adapter(beta: bool) -> TypeAdapter[Any]:
    if beta:
        from openai.types.beta.realtime.realtime_server_event import RealtimeServerEvent as Beta

        return TypeAdapter(Annotated[Beta, Field(discriminator="type")])
    from openai.types.realtime.realtime_server_event import RealtimeServerEvent as Ga

    return TypeAdapter(Annotated[Ga, Field(discriminator="type")])


def validate_server_event(wire: dict[str, Any], *, beta: bool = False) -> pydantic.BaseModel:
    """The SDK model of ``wire``; raises ``pydantic.ValidationError`` where a strict client would."""
    model = _adapter(beta).validate_python(wire, strict=True)
    assert isinstance(model, pydantic.BaseModel)
    return model
