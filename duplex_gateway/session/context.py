"""What the application adds to a conversation in progress: context appends, and the caller muted.

A :class:`~duplex_gateway.vocabulary.commands.ContextAppend` enters the conversation as an item:
general context as a system message, the answer to a delegation as the output of the engine's
function call that made it; commentary, meant to be spoken, has the model speak up when neither
it nor the caller is speaking. Muting keeps the caller's audio stream (and so the session's clock)
going with silence in place of their voice.

:func:`on_context` is the session's handler for both commands (its dispatch table names it); it
lives here to keep the session's module small. Pure.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from duplex_gateway.session.conversation import Conversation
from duplex_gateway.session.engine_calls import Output
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding

if TYPE_CHECKING:
    from duplex_gateway.session.machine import Session

__all__ = ["CHANNELS", "AppContext", "append_context", "on_context", "silenced", "speak_owed"]

#: The channels a context append may take (the Live API's three).
CHANNELS = frozenset({"instructions", "thinking", "commentary"})

#: One sample of silence in each encoding (G.711's is not zero; G.722 has no byte of its own).
_SILENT_BYTE = {Encoding.G711_ULAW: b"\xff", Encoding.G711_ALAW: b"\xd5"}


def append_context(conversation: Conversation, command: cmd.ContextAppend) -> list[Output]:
    """``command`` as a conversation item, and the event that says it is in."""
    if command.channel not in CHANNELS:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"unknown channel {command.channel!r}", param="channel")
    if not command.content.strip():
        raise ProtocolError(ErrorCode.INVALID_VALUE, "the content is empty", param="content")
    if command.delegation_id is None:
        item = cmd.ConversationItemCreate(
            event_id=command.event_id, item_id=command.item_id, role="system", text=command.content
        )
        item_id, after = conversation.place(item)
        outputs = conversation.add_message(item, item_id, after, ())
    else:
        item = cmd.ConversationItemCreate(
            event_id=command.event_id,
            item_id=command.item_id,
            role="tool",
            text="",
            kind="function_call_output",
            call_id=command.delegation_id,
            output=command.content,
        )
        outputs = conversation.add_function_item(item)
        item_id = next(o.item.id for o in outputs if isinstance(o, ev.ConversationItemAdded))
    appended = ctx.ContextAppended(
        channel=command.channel,
        item_id=item_id,
        delegation_id=command.delegation_id,
        event_id=command.event_id,
    )
    return [*outputs, appended]


def silenced(command: cmd.InputAudioAppend, session_format: AudioFormat) -> cmd.InputAudioAppend:
    """``command`` with silence of the same length in place of its audio (and no speech in its hints)."""
    encoding = command.encoding or session_format.encoding
    silent = _SILENT_BYTE.get(encoding, b"\x00") * len(command.audio)
    return replace(
        command, audio=silent, is_speech=False if command.is_speech is not None else None, hints={}
    )


class AppContext:
    """What the application changed of a session: context it appended, and whether the caller is muted."""

    __slots__ = ("_conversation", "muted", "owes_reply")

    def __init__(self, conversation: Conversation) -> None:
        self._conversation = conversation
        self.muted = False
        #: Commentary came while someone was speaking: the model speaks up once both are quiet.
        self.owes_reply = False

    def receive(self, command: cmd.ContextAppend | cmd.InputAudioMute) -> list[Output]:
        """Take ``command``: its item in the conversation, or the caller muted or heard again."""
        if isinstance(command, cmd.InputAudioMute):
            self.muted = command.muted
            return [ctx.InputAudioMuted(muted=command.muted)]
        return append_context(self._conversation, command)

    def heard(self, command: cmd.InputAudioAppend, session_format: AudioFormat) -> cmd.InputAudioAppend:
        """The caller audio the engine hears: ``command``'s, or silence while the caller is muted."""
        return silenced(command, session_format) if self.muted else command


def on_context(session: Session, command: cmd.ContextAppend | cmd.InputAudioMute, now: float) -> list[Output]:
    """The session's handler of :class:`cmd.ContextAppend` and :class:`cmd.InputAudioMute`."""
    outputs = session._app.receive(command)
    # Commentary is for the model to say: it speaks up unless it, or the caller, is speaking already.
    if isinstance(command, cmd.ContextAppend) and command.channel == "commentary":
        if session.transcribing_only:
            return outputs
        if session.response_active or session._turns.speaking:
            session._app.owes_reply = True  # said after the reply, or in the answer to the caller's turn
        else:
            outputs.extend(session._on_response_create(cmd.ResponseCreate(event_id=command.event_id), now))
    return outputs


def speak_owed(session: Session, now: float | None) -> list[Output]:
    """A reply for commentary that came while the model or the caller was speaking, now both are quiet."""
    if not session._app.owes_reply or session.response_active or session._turns.speaking or session.closed:
        return []
    # (A reply's request reads no clock: any time will do when the engine gave none.)
    return session._on_response_create(cmd.ResponseCreate(), 0.0 if now is None else now)
