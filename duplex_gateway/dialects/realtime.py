"""The OpenAI Realtime dialect: wire JSON <-> typed commands and events.

:func:`parse_client_event` turns one client text frame into a
:class:`~duplex_gateway.vocabulary.commands.Command` (GA and beta spellings, plus the
vLLM-Omni duplex extensions) and raises nothing but
:class:`~duplex_gateway.vocabulary.errors.ProtocolError`. :func:`render_server_event` turns a
:class:`~duplex_gateway.vocabulary.events.ServerEvent` into the exact wire object, in GA
names or, with ``beta=True``, in the beta spellings.

Pure: no asyncio, no sockets, no clock. The session object mapping lives in
:mod:`duplex_gateway.dialects.realtime_session`.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from duplex_gateway.dialects.fields import (
    as_int,
    as_ms,
    as_object,
    as_str,
    get_field,
    invalid,
    is_missing,
    join,
    max_tokens,
    opt_object,
    opt_str,
)
from duplex_gateway.dialects.realtime_items import (
    MAX_FRAMES_PER_APPEND,
    check_picture,
    parse_item,
    render_item,
)
from duplex_gateway.dialects.realtime_session import (
    encoding_for_name,
    parse_modalities,
    parse_session_patch,
    sample_rate,
    session_payload,
)
from duplex_gateway.dialects.realtime_tools import parse_metadata, parse_tool_choice, parse_tools
from duplex_gateway.vocabulary.commands import (
    BargeIn,
    Command,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    InputCancel,
    InputTextAppend,
    OutputAudioClear,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
    SessionResume,
    SessionUpdate,
    TurnSignal,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, error_type_for
from duplex_gateway.vocabulary.events import (
    AudioDelta,
    AudioDone,
    ContentPartAdded,
    ContentPartDone,
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    DtmfReceived,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    HeartbeatAck,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputIgnored,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    OutputAudioCleared,
    OutputItemAdded,
    OutputItemDone,
    OverlapDecision,
    PlaybackAcknowledged,
    RateLimitsUpdated,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ResponseSpeak,
    ServerEvent,
    SessionClosed,
    SessionClosing,
    SessionCreated,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptDelta,
    TranscriptDone,
    TurnLatency,
)

__all__ = [
    "CLIENT_EVENT_TYPES",
    "RealtimeDialect",
    "parse_client_event",
    "render_item",
    "render_server_event",
    "session_payload",
]

JsonObject = dict[str, object]


# ---------------------------------------------------------------------------
# Client events -> commands


def parse_client_event(text: str | bytes, *, max_bytes: int) -> Command:
    """Parse one client text frame; raises only :class:`ProtocolError`."""
    data = _load(text, max_bytes)
    if not isinstance(data, dict):
        raise ProtocolError(ErrorCode.INVALID_EVENT, "a client event must be a JSON object")
    event_id = data.get("event_id")
    if event_id is not None and not isinstance(event_id, str):
        raise invalid("event_id", "'event_id' must be a string")
    try:
        kind = data.get("type")
        if not isinstance(kind, str):
            message = "missing 'type'" if kind is None else "'type' must be a string"
            raise ProtocolError(ErrorCode.INVALID_EVENT, message, param="type")
        parser = _PARSERS.get(kind)
        if parser is None:
            raise ProtocolError(
                ErrorCode.UNKNOWN_EVENT, f"unknown client event type {kind[:100]!r}", param="type"
            )
        return parser(data, event_id)
    except ProtocolError as exc:
        raise exc.with_event_id(event_id) from None


def _load(text: str | bytes, max_bytes: int) -> object:
    if isinstance(text, bytes | bytearray | memoryview):
        raw = bytes(text)
        if len(raw) > max_bytes:
            raise _too_large(len(raw), max_bytes)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(ErrorCode.INVALID_JSON, "the message is not valid UTF-8") from None
    elif len(text) > max_bytes or (len(text) * 4 > max_bytes and _utf8_len(text) > max_bytes):
        raise _too_large(_utf8_len(text), max_bytes)
    try:
        return json.loads(text)
    except RecursionError:
        raise ProtocolError(ErrorCode.INVALID_JSON, "the message is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and over-long integer literals
        raise ProtocolError(ErrorCode.INVALID_JSON, f"invalid JSON: {str(exc)[:200]}") from None


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _too_large(size: int, limit: int) -> ProtocolError:
    return ProtocolError(
        ErrorCode.MESSAGE_TOO_LARGE, f"message of {size} bytes exceeds the {limit}-byte limit"
    )


_Parser = Callable[[Mapping[str, object], str | None], Command]


def _session_update(data: Mapping[str, object], event_id: str | None) -> Command:
    session = as_object(get_field(data, "session", "", required=True), "session")
    return SessionUpdate(event_id=event_id, session=parse_session_patch(session, "session"))


def _append(data: Mapping[str, object], event_id: str | None) -> Command:
    audio = as_str(get_field(data, "audio", "", required=True), "audio")
    if not audio:
        raise invalid("audio", "'audio' must not be empty")
    try:
        decoded = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(ErrorCode.INVALID_BASE64, "'audio' is not valid base64", param="audio") from None
    if not decoded:
        raise invalid("audio", "'audio' must not be empty")
    # vLLM-Omni's per-chunk hints. The chunk's timing (duration_ms, audio_end_ms) is checked
    # but not passed on: the gateway re-slices audio, and engines measure it themselves.
    name = opt_str(data, "format", "")
    encoding = encoding_for_name(name, "format") if name else None
    rate_value = data.get("sample_rate_hz")
    rate = None if rate_value is None else sample_rate(rate_value, "sample_rate_hz")
    for key in ("duration_ms", "audio_end_ms"):
        if data.get(key) is not None:
            as_ms(data[key], key)
    is_speech = data.get("is_speech")
    if is_speech is not None and not isinstance(is_speech, bool):
        raise invalid("is_speech", "'is_speech' must be a boolean")
    frames, frames_error = _video_frames(data.get("video_frames"))
    hints = opt_object(data, "hints", "")
    return InputAudioAppend(
        event_id=event_id,
        audio=decoded,
        encoding=encoding,
        rate=rate,
        is_speech=is_speech,
        hints=dict(hints) if hints else {},
        video_frames=frames,
        video_error=frames_error,
    )


def _video_frames(value: object) -> tuple[tuple[str, ...], str | None]:
    """An append's camera frames, or why they are refused (the append's audio stands either way)."""
    if value is None:
        return (), None
    if not isinstance(value, list):
        return (), "'video_frames' must be a list of base64 JPEG or PNG images"
    frames = [frame for frame in value if frame is not None]
    if len(frames) > MAX_FRAMES_PER_APPEND:
        return (), f"'video_frames' carries at most {MAX_FRAMES_PER_APPEND} frames per append"
    for index, frame in enumerate(frames):
        problem = check_picture(frame)
        if problem is not None:
            return (), f"'video_frames[{index}]': {problem}"
    return tuple(str(frame) for frame in frames), None


def _text_append(data: Mapping[str, object], event_id: str | None) -> Command:
    text = as_str(get_field(data, "text", "", required=True), "text")
    return InputTextAppend(event_id=event_id, text=text)


#: ``turn.signal`` events that name a command of their own, read from the signal's payload.
_SIGNALLED_COMMANDS = frozenset(
    {
        "input.cancel",
        "barge_in",
        "response.cancel",
        "conversation.item.create",
        "conversation.item.delete",
        "conversation.item.truncate",
        "conversation.item.retrieve",
    }
)


def _turn_signal(data: Mapping[str, object], event_id: str | None) -> Command:
    signal = as_str(get_field(data, "event", "", required=True), "event", nonempty=True)
    payload = opt_object(data, "payload", "") or {}
    if signal == "session.update":
        # vLLM-Omni's signal form of an update: the payload is the session object itself.
        return SessionUpdate(event_id=event_id, session=parse_session_patch(payload, "payload"))
    if signal in _SIGNALLED_COMMANDS:
        body = dict(payload)
        if signal == "response.cancel" and "response_id" not in body and "response_id" in data:
            body["response_id"] = data["response_id"]
        return _PARSERS[signal](body, event_id)
    return TurnSignal(event_id=event_id, event=signal, payload=dict(payload))


def _response_create(data: Mapping[str, object], event_id: str | None) -> Command:
    response = opt_object(data, "response", "")
    if response is None:
        return ResponseCreate(event_id=event_id)
    path = "response"
    modalities = None
    for key in ("output_modalities", "modalities"):
        if response.get(key) is not None:
            modalities = parse_modalities(response[key], join(path, key))
            break
    conversation = response.get("conversation")
    if conversation not in (None, "auto", "none"):
        raise invalid(join(path, "conversation"), "'response.conversation' must be 'auto' or 'none'")
    audio = opt_object(response, "audio", path)
    audio_out = opt_object(audio, "output", join(path, "audio")) if audio is not None else None
    voice = opt_str(audio_out, "voice", "response.audio.output") if audio_out is not None else None
    voice = voice if voice is not None else opt_str(response, "voice", path)
    limit = None
    for key in ("max_output_tokens", "max_response_output_tokens"):
        if response.get(key) is not None:
            limit = max_tokens(response[key], join(path, key))
            break
    items = None
    if response.get("input") is not None:
        raw = response["input"]
        if not isinstance(raw, list):
            raise invalid(join(path, "input"), "'response.input' must be a list of items")
        items = tuple(
            parse_item(as_object(item, f"{path}.input[{index}]"), f"{path}.input[{index}]", references=True)
            for index, item in enumerate(raw)
        )
    return ResponseCreate(
        event_id=event_id,
        instructions=opt_str(response, "instructions", path),
        output_modalities=modalities,
        tools=None if response.get("tools") is None else parse_tools(response["tools"], join(path, "tools")),
        tool_choice=None
        if response.get("tool_choice") is None
        else parse_tool_choice(response["tool_choice"], join(path, "tool_choice")),
        voice=voice,
        max_output_tokens=limit,
        out_of_band=conversation == "none",
        input=items,
        metadata=None
        if response.get("metadata") is None
        else parse_metadata(response["metadata"], join(path, "metadata")),
    )


def _response_cancel(data: Mapping[str, object], event_id: str | None) -> Command:
    return ResponseCancel(event_id=event_id, response_id=opt_str(data, "response_id", ""))


def _item_create(data: Mapping[str, object], event_id: str | None) -> Command:
    spec = parse_item(as_object(get_field(data, "item", "", required=True), "item"), "item")
    return ConversationItemCreate(
        event_id=event_id,
        item_id=spec.item_id,
        role=spec.role,
        text=spec.text,
        previous_item_id=opt_str(data, "previous_item_id", ""),
        kind=spec.kind,
        call_id=spec.call_id,
        name=spec.name,
        arguments=spec.arguments,
        output=spec.output,
        images=spec.images,
    )


def _item_id(data: Mapping[str, object]) -> str:
    return as_str(get_field(data, "item_id", "", required=True), "item_id", nonempty=True)


def _item_truncate(data: Mapping[str, object], event_id: str | None) -> Command:
    item_id = _item_id(data)
    content_index = as_int(get_field(data, "content_index", "", required=True), "content_index", minimum=0)
    audio_end_ms = as_ms(get_field(data, "audio_end_ms", "", required=True), "audio_end_ms")
    return ConversationItemTruncate(
        event_id=event_id, item_id=item_id, content_index=content_index, audio_end_ms=audio_end_ms
    )


def _item_delete(data: Mapping[str, object], event_id: str | None) -> Command:
    return ConversationItemDelete(event_id=event_id, item_id=_item_id(data))


def _item_retrieve(data: Mapping[str, object], event_id: str | None) -> Command:
    return ConversationItemRetrieve(event_id=event_id, item_id=_item_id(data))


def _playback_ack(data: Mapping[str, object], event_id: str | None) -> Command:
    played_ms = as_ms(get_field(data, "played_ms", "", required=True), "played_ms")
    return PlaybackAck(
        event_id=event_id,
        response_id=opt_str(data, "response_id", ""),
        item_id=opt_str(data, "item_id", ""),
        played_ms=played_ms,
    )


def _session_close(data: Mapping[str, object], event_id: str | None) -> Command:
    reason = opt_str(data, "reason", "")
    return (
        SessionClose(event_id=event_id) if reason is None else SessionClose(event_id=event_id, reason=reason)
    )


def _commit(data: Mapping[str, object], event_id: str | None) -> Command:
    # vLLM-Omni's keys, read as its server reads them: response_create wins over
    # create_response, and a value that is not a boolean counts as not given.
    create = data.get("response_create", data.get("create_response"))
    final, is_speech = data.get("final", True), data.get("is_speech")
    return InputAudioCommit(
        event_id=event_id,
        create_response=create if isinstance(create, bool) else None,
        final=final if isinstance(final, bool) else True,
        is_speech=is_speech if isinstance(is_speech, bool) else None,
    )


def _input_commit(data: Mapping[str, object], event_id: str | None) -> Command:
    # vLLM-Omni's input.commit is a commit that asks for a reply unless it says otherwise.
    command = _commit(data, event_id)
    assert isinstance(command, InputAudioCommit)
    if command.create_response is None:
        return replace(command, create_response=True)
    return command


def _event_ack(data: Mapping[str, object], event_id: str | None) -> Command:
    seq = as_int(get_field(data, "server_event_seq", "", required=True), "server_event_seq", minimum=0)
    return SessionEventAck(event_id=event_id, server_event_seq=seq)


def _session_resume(data: Mapping[str, object], event_id: str | None) -> Command:
    session_id = as_str(get_field(data, "session_id", "", required=True), "session_id", nonempty=True)
    token = as_str(get_field(data, "resume_token", "", required=True), "resume_token", nonempty=True)
    seq_value = get_field(data, "last_received_server_event_seq", "", required=False)
    seq = 0 if is_missing(seq_value) else as_int(seq_value, "last_received_server_event_seq", minimum=0)
    return SessionResume(
        event_id=event_id, session_id=session_id, resume_token=token, last_received_server_event_seq=seq
    )


def _bare(cls: type[Command]) -> _Parser:
    def parse(data: Mapping[str, object], event_id: str | None) -> Command:
        return cls(event_id=event_id)

    return parse


_PARSERS: dict[str, _Parser] = {
    "session.update": _session_update,
    "input_audio_buffer.append": _append,
    "input_audio_buffer.commit": _commit,
    "input.commit": _input_commit,
    "input_audio_buffer.clear": _bare(InputAudioClear),
    "input.cancel": _bare(InputCancel),
    "input.text.append": _text_append,
    "input_text.append": _text_append,
    "push_text": _text_append,
    "turn.signal": _turn_signal,
    "signal_turn": _turn_signal,
    "response.create": _response_create,
    "response.cancel": _response_cancel,
    "conversation.item.create": _item_create,
    "conversation.item.truncate": _item_truncate,
    "conversation.item.delete": _item_delete,
    "conversation.item.retrieve": _item_retrieve,
    "output_audio_buffer.clear": _bare(OutputAudioClear),
    "barge_in": _bare(BargeIn),
    "playback.ack": _playback_ack,
    "audio.playback_ack": _playback_ack,
    "session.heartbeat": _bare(SessionHeartbeat),
    "session.close": _session_close,
    "close": _session_close,
    "close_session": _session_close,
    "session.event_ack": _event_ack,
    "session.resume": _session_resume,
}

#: Every client event type :func:`parse_client_event` accepts.
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(_PARSERS)


# ---------------------------------------------------------------------------
# Server events -> wire JSON

_BETA_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
#: Events with no beta form (:func:`render_server_event` returns ``None`` for them).
_GA_ONLY = frozenset(
    {
        "conversation.item.done",
        "input_audio_buffer.timeout_triggered",
        "input_audio_buffer.dtmf_event_received",
    }
)
#: vLLM-Omni events sent unasked, so only to clients of its duplex handshake: a plain
#: Realtime client knows no such type (strict ones report an error for it).
_DUPLEX_ONLY = frozenset({"session.closed", "response.listen", "response.speak", "overlap.decision"})


def render_server_event(
    event: ServerEvent, *, seq: int | None, event_id: str, beta: bool, session_id: str, duplex: bool = False
) -> JsonObject | None:
    """The wire object for ``event``; ``None`` when the dialect has no form for it.

    ``duplex``: the client opened the session with vLLM-Omni's duplex handshake.
    ``seq`` None: the event is outside the numbered stream, and carries no ``server_event_seq``.
    """
    if beta and event.type in _GA_ONLY:
        return None
    if not duplex and event.type in _DUPLEX_ONLY:
        return None
    if isinstance(event, OutputAudioCleared) and event.response_id is None:
        # OpenAI's event requires the id of the reply whose audio was cleared; clearing
        # when no reply is in progress changes nothing, so nothing is announced.
        return None
    renderer = _RENDERERS.get(type(event))
    if renderer is None:
        raise TypeError(f"no realtime rendering for {type(event).__name__}")
    kind = _BETA_NAMES.get(event.type, event.type) if beta else event.type
    wire: JsonObject = {"type": kind, "event_id": event_id}
    if seq is not None:
        wire["server_event_seq"] = seq
    wire.update(renderer(event, beta, session_id))
    return wire


def _part(part_type: str, text: str) -> JsonObject:
    if part_type in ("audio", "output_audio"):
        return {"type": "audio", "transcript": text}
    return {"type": "text", "text": text}


def _response(
    event: ResponseCreated | ResponseDone, status: str, session_id: str, *, beta: bool
) -> JsonObject:
    done = event if isinstance(event, ResponseDone) else None
    reason = done.reason if done is not None else None
    details: JsonObject | None = None
    if status not in ("completed", "in_progress") or reason is not None:
        details = {"type": status, "reason": _status_reason(status, reason)}
        if status == "failed":  # OpenAI's ``reason`` only names why a reply stopped early
            details["error"] = {"type": "server_error", "code": reason or "engine_error", "message": reason}
    wire: JsonObject = {
        "object": "realtime.response",
        "id": event.response_id,
        "status": status,
        "status_details": details,
        "output": [render_item(item, beta=beta) for item in done.output] if done is not None else [],
        "usage": _usage(done) if done is not None else None,
        "metadata": dict(event.metadata) if event.metadata is not None else None,
    }
    if not beta:
        wire["conversation_id"] = None if event.out_of_band else f"conv_{session_id}"
    wire["audio_ms"] = done.audio_ms if done is not None else 0
    return wire


def _usage(done: ResponseDone) -> JsonObject:
    """What the reply used: audio seconds always, tokens where the engine counts them."""
    usage: JsonObject = {
        "input_audio_seconds": round(done.input_audio_ms / 1000, 3),
        "output_audio_seconds": round(done.audio_ms / 1000, 3),
    }
    if done.input_tokens is not None or done.output_tokens is not None:
        usage["input_tokens"] = done.input_tokens or 0
        usage["output_tokens"] = done.output_tokens or 0
        usage["total_tokens"] = (done.input_tokens or 0) + (done.output_tokens or 0)
    return usage


#: The reasons OpenAI's ``status_details.reason`` may hold, per status; strict clients
#: (openai-agents) drop a ``response.done`` with any other value.
_REASONS = {
    "cancelled": ("turn_detected", "client_cancelled"),
    "incomplete": ("max_output_tokens", "content_filter"),
}
#: Gateway reasons with an OpenAI equivalent: a reply superseded by the caller's next turn
#: was ended by turn detection.
_REASON_ALIASES = {"superseded": "turn_detected"}


def _status_reason(status: str, reason: str | None) -> str | None:
    if reason is None:
        return None
    reason = _REASON_ALIASES.get(reason, reason)
    return reason if reason in _REASONS.get(status, ()) else None


def _scoped(event: Any) -> JsonObject:
    return {
        "response_id": event.response_id,
        "item_id": event.item_id,
        "output_index": event.output_index,
        "content_index": event.content_index,
    }


def _session_announcement(event: SessionCreated, beta: bool) -> JsonObject:
    wire: JsonObject = {
        "session": session_payload(
            event.config, session_id=event.session_id, beta=beta, capabilities=event.capabilities
        )
    }
    if event.resume_token is not None:
        # vLLM-Omni's duplex lane carries these at the top level.
        wire["session_id"] = event.session_id
        wire["resume_token"] = event.resume_token
    return wire


_Renderer = Callable[[Any, bool, str], JsonObject]

_RENDERERS: dict[type[ServerEvent], _Renderer] = {
    SessionCreated: lambda e, beta, sid: _session_announcement(e, beta),
    SessionResumed: lambda e, beta, sid: {
        **_session_announcement(e, beta),
        "attachment_generation": e.attachment_generation,
    },
    SessionReplaced: lambda e, beta, sid: {
        "session_id": e.session_id,
        "attachment_generation": e.attachment_generation,
    },
    SessionResyncRequired: lambda e, beta, sid: {"session_id": e.session_id, "reason": e.reason},
    SessionUpdated: lambda e, beta, sid: {
        "session": session_payload(e.config, session_id=e.session_id, beta=beta)
    },
    SpeechStarted: lambda e, beta, sid: {"audio_start_ms": e.audio_start_ms, "item_id": e.item_id},
    SpeechStopped: lambda e, beta, sid: {"audio_end_ms": e.audio_end_ms, "item_id": e.item_id},
    InputAudioCommitted: lambda e, beta, sid: {"previous_item_id": e.previous_item_id, "item_id": e.item_id},
    InputAudioCleared: lambda e, beta, sid: {},
    InputAudioTimeoutTriggered: lambda e, beta, sid: {
        "item_id": e.item_id,
        "audio_start_ms": e.audio_start_ms,
        "audio_end_ms": e.audio_end_ms,
    },
    ConversationItemAdded: lambda e, beta, sid: {
        "previous_item_id": e.previous_item_id,
        "item": render_item(e.item, beta=beta),
    },
    ConversationItemDone: lambda e, beta, sid: {
        "previous_item_id": e.previous_item_id,
        "item": render_item(e.item, beta=beta),
    },
    ConversationItemTruncated: lambda e, beta, sid: {
        "item_id": e.item_id,
        "content_index": e.content_index,
        "audio_end_ms": e.audio_end_ms,
    },
    ConversationItemDeleted: lambda e, beta, sid: {"item_id": e.item_id},
    ConversationItemRetrieved: lambda e, beta, sid: {"item": render_item(e.item, beta=beta)},
    InputTranscriptionDelta: lambda e, beta, sid: {
        "item_id": e.item_id,
        "content_index": e.content_index,
        "delta": e.delta,
    },
    InputTranscriptionFailed: lambda e, beta, sid: {
        "item_id": e.item_id,
        "content_index": e.content_index,
        "error": {"type": "transcription_error", "code": e.code, "message": e.message, "param": None},
    },
    InputTranscriptionCompleted: lambda e, beta, sid: {
        "item_id": e.item_id,
        "content_index": e.content_index,
        "transcript": e.transcript,
        # OpenAI bills whisper-style transcription by audio duration and reports it so.
        "usage": {"type": "duration", "seconds": round(e.audio_ms / 1000, 3)},
    },
    ResponseCreated: lambda e, beta, sid: {
        "response_id": e.response_id,
        "response": _response(e, "in_progress", sid, beta=beta),
    },
    ResponseDone: lambda e, beta, sid: {
        "response_id": e.response_id,
        "response": _response(e, e.status, sid, beta=beta),
    },
    FunctionCallArgumentsDelta: lambda e, beta, sid: {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "output_index": e.output_index,
        "call_id": e.call_id,
        "delta": e.delta,
    },
    FunctionCallArgumentsDone: lambda e, beta, sid: {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "output_index": e.output_index,
        "call_id": e.call_id,
        "name": e.name,
        "arguments": e.arguments,
    },
    OutputItemAdded: lambda e, beta, sid: {
        "response_id": e.response_id,
        "output_index": e.output_index,
        "item": render_item(e.item, beta=beta),
    },
    OutputItemDone: lambda e, beta, sid: {
        "response_id": e.response_id,
        "output_index": e.output_index,
        "item": render_item(e.item, beta=beta),
    },
    ContentPartAdded: lambda e, beta, sid: {**_scoped(e), "part": _part(e.part_type, "")},
    ContentPartDone: lambda e, beta, sid: {**_scoped(e), "part": _part(e.part_type, e.transcript)},
    AudioDelta: lambda e, beta, sid: {
        **_scoped(e),
        "delta": base64.b64encode(e.audio).decode("ascii"),
        # vLLM-Omni's duplex clients read each chunk's own format and rate (and warn without them).
        "format": e.encoding.value,
        "sample_rate_hz": e.rate,
    },
    AudioDone: lambda e, beta, sid: _scoped(e),
    TranscriptDelta: lambda e, beta, sid: {**_scoped(e), "delta": e.delta},
    TranscriptDone: lambda e, beta, sid: {**_scoped(e), "transcript": e.transcript},
    TextDelta: lambda e, beta, sid: {**_scoped(e), "delta": e.delta},
    TextDone: lambda e, beta, sid: {**_scoped(e), "text": e.text},
    OutputAudioCleared: lambda e, beta, sid: {"response_id": e.response_id},
    RateLimitsUpdated: lambda e, beta, sid: {"rate_limits": []},
    PlaybackAcknowledged: lambda e, beta, sid: _playback(e, sid),
    DtmfReceived: lambda e, beta, sid: {"event": e.digit, "received_at": e.received_at},
    ResponseListen: lambda e, beta, sid: _listen(e, sid),
    ResponseSpeak: lambda e, beta, sid: {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "output_index": 0,
        "content_index": 0,
        "metadata": {"session_id": sid},
    },
    OverlapDecision: lambda e, beta, sid: {
        "session_id": sid,
        "policy": e.policy,
        "action": e.action,
        "reason": e.reason,
        "metadata": {},
    },
    TurnLatency: lambda e, beta, sid: {
        "response_id": e.response_id,
        "item_id": e.item_id,
        "total_ms": e.total_ms,
        "stages": [{"name": name, "ms": ms} for name, ms in e.stages],
    },
    InputIgnored: lambda e, beta, sid: {"input": e.input, "engine": e.engine, "message": e.message},
    HeartbeatAck: lambda e, beta, sid: {"session_id": e.session_id},
    SessionClosed: lambda e, beta, sid: {"session_id": e.session_id, "reason": e.reason},
    SessionClosing: lambda e, beta, sid: {"reason": e.reason, "grace_s": e.grace_s},
    ErrorEvent: lambda e, beta, sid: {
        "error": {
            "type": error_type_for(e.code),
            "code": e.code.value,
            "message": e.message,
            "param": e.param,
            "event_id": e.event_id,
        }
    },
}


def _listen(event: ResponseListen, session_id: str) -> JsonObject:
    # vLLM-Omni's shape: a listening "response", its id only when the model stopped one.
    response: JsonObject = {
        "object": "realtime.response",
        "status": "listening",
        "metadata": {"reason": event.reason},
    }
    fields: JsonObject = {"session_id": session_id, "response": response}
    if event.response_id is not None:
        response["id"] = event.response_id
        fields["response_id"] = event.response_id
    return fields


def _playback(event: PlaybackAcknowledged, session_id: str) -> JsonObject:
    fields: JsonObject = {
        "response_id": event.response_id,
        "played_ms": event.played_ms,
        "produced_ms": event.produced_ms,
    }
    # vLLM-Omni nests its ledger's view under ``event``; mirror it for its clients.
    nested: JsonObject = {"type": "playback.acknowledged", "session_id": session_id, **fields}
    return {"session_id": session_id, **fields, "event": nested}


class RealtimeDialect:
    """OpenAI Realtime (GA, or beta with ``beta``) and vLLM-Omni's duplex extensions, as a :class:`Dialect`.

    ``duplex``: the client opened the session with vLLM-Omni's duplex handshake,
    so it also gets the vLLM-Omni events a plain Realtime client does not know.
    """

    def __init__(self, *, session_id: str, beta: bool, duplex: bool, max_message_bytes: int) -> None:
        self.session_id = session_id
        self.beta = beta
        self.duplex = duplex
        self._max_bytes = max_message_bytes
        self._unsequenced = 0

    def parse(self, frame: str | bytes) -> tuple[Command, ...]:
        if not isinstance(frame, str):
            raise ProtocolError(ErrorCode.BINARY_NOT_SUPPORTED, "this endpoint takes JSON text messages only")
        return (parse_client_event(frame, max_bytes=self._max_bytes),)

    def render(self, event: ServerEvent, *, seq: int) -> str | None:
        payload = render_server_event(
            event,
            seq=seq,
            event_id=f"event_{seq}",
            beta=self.beta,
            session_id=self.session_id,
            duplex=self.duplex,
        )
        return None if payload is None else json.dumps(payload, separators=(",", ":"))

    def render_unsequenced(self, event: ServerEvent) -> str:
        self._unsequenced += 1
        payload = render_server_event(
            event,
            seq=None,
            event_id=f"event_unsequenced_{self._unsequenced}",
            beta=self.beta,
            session_id=self.session_id,
            duplex=self.duplex,
        )
        assert payload is not None
        return json.dumps(payload, separators=(",", ":"))
