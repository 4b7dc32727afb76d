"""Server events about a conversation's context, which only a Live (full-duplex) client is told.

The application appends context and mutes the caller only through the Live API, so these
events answer only Live clients: the Realtime protocol has no form for them, and a Realtime
session never makes them. They are server events all the same, and travel the same road out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from duplex_gateway.vocabulary.events import ServerEvent

__all__ = ["LIVE_ONLY", "ContextAppended", "InputAudioMuted", "Notice"]


@dataclass(frozen=True, slots=True, kw_only=True)
class InputAudioMuted(ServerEvent):
    """The caller's audio is muted (the engine hears silence) or, with ``muted`` false, heard again."""

    type: ClassVar[str] = "input_audio.muted"
    muted: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextAppended(ServerEvent):
    """A :class:`~duplex_gateway.vocabulary.commands.ContextAppend` is in the conversation as ``item_id``."""

    type: ClassVar[str] = "context.appended"
    channel: str
    item_id: str
    delegation_id: str | None = None
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Notice(ServerEvent):
    """Something the client should know that is no error (how the gateway serves a setting it asked for)."""

    type: ClassVar[str] = "notice"
    code: str
    message: str


#: The event types here: a renderer for another protocol (a Realtime observer's) skips them.
LIVE_ONLY: frozenset[str] = frozenset({InputAudioMuted.type, ContextAppended.type, Notice.type})
