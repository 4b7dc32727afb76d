"""vLLM-Omni's server events -> the engine port's events, for what needs no engine's own bookkeeping.

Both engines receive vLLM-Omni's events in their Realtime wire shape: the
``remote`` engine off the socket, the ``vllm-omni`` engine as its typed events'
``to_realtime()`` (what vLLM-Omni's own server would send). Each engine keeps
the state that differs between a handle and a socket (which reply asked for is
which, commits, updates, errors about its own commands) and hands every other
event to :func:`translate`, which maps it by a table:

=============================================  ========================================
server event                                   port event
=============================================  ========================================
``response.output_audio.delta``                :class:`~port.EngineAudio` (PCM16 at the
                                               engine's output rate, see :mod:`.audio`)
``response.output_audio_transcript.delta``     :class:`~port.EngineTranscript`
``response.output_text.delta``                 :class:`~port.EngineText`
``response.listen`` / ``.speak``               :class:`~port.EngineListen` / ``EngineSpeak``
``overlap.decision``                           :class:`~port.EngineOverlapDecision`
``...input_audio_transcription.delta`` /       :class:`~port.EngineInputTranscript` on the
``.completed``                                 caller's item
``input_audio_buffer.speech_started`` /        :class:`~port.EngineSpeechStarted` /
``_stopped``                                   ``Stopped`` (only where the engine's VAD
                                               finds the turns)
=============================================  ========================================

:func:`reply_done` ends a reply (``response.done``). Decided once for both
engines: the beta names of the reply events (``response.audio.delta``,
``response.audio_transcript.delta``, ``response.text.delta``) are taken too, the
caller's transcript deltas are passed on, and an empty final transcript (nothing
heard) is not.

Pure: no asyncio, socket or clock.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from duplex_gateway.engine import port
from duplex_gateway.engine.omni.audio import ReplyAudio, ledger_ms_of
from duplex_gateway.engine.omni.tools import token_usage

__all__ = [
    "AUDIO_EVENTS",
    "OmniReply",
    "error_fields",
    "item_of",
    "late_report",
    "reply_done",
    "response_id_of",
    "text_of",
    "translate",
]

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class OmniReply:
    """One vLLM-Omni reply as the gateway knows it: its name on the gateway side and its audio."""

    gateway_id: str
    audio: ReplyAudio
    #: Cancelled (or talked over): whatever still comes for it is dropped.
    dropped: bool = False
    #: The client reported on its playback (or the engine was told it was heard).
    acked: bool = False


def text_of(value: object) -> str | None:
    """``value`` if it is a non-empty string."""
    return value if isinstance(value, str) and value else None


def response_id_of(event: Mapping[str, Any]) -> str | None:
    """A response-scoped event's response id (top level, or ``response.id``)."""
    value = text_of(event.get("response_id"))
    if value is not None:
        return value
    response = event.get("response")
    return text_of(response.get("id")) if isinstance(response, Mapping) else None


def item_of(event: Mapping[str, Any]) -> str:
    """An event's ``item_id`` ("" when it names none)."""
    value = event.get("item_id")
    return value if isinstance(value, str) else ""


def error_fields(
    event: Mapping[str, Any], default_code: str = "backend_error"
) -> tuple[str, str, str | None]:
    """``(code, message, related event_id)`` of an ``error`` event, whatever its nesting."""
    error = event.get("error")
    source: Mapping[str, Any] = error if isinstance(error, Mapping) else event
    message = source.get("message")
    if not isinstance(message, str):
        message = error if isinstance(error, str) else ""
    return text_of(source.get("code")) or default_code, message, text_of(source.get("event_id"))


#: vLLM-Omni's answer to a cancel of a reply that had already finished.
_REPLY_ALREADY_OVER = "response_not_active"


def late_report(code: str) -> bool:
    """The error is about a reply the gateway has already closed out: a playback report
    (late or repeated) or a cancel crossing the reply's own end. The client was answered;
    nothing went wrong for it, so it is logged, not passed on."""
    return code.startswith("playback_") or code == _REPLY_ALREADY_OVER


def _listen_reason(event: Mapping[str, Any]) -> str | None:
    """Why vLLM-Omni chose to listen (it nests it under ``response.metadata``)."""
    reason = text_of(event.get("reason"))
    if reason is not None:
        return reason
    response = event.get("response")
    metadata = response.get("metadata") if isinstance(response, Mapping) else None
    return text_of(metadata.get("reason")) if isinstance(metadata, Mapping) else None


@dataclass(frozen=True, slots=True)
class _Context:
    replies: Mapping[str, OmniReply]
    #: The gateway's name of the caller's item an event names.
    caller_item: Callable[[object], str]
    engine_vad: bool

    def live(self, event: Mapping[str, Any]) -> OmniReply | None:
        """The reply in progress the event is about (None: unknown or dropped)."""
        reply = self.replies.get(response_id_of(event) or "")
        return None if reply is None or reply.dropped else reply


_Handler = Callable[[_Context, Mapping[str, Any]], list[port.EngineEvent]]


def _audio(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    reply = ctx.live(event)
    delta = event.get("delta")
    if reply is None or not isinstance(delta, str) or not delta:
        return []
    hinted = event.get("sample_rate_hz")
    fmt = event.get("format")
    try:
        pcm = reply.audio.chunk(
            base64.b64decode(delta, validate=False),
            fmt if isinstance(fmt, str) else None,
            int(hinted) if isinstance(hinted, int | float) and hinted > 0 else None,
            ledger_ms=ledger_ms_of(event.get("metadata")),
        )
    except (ValueError, binascii.Error, RuntimeError) as exc:
        logger.warning("undecodable vLLM-Omni audio dropped: %s", exc)
        return []
    return [port.EngineAudio(response_id=reply.gateway_id, pcm=pcm)] if pcm else []


def _delta(kind: type[port.EngineTranscript | port.EngineText]) -> _Handler:
    def handle(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
        reply = ctx.live(event)
        delta = text_of(event.get("delta"))
        return [kind(response_id=reply.gateway_id, delta=delta)] if reply is not None and delta else []

    return handle


def _listen(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    reply = ctx.replies.get(response_id_of(event) or "")
    if reply is not None and reply.dropped:
        return []
    return [port.EngineListen(response_id=reply.gateway_id if reply else None, reason=_listen_reason(event))]


def _speak(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    reply = ctx.live(event)
    return [port.EngineSpeak(response_id=reply.gateway_id)] if reply is not None else []


def _overlap(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    return [
        port.EngineOverlapDecision(
            policy=text_of(event.get("policy")),
            action=text_of(event.get("action")),
            reason=text_of(event.get("reason")),
        )
    ]


def _heard(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    text = text_of(event.get("delta"))
    return (
        [port.EngineInputTranscript(item_id=ctx.caller_item(event.get("item_id")), text=text)] if text else []
    )


def _heard_all(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    text = text_of(event.get("transcript"))
    if text is None:
        return []  # nothing heard: the caller's item keeps no transcript
    return [port.EngineInputTranscript(item_id=ctx.caller_item(event.get("item_id")), text=text, final=True)]


def _ms(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0


def _speech_started(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    # Where the gateway finds the turns, vLLM-Omni still brackets each commit with these:
    # passed on, the gateway session would take them for the caller talking over the reply.
    if not ctx.engine_vad:
        return []
    return [port.EngineSpeechStarted(audio_start_ms=_ms(event.get("audio_start_ms")), item_id=item_of(event))]


def _speech_stopped(ctx: _Context, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    if not ctx.engine_vad:
        return []
    return [port.EngineSpeechStopped(audio_end_ms=_ms(event.get("audio_end_ms")), item_id=item_of(event))]


#: The names a reply's audio comes under (GA and beta).
AUDIO_EVENTS = frozenset({"response.output_audio.delta", "response.audio.delta"})

_HANDLERS: Mapping[str, _Handler] = {
    **dict.fromkeys(AUDIO_EVENTS, _audio),
    **dict.fromkeys(
        ("response.output_audio_transcript.delta", "response.audio_transcript.delta"),
        _delta(port.EngineTranscript),
    ),
    **dict.fromkeys(("response.output_text.delta", "response.text.delta"), _delta(port.EngineText)),
    "response.listen": _listen,
    "response.speak": _speak,
    "overlap.decision": _overlap,
    "conversation.item.input_audio_transcription.delta": _heard,
    "conversation.item.input_audio_transcription.completed": _heard_all,
    "input_audio_buffer.speech_started": _speech_started,
    "input_audio_buffer.speech_stopped": _speech_stopped,
}


def translate(
    event: Mapping[str, Any],
    replies: Mapping[str, OmniReply],
    *,
    caller_item: Callable[[object], str],
    engine_vad: bool = False,
) -> list[port.EngineEvent] | None:
    """The port events for one of the table's server events (None: not one of them).

    ``replies``: the replies in progress by vLLM-Omni's id; ``caller_item``: the
    gateway's name of the caller's item vLLM-Omni names; ``engine_vad``: the
    engine's VAD finds the turns (its speech events are the caller's).
    """
    handler = _HANDLERS.get(str(event.get("type", "")))
    if handler is None:
        return None
    return handler(_Context(replies, caller_item, engine_vad), event)


def reply_done(reply: OmniReply, event: Mapping[str, Any]) -> list[port.EngineEvent]:
    """A reply's ``response.done``: the audio its resampler still held (when it completed), then its end.

    A status other than completed or cancelled is a failure; the token usage is passed
    on where vLLM-Omni reports it.
    """
    response = event.get("response")
    response = response if isinstance(response, Mapping) else {}
    status = text_of(response.get("status")) or "completed"
    details = response.get("status_details")
    out: list[port.EngineEvent] = []
    if status == "completed":
        tail = reply.audio.flush()
        if tail:
            out.append(port.EngineAudio(response_id=reply.gateway_id, pcm=tail))
    input_tokens, output_tokens = token_usage(response)
    out.append(
        port.EngineResponseDone(
            response_id=reply.gateway_id,
            status=status if status in ("completed", "cancelled") else "failed",
            reason=text_of(details.get("reason")) if isinstance(details, Mapping) else None,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
        )
    )
    return out
