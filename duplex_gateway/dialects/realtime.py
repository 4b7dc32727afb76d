"""The OpenAI Realtime dialect: wire JSON <-> typed commands and events.

:func:`parse_client_event` turns one client text frame into a
:class:`~duplex_gateway.vocabulary.commands.Command` (GA and beta spellings, plus the
vLLM-Omni duplex extensions) and raises nothing but
:class:`~duplex_gateway.vocabulary.errors.ProtocolError`. :func:`render_server_event` turns a
:class:`~duplex_gateway.vocabulary.events.ServerEvent` into the exact wire object, in GA
names or, with ``beta=True``, in the beta spellings.

Pure: no asyncio, no sockets, no clock. The parser of each client event type lives in
:mod:`duplex_gateway.dialects.realtime_commands`, the session object mapping in
:mod:`duplex_gateway.dialects.realtime_session`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from duplex_gateway.dialects import wire_codec
from duplex_gateway.dialects.fields import invalid
from duplex_gateway.dialects.realtime_commands import COMMAND_PARSERS
from duplex_gateway.dialects.realtime_items import render_item
from duplex_gateway.dialects.realtime_session import session_payload
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.context_events import LIVE_ONLY
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
        parser = COMMAND_PARSERS.get(kind)
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
        return wire_codec.loads(text)
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


#: Every client event type :func:`parse_client_event` accepts.
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(COMMAND_PARSERS)


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
#: (``overlap.decision`` is the session's to hold back: a Realtime client may ask for it.)
_DUPLEX_ONLY = frozenset({"session.closed", "response.listen", "response.speak"})


def render_server_event(
    event: ServerEvent, *, seq: int | None, event_id: str, beta: bool, session_id: str, duplex: bool = False
) -> JsonObject | None:
    """The wire object for ``event``; ``None`` when the dialect has no form for it.

    ``duplex``: the client opened the session with vLLM-Omni's duplex handshake.
    ``seq`` None: the event is outside the numbered stream, and carries no ``server_event_seq``.
    """
    if beta and event.type in _GA_ONLY:
        return None
    if (not duplex and event.type in _DUPLEX_ONLY) or event.type in LIVE_ONLY:
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
        "delta": wire_codec.b64encode(e.audio),
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
        **{
            name: value
            for name, value in (
                ("response_id", e.response_id),
                ("audio_start_ms", e.audio_start_ms),
                ("audio_end_ms", e.audio_end_ms),
            )
            if value is not None
        },
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
        return None if payload is None else wire_codec.dumps(payload)

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
        return wire_codec.dumps(payload)
