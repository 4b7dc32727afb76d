"""The OpenAI Realtime dialect's client events, one parser per event type.

:data:`COMMAND_PARSERS` maps each client event type (GA and beta spellings, plus the
vLLM-Omni duplex extensions) to the function that reads its JSON object into a
:class:`~duplex_gateway.vocabulary.commands.Command`; each raises nothing but
:class:`~duplex_gateway.vocabulary.errors.ProtocolError`.
:func:`duplex_gateway.dialects.realtime.parse_client_event` decodes the frame and picks the parser.

Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable, Mapping
from dataclasses import replace

from duplex_gateway.dialects import wire_codec
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
from duplex_gateway.dialects.realtime_items import MAX_FRAMES_PER_APPEND, check_picture, parse_item
from duplex_gateway.dialects.realtime_session import (
    encoding_for_name,
    parse_modalities,
    parse_session_patch,
    sample_rate,
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
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

__all__ = ["COMMAND_PARSERS", "CommandParser"]


#: Reads one client event's JSON object (and its ``event_id``) into a command.
CommandParser = Callable[[Mapping[str, object], str | None], Command]


def _session_update(data: Mapping[str, object], event_id: str | None) -> Command:
    session = as_object(get_field(data, "session", "", required=True), "session")
    return SessionUpdate(event_id=event_id, session=parse_session_patch(session, "session"))


def _append(data: Mapping[str, object], event_id: str | None) -> Command:
    audio = as_str(get_field(data, "audio", "", required=True), "audio")
    if not audio:
        raise invalid("audio", "'audio' must not be empty")
    try:
        decoded = wire_codec.b64decode(audio)
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
        return COMMAND_PARSERS[signal](body, event_id)
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


def _bare(cls: type[Command]) -> CommandParser:
    def parse(data: Mapping[str, object], event_id: str | None) -> Command:
        return cls(event_id=event_id)

    return parse


#: The parser of each client event type, by the type's name (GA, beta and vLLM-Omni spellings).
COMMAND_PARSERS: Mapping[str, CommandParser] = {
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
