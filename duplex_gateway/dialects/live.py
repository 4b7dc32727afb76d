"""The OpenAI Live API (GPT-Live, full duplex) as a :class:`~duplex_gateway.dialects.base.Dialect`.

Client frames are parsed by :mod:`duplex_gateway.dialects.live_commands` into the gateway's commands:
``session.start`` becomes the session's configuration (a ``session.update`` of the duplex handshake)
and its startup history; audio appends, context appends, function-call outputs, ``response.create``,
``session.update`` (delegation only) and ``session.close`` follow. The gateway's server events are
rendered here as Live server events; those the Live API has no form for render as nothing.

What the Live API names differently:

- A **delegation** is one of the engine's function calls. Under client delegation the engine has
  one function, :data:`~duplex_gateway.dialects.live_session.DELEGATE_TOOL`; its call becomes
  ``session.delegation.created`` and the client's commentary or thinking with that
  ``delegation_id`` goes back as the call's output. Under Responses delegation the engine calls the
  client's function tools; each reply that calls one is a delegation whose calls the client sees in
  ``response.event`` envelopes, and answers with ``response.item.create`` and ``response.create``.
- A **context append** is a :class:`~duplex_gateway.vocabulary.commands.ContextAppend` (under a
  conversation item id the dialect names); the session's ``ContextAppended`` is its
  acknowledgement, ``session.<channel>.appended``. Mute and unmute are ``InputAudioMute``.
- The **session timeline** (``start_ms``, ``end_ms``, ``offset_ms``) is the caller's audio received
  so far, which a Live client streams without pause; the dialect keeps no clock.
- **What the caller heard**: a Live client plays the audio it gets as it gets it and sends no
  playback acks, so the gateway is the one who knows. :class:`PacedLiveDialect`, the dialect the
  gateway serves, sends reply audio no faster than it plays (:class:`LivePlayout`: a small lead
  ahead, so a late packet leaves no gap), tells the session what its clock says was played, and
  drops what is queued when a reply is cut short: the caller hears at most the lead after a
  barge-in, and the conversation keeps what they heard. Time arrives as arguments.

Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

import base64
import json
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from duplex_gateway.dialects.live_backend import (
    BackendDelegations,
    BackendMessage,
    BackendRequest,
    BackendResult,
)
from duplex_gateway.dialects.live_commands import PARSERS, LiveState
from duplex_gateway.dialects.live_errors import (
    INVALID_VALUE,
    LiveProtocolError,
    live_code,
    missing,
    quote_list,
    refuse,
    wrong_type,
)
from duplex_gateway.dialects.live_session import DELEGATE_TOOL, session_resource
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, error_type_for
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "ACK_EVERY_MS",
    "CLIENT_EVENT_TYPES",
    "CLOSE_REASONS",
    "LEAD_MS",
    "RESPONSES_HERE",
    "Heard",
    "LiveDialect",
    "LivePlayout",
    "PacedLiveDialect",
    "responses_backend_notice",
]

JsonObject = dict[str, object]

#: Every client event type the dialect knows (some refused for now, saying why).
CLIENT_EVENT_TYPES: frozenset[str] = frozenset(PARSERS)

_MAX_REFUSALS = 8

#: The Live API's ``session.closed`` reason for the gateway's close reasons; any other is a lost connection.
CLOSE_REASONS: Mapping[str, str] = {
    "close_requested": "close_requested",
    "client_close": "close_requested",
    "client_closed": "close_requested",
    "session_expired": "expired",
    "max_duration": "expired",
    "server_shutdown": "remote_hangup",
    "remote_hangup": "remote_hangup",
}


@dataclass(slots=True)
class _Reply:
    """What the client has been shown of one of the engine's replies."""

    #: Where its first audio sits on the session timeline, and how much audio it has sent (ms).
    start_ms: int | None = None
    audio_ms: float = 0.0
    transcript_end_ms: int = 0
    #: Responses delegation: the delegation it belongs to, and whether ``response.created`` went out.
    delegation: str | None = None
    announced: bool = False
    #: Its words, for the conversation a backend reads.
    words: str = ""


@dataclass(slots=True)
class _Heard:
    """The caller's turn ``item_id``: its span on the timeline and the words shown so far."""

    start_ms: int
    end_ms: int | None = None
    text: str = ""
    cursor_ms: int = 0


@dataclass(slots=True)
class _View:
    replies: dict[str, _Reply] = field(default_factory=dict)
    heard: dict[str, _Heard] = field(default_factory=dict)
    output_end_ms: int = 0


class LiveDialect:
    """One Live connection's translator: Live client frames in, Live server frames out.

    ``session_id`` is the id the client sees; ``expires_at`` (Unix seconds) when the gateway ends the
    session, which the host knows from its own limits. ``backend`` names the gateway's backend model
    that Responses delegation goes to (see :mod:`~duplex_gateway.dialects.live_backend`); None: the
    voice engine does the delegated work itself.
    """

    def __init__(
        self, *, session_id: str, expires_at: int, max_message_bytes: int, backend: str | None = None
    ) -> None:
        self.session_id = session_id
        self.expires_at = expires_at
        self._max_bytes = max_message_bytes
        self.backend = backend
        self.state = LiveState(backend=BackendDelegations() if backend is not None else None)
        self._own_frames = 0
        self._view = _View()
        #: The Live codes of refusals raised and not yet rendered (the host renders each at once).
        self._refusals: dict[tuple[object, ...], str] = {}

    # -- client -> commands --------------------------------------------------------------------

    def parse(self, frame: Frame) -> tuple[Command, ...]:
        event_id: str | None = None
        try:
            data = self._load(frame)
            raw_id = data.get("event_id")
            if raw_id is not None and not isinstance(raw_id, str):
                raise wrong_type("event_id", "a string", raw_id)
            event_id = raw_id
            kind = data.get("type")
            if kind is None:
                raise missing("type")
            if not isinstance(kind, str):
                raise wrong_type("type", "a string", kind)
            parser = PARSERS.get(kind)
            if parser is None:
                raise refuse(
                    INVALID_VALUE,
                    f"Invalid value: '{kind[:100]}'. Supported values are: {quote_list(sorted(PARSERS))}.",
                    param="type",
                )
            return parser(data, event_id, self.state)
        except ProtocolError as exc:
            error = exc.with_event_id(event_id)
            if isinstance(error, LiveProtocolError):
                if len(self._refusals) >= _MAX_REFUSALS:
                    self._refusals.pop(next(iter(self._refusals)))
                self._refusals[_error_key(error.code, error.message, error.param, error.event_id)] = (
                    error.live
                )
            raise error from None

    def _load(self, frame: Frame) -> Mapping[str, object]:
        if not isinstance(frame, str):
            raise LiveProtocolError(
                "binary_not_supported",
                ErrorCode.BINARY_NOT_SUPPORTED,
                "This endpoint takes JSON text messages only.",
            )
        # Only a non-ASCII text needs encoding to know its size in bytes.
        too_long = len(frame) > self._max_bytes or (
            not frame.isascii() and len(frame.encode("utf-8", "surrogatepass")) > self._max_bytes
        )
        if too_long:
            raise LiveProtocolError(
                "message_too_large",
                ErrorCode.MESSAGE_TOO_LARGE,
                f"The message exceeds the {self._max_bytes}-byte limit.",
            )
        try:
            data = json.loads(frame)
        except (ValueError, RecursionError):
            raise LiveProtocolError(
                "invalid_json", ErrorCode.INVALID_JSON, "The message is not valid JSON."
            ) from None
        if not isinstance(data, dict):
            raise wrong_type("", "an object", data)
        return data

    # -- events -> server frames ---------------------------------------------------------------

    def render(self, event: ev.ServerEvent, *, seq: int) -> str | None:
        return self._render(event, f"event_{seq}")

    def render_unsequenced(self, event: ev.ServerEvent) -> str:
        raise NotImplementedError("Live sessions are not resumed")

    def _render(self, event: ev.ServerEvent, event_id: str) -> str | None:
        renderer = _RENDERERS.get(type(event))
        if renderer is None:
            return None  # the Live API has no form for it (turn events, playback, rate limits' detail...)
        body = renderer(self, event)
        if body is None:
            return None
        wire: JsonObject = {"type": body.pop("type"), "event_id": event_id, **body}
        return json.dumps(wire, separators=(",", ":"))

    # session

    def _resource(self, config: Any) -> JsonObject:
        setup = self.state.setup
        assert setup is not None
        return session_resource(
            config, setup, self.state.delegation, session_id=self.session_id, expires_at=self.expires_at
        )

    def _session_started(self, event: ev.SessionCreated) -> JsonObject | None:
        if self.state.setup is None:
            return None
        self.state.started = True
        return _with_client_id(
            {"type": "session.started", "session": self._resource(event.config)}, self.state.start_event_id
        )

    def _session_updated(self, event: ev.SessionUpdated) -> JsonObject | None:
        if not self.state.updates:
            return None  # a change of the gateway's own (the startup history) is no update of the client's
        return _with_client_id(
            {"type": "session.updated", "session": self._resource(event.config)}, self.state.updates.pop(0)
        )

    def _session_closed(self, event: ev.SessionClosed) -> JsonObject | None:
        if self.state.setup is None:
            return None
        seconds = self._usage_seconds()
        body: JsonObject = {
            "type": "session.closed",
            "reason": CLOSE_REASONS.get(event.reason, "connection_lost"),
            "session": {
                "id": self.session_id,
                "expires_at": self.expires_at,
                "model": self.state.setup.model,
                "status": "active",
                "delegation": self.state.delegation.wire(),
            },
            "usage": {"seconds": seconds},
        }
        return _with_client_id(body, self.state.close_event_id)

    def _usage(self, event: ev.RateLimitsUpdated) -> JsonObject | None:
        # The gateway reports usage after every reply; the Live API's is cumulative audio time.
        if not self.state.started:
            return None
        return {"type": "session.usage.updated", "usage": {"seconds": self._usage_seconds()}}

    def _usage_seconds(self) -> int:
        return int(max(self.state.timeline_ms, self._view.output_end_ms) // 1000)

    # audio and words

    def _audio(self, event: ev.AudioDelta) -> JsonObject:
        reply = self._reply(event.response_id)
        if reply.start_ms is None:
            reply.start_ms = max(self.state.now_ms(), self._view.output_end_ms)
            reply.transcript_end_ms = reply.start_ms
        fmt = self.state.setup.audio_format if self.state.setup is not None else None
        if fmt is not None:
            reply.audio_ms += fmt.duration_ms(len(event.audio))
        self._view.output_end_ms = max(self._view.output_end_ms, reply.start_ms + int(reply.audio_ms))
        return {"type": "session.output_audio.delta", "delta": base64.b64encode(event.audio).decode("ascii")}

    def _output_words(self, event: ev.TranscriptDelta) -> JsonObject | None:
        if not event.delta:
            return None
        reply = self._reply(event.response_id)
        if reply.start_ms is None:  # words ahead of the reply's audio sit where its audio will begin
            reply.start_ms = max(self.state.now_ms(), self._view.output_end_ms)
            reply.transcript_end_ms = reply.start_ms
        start = reply.transcript_end_ms
        end = max(start, reply.start_ms + int(reply.audio_ms))
        reply.transcript_end_ms = end
        reply.words += event.delta
        return {
            "type": "session.output_transcript.delta",
            "delta": event.delta,
            "start_ms": start,
            "end_ms": end,
        }

    def _speech_started(self, event: ev.SpeechStarted) -> None:
        self._view.heard[event.item_id] = _Heard(
            start_ms=event.audio_start_ms, cursor_ms=event.audio_start_ms
        )

    def _speech_stopped(self, event: ev.SpeechStopped) -> None:
        heard = self._view.heard.setdefault(event.item_id, _Heard(start_ms=event.audio_end_ms))
        heard.end_ms = event.audio_end_ms

    def _input_words(self, item_id: str, text: str, *, final: bool) -> JsonObject | None:
        heard = self._view.heard.get(item_id)
        if heard is None:
            heard = self._view.heard[item_id] = _Heard(
                start_ms=self.state.now_ms(), cursor_ms=self.state.now_ms()
            )
        delta = text
        backend = self._backend_on()
        if final and backend is not None:
            backend.transcript.add("user", text)
        if final:
            # No "completed" in the Live API: only the words the deltas have not shown yet.
            self._view.heard.pop(item_id, None)
            delta = text[len(heard.text) :] if text.startswith(heard.text) else _revision(heard.text, text)
        else:
            heard.text += text
        if not delta:
            return None
        start = heard.cursor_ms
        end = max(start, heard.end_ms if heard.end_ms is not None else self.state.now_ms())
        heard.cursor_ms = end
        return {"type": "session.input_transcript.delta", "delta": delta, "start_ms": start, "end_ms": end}

    # delegation

    def _reply(self, response_id: str) -> _Reply:
        reply = self._view.replies.get(response_id)
        if reply is None:
            reply = self._view.replies[response_id] = _Reply()
        return reply

    def _backend_on(self) -> BackendDelegations | None:
        """The backend doing this session's delegated work, if it has one (Responses delegation)."""
        return self.state.backend if self.state.delegation.target == "responses" else None

    def _call_started(self, event: ev.OutputItemAdded) -> JsonObject | None:
        if event.item.kind != "function_call" or self.state.delegation.target != "responses":
            return None
        if self._backend_on() is not None:
            return None  # the engine's call is the backend's delegation, opened when the call is complete
        reply = self._reply(event.response_id)
        if reply.delegation is not None:
            return None
        continuing, self.state.continuing = self.state.continuing, None
        if continuing is not None:
            reply.delegation, reply.announced = continuing, True
            return self._envelope(
                continuing,
                {"type": "response.created", "response": _snapshot(event.response_id, "in_progress")},
            )
        reply.delegation = self.state.last_delegation = f"deleg_{event.response_id}"
        return self._delegation_created(reply.delegation, "responses", response_id=event.response_id)

    def _arguments_done(self, event: ev.FunctionCallArgumentsDone) -> JsonObject | None:
        reply = self._view.replies.get(event.response_id)
        if reply is None or reply.delegation is None or reply.announced:
            return None
        reply.announced = True
        return self._envelope(
            reply.delegation,
            {"type": "response.created", "response": _snapshot(event.response_id, "in_progress")},
        )

    def _call_done(self, event: ev.OutputItemDone) -> JsonObject | None:
        item = event.item
        if item.kind != "function_call" or item.call_id is None:
            return None
        if self.state.delegation.target == "client":
            if item.name != DELEGATE_TOOL.name:
                return None
            self.state.open_delegations.add(item.call_id)
            return self._delegation_created(item.call_id, "client")
        backend = self._backend_on()
        if backend is not None:
            if not backend.is_delegation(item.name):
                return None
            setup = self.state.setup
            system = (setup.instructions,) if setup is not None and setup.instructions else ()
            # What the transcript has not got yet: words still being recognized, the reply delegating.
            reply = self._view.replies.get(event.response_id)
            pending = (
                *(BackendMessage(role="user", content=heard.text) for heard in self._view.heard.values()),
                BackendMessage(role="assistant", content=reply.words if reply is not None else None),
            )
            bodies = backend.delegate(item.call_id, self.state.now_ms(), system, pending)
            self.state.outbox.extend(bodies[1:])
            return bodies[0] if bodies else None
        reply = self._view.replies.get(event.response_id)
        if reply is None or reply.delegation is None:
            return None
        self.state.open_calls.add(item.call_id)
        nested: JsonObject = {
            "type": "response.output_item.done",
            "output_index": event.output_index,
            "item": {
                "id": item.id,
                "type": "function_call",
                "status": item.status,
                "call_id": item.call_id,
                "name": item.name,
                "arguments": item.arguments or "",
            },
        }
        return self._envelope(reply.delegation, nested)

    def _response_done(self, event: ev.ResponseDone) -> JsonObject | None:
        reply = self._view.replies.pop(event.response_id, None)
        backend = self._backend_on()
        if reply is not None and backend is not None:
            backend.transcript.add("assistant", reply.words)
        if reply is None or reply.delegation is None:
            return None
        status = {"completed": "completed", "failed": "failed"}.get(event.status, "incomplete")
        snapshot = _snapshot(event.response_id, status)
        if status == "incomplete":
            snapshot["incomplete_details"] = {"reason": event.reason or event.status}
            self.state.open_calls.clear()  # the calls of a reply cut short are not answered
        if status == "failed":
            snapshot["error"] = {
                "code": event.reason or "engine_error",
                "message": "The delegated reply failed.",
            }
            self.state.open_calls.clear()
        return self._envelope(reply.delegation, {"type": f"response.{status}", "response": snapshot})

    def _delegation_created(
        self, delegation_id: str, target: str, *, response_id: str | None = None
    ) -> JsonObject:
        delegation: JsonObject = {"id": delegation_id, "type": "delegation", "target": target}
        if response_id is not None:
            delegation["response_id"] = response_id
        return {
            "type": "session.delegation.created",
            "offset_ms": self.state.now_ms(),
            "delegation": delegation,
        }

    @staticmethod
    def _envelope(delegation_id: str, nested: JsonObject) -> JsonObject:
        return {"type": "response.event", "delegation_id": delegation_id, "event": nested}

    # the backend's work (the host runs each request and hands back what the backend streams)

    def take_backend_requests(self) -> list[BackendRequest]:
        """Backend rounds to run: each delegation the engine opened, each round the client resumed."""
        return self.state.backend.take_requests() if self.state.backend is not None else []

    def backend_result(self, result: BackendResult) -> None:
        """What a backend round streamed; its frames go out with :meth:`own_frames`."""
        if self.state.backend is not None:
            self.state.outbox.extend(self.state.backend.result(result))

    def take_backend_commands(self) -> list[cmd.Command]:
        """What the backend's work has for the session: its answers, for the engine to say."""
        return self.state.backend.take_commands() if self.state.backend is not None else []

    def own_frames(self) -> list[Frame]:
        """The dialect's own server events waiting to go out (the backend's), as frames, in order."""
        bodies, self.state.outbox = self.state.outbox, []
        frames: list[Frame] = []
        for body in bodies:
            self._own_frames += 1
            wire = {"type": body.pop("type"), "event_id": f"event_own_{self._own_frames}", **body}
            frames.append(json.dumps(wire, separators=(",", ":")))
        return frames

    # acknowledgements and errors

    def _context_appended(self, event: ctx.ContextAppended) -> JsonObject | None:
        if BackendDelegations.is_answer_item(event.item_id):
            return None  # the gateway's own append: the backend's answer handed to the engine
        now = self.state.now_ms()
        body: JsonObject = {"type": f"session.{event.channel}.appended", "start_ms": now, "end_ms": now}
        return _with_client_id(body, event.event_id)

    def _error(self, event: ev.ErrorEvent) -> JsonObject:
        if event.event_id is not None and event.event_id in self.state.updates:
            self.state.updates.remove(event.event_id)  # a refused update gets no session.updated
        key = _error_key(event.code, event.message, event.param, event.event_id)
        code = self._refusals.pop(key, None) or live_code(event.code)
        error: JsonObject = {"type": error_type_for(event.code), "code": code, "message": event.message}
        if event.param is not None:
            error["param"] = event.param
        if event.event_id is not None:
            error["client_event_id"] = event.event_id
        return _with_client_id({"type": "error", "error": error}, event.event_id)


def _error_key(code: ErrorCode, message: str, param: str | None, event_id: str | None) -> tuple[object, ...]:
    return (code, message, param, event_id)


def _with_client_id(body: JsonObject, client_event_id: str | None) -> JsonObject:
    if client_event_id is not None:
        body["client_event_id"] = client_event_id
    return body


def _snapshot(response_id: str, status: str) -> JsonObject:
    # Reduced, as the Live API's are: output is always empty; calls come in their own events.
    return {"id": response_id, "object": "response", "status": status, "output": []}


def _silent(handler: Callable[[LiveDialect, Any], None]) -> Callable[[LiveDialect, Any], JsonObject | None]:
    def render(dialect: LiveDialect, event: Any) -> JsonObject | None:
        handler(dialect, event)
        return None

    return render


_RENDERERS: Mapping[type[ev.ServerEvent], Callable[[LiveDialect, Any], JsonObject | None]] = {
    ev.SessionCreated: LiveDialect._session_started,
    ev.SessionUpdated: LiveDialect._session_updated,
    ev.SessionClosed: LiveDialect._session_closed,
    ev.RateLimitsUpdated: LiveDialect._usage,
    ev.AudioDelta: LiveDialect._audio,
    ev.TranscriptDelta: LiveDialect._output_words,
    ev.SpeechStarted: _silent(LiveDialect._speech_started),
    ev.SpeechStopped: _silent(LiveDialect._speech_stopped),
    ev.InputTranscriptionDelta: lambda d, e: d._input_words(e.item_id, e.delta, final=False),
    ev.InputTranscriptionCompleted: lambda d, e: d._input_words(e.item_id, e.transcript, final=True),
    ev.OutputItemAdded: LiveDialect._call_started,
    ev.FunctionCallArgumentsDone: LiveDialect._arguments_done,
    ev.OutputItemDone: LiveDialect._call_done,
    ev.ResponseDone: LiveDialect._response_done,
    ev.ErrorEvent: LiveDialect._error,
    ctx.ContextAppended: LiveDialect._context_appended,
    ctx.InputAudioMuted: lambda d, e: {
        "type": "session.input_audio.muted" if e.muted else "session.input_audio.unmuted"
    },
    ctx.Notice: lambda d, e: {"type": "info", "code": e.code, "message": e.message},
}


# -- real-time pacing ------------------------------------------------------------------------------

#: How far ahead of real time reply audio is sent: enough for network jitter, little to cut short.
LEAD_MS = 100.0
#: The most audio one paced frame carries.
CHUNK_MS = 40.0


@dataclass(frozen=True, slots=True)
class Heard:
    """The caller has heard ``played_ms`` of reply ``response_id`` (its item ``item_id``)."""

    response_id: str
    item_id: str
    played_ms: int


class LivePlayout:
    """Paces one session's reply audio and keeps, by the clock, how much of it was played."""

    def __init__(self, fmt: AudioFormat, *, lead_ms: float = LEAD_MS, chunk_ms: float = CHUNK_MS) -> None:
        self.format = fmt
        self._lead_s = lead_ms / 1000.0
        width = fmt.encoding.bytes_per_sample
        chunk = max(fmt.byte_count(chunk_ms), width)
        self._chunk = chunk - chunk % width
        self._width = width
        #: Reply audio not sent yet: (response, item, bytes), in order.
        self._queue: deque[tuple[str, str, bytearray]] = deque()
        #: When everything sent so far will have played (None: nothing is playing).
        self._ends_at: float | None = None
        #: The reply whose audio went out last, and how much of it went (ms).
        self._current: tuple[str, str] | None = None
        self._sent_ms = 0.0

    def queue(self, response_id: str, item_id: str, audio: bytes) -> None:
        """Reply audio (in the session's output format) to play after what is queued."""
        if self._queue and self._queue[-1][:2] == (response_id, item_id):
            self._queue[-1][2].extend(audio)
        else:
            self._queue.append((response_id, item_id, bytearray(audio)))

    def due(self, now: float) -> tuple[list[tuple[str, bytes]], float | None]:
        """The audio to send at ``now`` (each with its reply's id), and when to ask again (None: on more audio)."""
        out: list[tuple[str, bytes]] = []
        while self._queue:
            # (a microsecond of slack, so float rounding at the wake-up time does not defer it again)
            if self._ends_at is not None and self._ends_at - now > self._lead_s + 1e-6:
                return out, self._ends_at - self._lead_s
            response_id, item_id, audio = self._queue[0]
            size = min(len(audio), self._chunk)
            size -= size % self._width
            if size == 0:  # a partial sample waits for the rest; another reply's audio goes first
                if len(self._queue) == 1:
                    return out, None
                self._queue.popleft()
                continue
            take = bytes(audio[:size])
            del audio[:size]
            if not audio:
                self._queue.popleft()
            if self._current != (response_id, item_id):
                self._current, self._sent_ms = (response_id, item_id), 0.0
            duration_ms = self.format.duration_ms(len(take))
            self._sent_ms += duration_ms
            start = now if self._ends_at is None or self._ends_at < now else self._ends_at
            self._ends_at = start + duration_ms / 1000.0
            out.append((response_id, take))
        return out, None

    def heard(self, now: float) -> Heard | None:
        """How much of the reply playing (or played last) the caller has heard by ``now``."""
        if self._current is None:
            return None
        unplayed_ms = max(0.0, (self._ends_at or now) - now) * 1000.0
        response_id, item_id = self._current
        return Heard(response_id, item_id, max(0, round(self._sent_ms - unplayed_ms)))

    def playing(self, now: float) -> bool:
        """Reply audio is queued, or sent and not played yet."""
        return bool(self._queue) or (self._ends_at is not None and self._ends_at > now)

    def playing_reply(self, now: float) -> str | None:
        """The reply the caller hears at ``now``, or hears next (None: nothing is playing)."""
        if self._current is not None and self._ends_at is not None and self._ends_at > now:
            return self._current[0]
        return self._queue[0][0] if self._queue else None

    def clear(self, now: float) -> Heard | None:
        """Drop what is queued: what the caller heard of the reply cut short (None: nothing was playing)."""
        cut = self.heard(now) if self.playing(now) else None
        self._queue.clear()
        self._ends_at = None
        self._current, self._sent_ms = None, 0.0
        return cut


#: How often, in played audio, the session hears how much of the reply the caller has heard.
ACK_EVERY_MS = 200

#: What a session started with Responses delegation is told: the gateway hands no work to a backend.
RESPONSES_HERE = ctx.Notice(
    code="responses_delegation_local",
    message=(
        "Responses delegation: this gateway has no Responses backend, so its voice engine answers by "
        "itself and calls the session's function tools itself; hosted tools are not run."
    ),
)


def responses_backend_notice(backend: str) -> ctx.Notice:
    """What a session started with Responses delegation is told when a backend model does the work."""
    return ctx.Notice(
        code="responses_delegation_backend",
        message=(
            f"Responses delegation: the voice engine hands work to this gateway's backend model ({backend}), "
            "which calls the session's function tools; hosted tools are not run."
        ),
    )


class PacedLiveDialect(LiveDialect):
    """The Live dialect with its reply audio paced in real time (a :class:`~duplex_gateway.dialects.base.PacedDialect`).

    Reply audio goes out through :class:`LivePlayout`; the session hears what was played as
    playback acks, and a reply cut short (a barge-in, a cleared output) as a truncation at
    what the caller heard, so that is what the conversation keeps of it.

    A reply the engine has finished making can still be playing (a fast engine makes it long
    before it plays): the session has no reply to interrupt then, so a caller who speaks over
    it (with ``interrupt_response``) is a barge-in the dialect cuts itself, as a Realtime
    client truncates the audio it is playing.
    """

    def __init__(
        self, *, session_id: str, expires_at: int, max_message_bytes: int, backend: str | None = None
    ) -> None:
        super().__init__(
            session_id=session_id, expires_at=expires_at, max_message_bytes=max_message_bytes, backend=backend
        )
        self._playout: LivePlayout | None = None
        self._now = 0.0
        self._commands: list[cmd.Command] = []
        self._acked: tuple[str, int] | None = None
        self._audio_frames = 0
        #: Frames of the dialect's own to go out with the next pump (an ``info`` after ``session.started``).
        self._own: list[Frame] = []
        #: The session's turn detection stops a reply the caller speaks over (``interrupt_response``).
        self._barge_in = False

    def render(self, event: ev.ServerEvent, *, seq: int) -> str | None:
        setup = self.state.setup
        if isinstance(event, ev.AudioDelta) and setup is not None:
            self._audio(event)  # its place on the session timeline, as if sent now
            if self._playout is None:
                self._playout = LivePlayout(setup.audio_format)
            self._playout.queue(event.response_id, event.item_id, event.audio)
            return None  # sent by pump(), in real time
        cancelled = isinstance(event, ev.ResponseDone) and event.status == "cancelled"
        if cancelled or isinstance(event, ev.OutputAudioCleared):
            self._cut()
        elif isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            td = event.config.turn_detection
            self._barge_in = td is not None and td.interrupt_response
        elif isinstance(event, ev.SpeechStarted) and self._barge_in and self._made_reply_playing():
            self._cut()
        frame = super().render(event, seq=seq)
        if (
            isinstance(event, ev.SessionCreated)
            and frame is not None
            and self.state.delegation.target == "responses"
        ):
            said = RESPONSES_HERE if self.backend is None else responses_backend_notice(self.backend)
            notice = self._render(said, f"event_{seq}_info")
            if notice is not None:
                self._own.append(notice)
        return frame

    def _made_reply_playing(self) -> bool:
        # A reply still being made is the session's to interrupt: its cancellation cuts it here.
        playing = self._playout.playing_reply(self._now) if self._playout is not None else None
        return playing is not None and playing not in self._view.replies

    def _cut(self) -> None:
        cut = self._playout.clear(self._now) if self._playout is not None else None
        if cut is not None:
            self._commands.append(
                cmd.ConversationItemTruncate(item_id=cut.item_id, content_index=0, audio_end_ms=cut.played_ms)
            )

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        """The reply audio due at ``now`` as ``session.output_audio.delta`` frames, and when to ask again."""
        self._now = now
        frames, self._own = self._own, []
        frames.extend(self.own_frames())
        if self._playout is None:
            return frames, None
        due, wake = self._playout.due(now)
        for _, audio in due:
            self._audio_frames += 1
            wire = {
                "type": "session.output_audio.delta",
                "event_id": f"event_audio_{self._audio_frames}",
                "delta": base64.b64encode(audio).decode("ascii"),
            }
            frames.append(json.dumps(wire, separators=(",", ":")))
        heard = self._playout.heard(now)
        if heard is not None:
            acked = self._acked[1] if self._acked and self._acked[0] == heard.response_id else -ACK_EVERY_MS
            if heard.played_ms - acked >= ACK_EVERY_MS:
                self._acked = (heard.response_id, heard.played_ms)
                self._commands.append(
                    cmd.PlaybackAck(
                        response_id=heard.response_id, item_id=heard.item_id, played_ms=heard.played_ms
                    )
                )
        return frames, wake

    def tick(self, now: float) -> None:
        """The time of the next :meth:`render` or :meth:`parse` (a cut measures what was heard by it)."""
        self._now = now

    @property
    def wants_pump(self) -> bool:
        """A client event made frames of the dialect's own (a backend round resumed)."""
        return bool(self.state.outbox)

    def take_commands(self) -> list[cmd.Command]:
        """What the pacing has for the session: playback acks, and the truncation after a cut."""
        out, self._commands = self._commands, []
        out.extend(self.take_backend_commands())
        return out


def _revision(shown: str, final: str) -> str:
    """The final transcript's words past those the deltas already showed right.

    A recognizer's final words may revise its partial ones, and the Live API has no event that
    replaces words: the client gets the final words from the first one that differs, so what the
    caller said reaches it even where the partial words were wrong.
    """
    common = next(
        (i for i, (a, b) in enumerate(zip(shown, final, strict=False)) if a != b), min(len(shown), len(final))
    )
    start = final.rfind(" ", 0, common) + 1 if common < len(final) else common
    rest = final[start:]
    return f" {rest}" if rest and shown and not shown.endswith(" ") else rest
