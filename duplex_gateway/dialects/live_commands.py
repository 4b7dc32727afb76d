"""Live API client events -> the gateway's commands, one parser per event type (:data:`PARSERS`).

Every parser reads its event strictly (the Live API refuses unknown fields) and may read and note
things in the connection's :class:`LiveState`: the startup configuration, the delegations the
client may answer. Pure: no I/O, no clock;
the session timeline is the caller's audio received, which a Live client streams without pause.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from duplex_gateway.dialects.live_backend import BackendDelegations
from duplex_gateway.dialects.live_errors import (
    DELEGATION_MODE_MISMATCH,
    FUNCTION_CALL_OUTPUTS_REQUIRED,
    INVALID_VALUE,
    NOT_SUPPORTED,
    SESSION_ALREADY_STARTED,
    SESSION_NOT_STARTED,
    bad_value,
    check_fields,
    decode_base64,
    missing,
    read_object,
    read_str,
    refuse,
    wrong_type,
)
from duplex_gateway.dialects.live_session import Delegation, LiveSetup, parse_start, parse_update
from duplex_gateway.vocabulary.commands import (
    Command,
    ContextAppend,
    ConversationItemCreate,
    InputAudioAppend,
    InputAudioMute,
    ResponseCreate,
    SessionClose,
    SessionUpdate,
)

__all__ = ["CONTEXT_CHANNELS", "MUTES", "PARSERS", "LiveState", "Parser"]

#: The three context-append channels, by client event type.
CONTEXT_CHANNELS: Mapping[str, str] = {
    "session.instructions.append": "instructions",
    "session.thinking.append": "thinking",
    "session.commentary.append": "commentary",
}
#: Whether each of the two mute events mutes the caller.
MUTES: Mapping[str, bool] = {"session.input_audio.mute": True, "session.input_audio.unmute": False}


@dataclass(slots=True)
class LiveState:
    """What one Live connection's dialect knows between frames."""

    setup: LiveSetup | None = None
    delegation: Delegation = field(default_factory=Delegation)
    start_event_id: str | None = None
    #: Whether the gateway's session has started (``session.started`` was rendered).
    started: bool = False
    #: ``event_id`` of each ``session.update`` not yet answered, oldest first.
    updates: list[str | None] = field(default_factory=list)
    close_event_id: str | None = None
    #: The session timeline: how much caller audio has arrived (ms).
    timeline_ms: float = 0.0
    #: Context appends so far (numbering the conversation items standing for them).
    appended: int = 0
    #: Client delegations the client may still answer (delegation id = the engine's call id).
    open_delegations: set[str] = field(default_factory=set)
    #: Responses delegation: function calls of the last delegated response still without an output.
    open_calls: set[str] = field(default_factory=set)
    #: Responses delegation: the delegation a ``response.create`` continues.
    continuing: str | None = None
    last_delegation: str | None = None
    #: Responses delegation handed to the gateway's backend model (None: the engine does the work).
    backend: BackendDelegations | None = None
    #: Server events of the dialect's own to go out next (the backend's ``response.event`` s).
    outbox: list[dict[str, object]] = field(default_factory=list)

    def now_ms(self) -> int:
        return int(self.timeline_ms)


#: One client event type's parser: the event, its ``event_id``, the connection's state -> commands.
Parser = Callable[[Mapping[str, object], str | None, LiveState], tuple[Command, ...]]


def _envelope(data: Mapping[str, object], *fields: str) -> None:
    check_fields(data, ("type", "event_id", *fields), "")


def _started(state: LiveState, kind: str) -> LiveSetup:
    if state.setup is None:
        raise refuse(
            SESSION_NOT_STARTED,
            f"{kind} was sent before session.start. Send session.start first and wait for session.started.",
        )
    return state.setup


def _session_start(data: Mapping[str, object], event_id: str | None, state: LiveState) -> tuple[Command, ...]:
    _envelope(data, "session")
    if state.setup is not None:
        raise refuse(SESSION_ALREADY_STARTED, "session.start was already sent; a session starts once.")
    session = read_object(data, "session", "", required=True)
    assert session is not None
    setup = parse_start(session)
    state.setup, state.delegation, state.start_event_id = setup, setup.delegation, event_id
    backend = _backend(state)
    if backend is not None:
        backend.configure(state.delegation.responses, state.delegation.tools, state.delegation.tool_choice)
        for message in setup.history:
            backend.transcript.add("system" if message.role == "developer" else message.role, message.text)
    patch = setup.patch(backend=backend is not None)
    return (SessionUpdate(event_id=event_id, session=patch), *setup.history_items(event_id))


def _backend(state: LiveState) -> BackendDelegations | None:
    """The backend that does this session's Responses delegation, if it has one."""
    return state.backend if state.delegation.target == "responses" else None


def _session_update(
    data: Mapping[str, object], event_id: str | None, state: LiveState
) -> tuple[Command, ...]:
    _envelope(data, "session")
    _started(state, "session.update")
    session = read_object(data, "session", "", required=True)
    assert session is not None
    backend = _backend(state)
    state.delegation, patch = parse_update(session, state.delegation, backend=backend is not None)
    if backend is not None:
        backend.configure(state.delegation.responses, state.delegation.tools, state.delegation.tool_choice)
    state.updates.append(event_id)
    return (SessionUpdate(event_id=event_id, session=patch),)


def _audio_append(data: Mapping[str, object], event_id: str | None, state: LiveState) -> tuple[Command, ...]:
    _envelope(data, "audio")
    setup = _started(state, "session.input_audio.append")
    audio = read_str(data, "audio", "", required=True)
    pcm = decode_base64(str(audio), "audio")
    fmt = setup.audio_format
    width = fmt.encoding.bytes_per_sample
    if len(pcm) % width:
        raise refuse(
            INVALID_VALUE,
            f"Invalid 'audio': {len(pcm)} bytes is not a whole number of {width}-byte samples.",
            param="audio",
        )
    state.timeline_ms += fmt.duration_ms(len(pcm))
    return (InputAudioAppend(event_id=event_id, audio=pcm),)


def _context_append(
    data: Mapping[str, object], event_id: str | None, state: LiveState
) -> tuple[Command, ...]:
    kind = str(data["type"])
    _envelope(data, "content", "delegation_id")
    _started(state, kind)
    if "delegation_id" not in data:  # required, and null is meaningful: general session context
        raise missing("delegation_id")
    content = read_str(data, "content", "", required=True)
    assert content is not None
    if not content.strip():
        raise bad_value("content", content)
    delegation_id = read_str(data, "delegation_id", "")
    channel = CONTEXT_CHANNELS[kind]
    if delegation_id is not None:
        if state.delegation.target != "client":
            raise refuse(
                DELEGATION_MODE_MISMATCH,
                "Responses delegation takes no delegation_id on context appends; send null for general context.",
                param="delegation_id",
            )
        if delegation_id not in state.open_delegations:
            raise bad_value("delegation_id", delegation_id)
        state.open_delegations.discard(delegation_id)
    state.appended += 1
    # The session puts it in the conversation (a delegation's answer as the output of the engine's
    # call) and acknowledges it; whether and when the model speaks of it is the session's to decide.
    append = ContextAppend(
        event_id=event_id,
        channel=channel,
        content=content,
        delegation_id=delegation_id,
        item_id=f"item_live_{channel}_{state.appended}",
    )
    return (append,)


def _mute(data: Mapping[str, object], event_id: str | None, state: LiveState) -> tuple[Command, ...]:
    kind = str(data["type"])
    _envelope(data)
    _started(state, kind)
    return (InputAudioMute(event_id=event_id, muted=MUTES[kind]),)


def _item_create(data: Mapping[str, object], event_id: str | None, state: LiveState) -> tuple[Command, ...]:
    _envelope(data, "item")
    _started(state, "response.item.create")
    _responses_only(state, "response.item.create")
    item = read_object(data, "item", "", required=True)
    assert item is not None
    kind = read_str(item, "type", "item", required=True)
    if kind != "function_call_output":
        raise refuse(
            NOT_SUPPORTED,
            f"Only function_call_output items can be queued on this gateway, not '{kind}'.",
            param="item.type",
        )
    check_fields(item, ("type", "call_id", "output", "id", "status"), "item")
    call_id = read_str(item, "call_id", "item", required=True)
    output = item.get("output")
    if output is None:
        raise missing("item.output")
    if not isinstance(output, str):
        raise wrong_type("item.output", "a string", output)
    backend = _backend(state)
    if backend is not None:
        # The backend's calls are the only ones a client answers: the voice engine calls none of its own.
        if not backend.owns_call(str(call_id)):
            raise bad_value("item.call_id", call_id)
        backend.output(str(call_id), output)
        return ()
    state.open_calls.discard(str(call_id))
    return (
        ConversationItemCreate(
            event_id=event_id,
            item_id=read_str(item, "id", "item"),
            role="tool",
            text="",
            kind="function_call_output",
            call_id=call_id,
            output=output,
        ),
    )


def _response_create(
    data: Mapping[str, object], event_id: str | None, state: LiveState
) -> tuple[Command, ...]:
    _envelope(data)
    _started(state, "response.create")
    _responses_only(state, "response.create")
    backend = _backend(state)
    if backend is not None and backend.waiting:
        _all_answered(backend.unanswered())
        state.outbox.extend(backend.resume())
        return ()
    _all_answered(tuple(sorted(state.open_calls)))
    state.continuing = state.last_delegation
    return (ResponseCreate(event_id=event_id),)


def _all_answered(waiting: tuple[str, ...]) -> None:
    if waiting:
        raise refuse(
            FUNCTION_CALL_OUTPUTS_REQUIRED,
            "The pending response needs an output for every function call first; "
            f"missing: {', '.join(waiting)}.",
        )


def _responses_only(state: LiveState, kind: str) -> None:
    if state.delegation.target != "responses":
        raise refuse(
            DELEGATION_MODE_MISMATCH,
            f"{kind} requires Responses delegation; this session delegates to the client.",
            param="type",
        )


def _session_close(data: Mapping[str, object], event_id: str | None, state: LiveState) -> tuple[Command, ...]:
    _envelope(data)
    state.close_event_id = event_id
    return (SessionClose(event_id=event_id, reason="close_requested"),)


PARSERS: Mapping[str, Parser] = {
    "session.start": _session_start,
    "session.update": _session_update,
    "session.input_audio.append": _audio_append,
    **dict.fromkeys(CONTEXT_CHANNELS, _context_append),
    "response.item.create": _item_create,
    "response.create": _response_create,
    "session.close": _session_close,
    **dict.fromkeys(MUTES, _mute),
}
