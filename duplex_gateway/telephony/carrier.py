"""What every carrier comes down to: one :class:`CarrierSpec`, and a media stream of call events and frames.

A carrier is one module under :mod:`duplex_gateway.telephony.carriers` holding its
:class:`CarrierSpec`: its settings section, its media wire, its answer webhook, its
signature checks and its REST hang-up, all pure. The adapters around them (the webhook
routes, the auth layer's checks, the hang-up's HTTP call) know no carrier by name.

A :class:`Carrier` is a pure translator for one call's socket (no I/O, no clock). It
turns the carrier's messages into :data:`CallEvent` values and builds the messages
the carrier takes: reply audio, a mark (a named point in the played audio the
carrier reports back when it has played up to it), a clear (drop the audio it holds
and has not played) and, where the protocol has one, an in-band hang-up.
"""

from __future__ import annotations

import binascii
from abc import ABC
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from duplex_gateway.dialects import wire_codec
from duplex_gateway.telephony.control import (
    Answer,
    AnswerHook,
    CarrierSettings,
    HangupOutcome,
    HangupRequest,
    Need,
    Refusal,
    SignatureRule,
    WebhookRequest,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "CallAudio",
    "CallEnded",
    "CallEvent",
    "CallStart",
    "Carrier",
    "CarrierCleared",
    "CarrierError",
    "CarrierSpec",
    "CarrierWire",
    "Dtmf",
    "FlowPaused",
    "FlowResumed",
    "Framing",
    "MarkPlayed",
    "bad_message",
    "dump",
    "json_message",
    "media_payload",
    "peek_json",
    "text_field",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CallStart:
    """The call is connected: who called whom, and the audio formats of the stream."""

    carrier: str
    call_id: str | None
    stream_id: str | None = None
    caller: str | None = None  # "from"
    callee: str | None = None  # "to"
    #: What the call was set up with: the parameters or headers its answer webhook passed on.
    parameters: Mapping[str, str] = field(default_factory=dict)
    input_format: AudioFormat
    output_format: AudioFormat


@dataclass(frozen=True, slots=True)
class CallAudio:
    """Caller audio in the call's input format."""

    audio: bytes


@dataclass(frozen=True, slots=True)
class MarkPlayed:
    """The carrier played the audio sent before the mark ``name`` (or dropped it on a clear)."""

    name: str


@dataclass(frozen=True, slots=True)
class CarrierCleared:
    """The carrier confirmed a clear."""


@dataclass(frozen=True, slots=True)
class Dtmf:
    """The caller pressed a key."""

    digit: str


@dataclass(frozen=True, slots=True)
class CallEnded:
    """The call is over (the caller hung up, or the carrier stopped the stream)."""

    reason: str = "hangup"


@dataclass(frozen=True, slots=True)
class FlowPaused:
    """The carrier's buffer is full: send no audio until :class:`FlowResumed`."""


@dataclass(frozen=True, slots=True)
class FlowResumed:
    """The carrier takes audio again."""


@dataclass(frozen=True, slots=True)
class CarrierError:
    """The carrier reported a problem with what the gateway sent."""

    code: str
    message: str


CallEvent = (
    CallStart
    | CallAudio
    | MarkPlayed
    | CarrierCleared
    | Dtmf
    | CallEnded
    | CarrierError
    | FlowPaused
    | FlowResumed
)


@dataclass(frozen=True, slots=True)
class Framing:
    """How the carrier wants reply audio cut: ``chunk_ms`` pieces, at least ``min_bytes``,
    a whole multiple of ``multiple`` bytes (e.g. 3.2 KB minimum, multiples of 320 B)."""

    chunk_ms: int = 40
    min_bytes: int = 0
    multiple: int = 1


class Carrier(Protocol):
    """One call's messages, translated. One instance per socket."""

    name: ClassVar[str]

    @property
    def framing(self) -> Framing:
        """How reply audio is cut for this carrier."""
        ...

    @property
    def has_marks(self) -> bool:
        """The carrier echoes marks: the played position comes from them. Without marks the
        position is the clock's (the audio was sent at real time)."""
        ...

    def parse(self, frame: Frame) -> Sequence[CallEvent]:
        """The call events one message carries; raises ``ProtocolError`` for a malformed one."""
        ...

    def media(self, audio: bytes) -> Sequence[Frame]:
        """Reply audio (in the call's output format) as the carrier takes it."""
        ...

    def mark(self, name: str) -> Frame | None:
        """A mark named ``name`` after the audio sent so far (None: the carrier has none)."""
        ...

    def clear(self) -> Frame | None:
        """Drop the audio the carrier holds and has not played (None: it holds none)."""
        ...

    def hangup(self) -> Frame | None:
        """End the call in-band (None: closing the socket ends it)."""
        ...


class CarrierWire(Carrier, Protocol):
    """A carrier's media wire as a class: one instance per call, and how its first messages look."""

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """Whether ``frame`` is this carrier's start (or greeting): how ``/telephony`` tells carriers apart."""
        ...


S = TypeVar("S", bound=CarrierSettings)


class CarrierSpec(ABC, Generic[S]):
    """One carrier, whole: the one thing a carrier's module declares (as ``SPEC``).

    Everything here is pure: settings in, values out. What a carrier lacks keeps the
    defaults (no settings, no answer webhook, no signatures, no REST hang-up).
    """

    #: The name in the paths (``/telephony/<name>``) and the settings section (``telephony.<name>``).
    name: ClassVar[str]
    #: The name people know it by, for logs.
    title: ClassVar[str]
    #: Its media wire (pure: frames in, call events out).
    wire_class: ClassVar[type[CarrierWire]]
    #: Its settings section; None: it has none.
    settings_model: ClassVar[type[CarrierSettings] | None] = None
    #: Its answer webhook; None: it has none (the call is routed to the gateway by other means).
    answer_hook: ClassVar[AnswerHook | None] = None
    #: WebSocket subprotocols its media stream asks for.
    subprotocols: ClassVar[frozenset[str]] = frozenset()

    def wire(self) -> Carrier:
        """A new translator for one call's media stream."""
        return self.wire_class()

    def recognizes(self, frame: Frame) -> bool:
        """Whether ``frame`` is this carrier's start (or greeting): how ``/telephony`` tells carriers apart."""
        return self.wire_class.recognizes(frame)

    def answer(self, request: WebhookRequest, stream_url: str) -> Answer:
        """The answer webhook's document, streaming the call to ``stream_url``."""
        raise NotImplementedError(f"{self.name} has no answer webhook")

    def signatures(self, settings: S) -> Sequence[SignatureRule]:
        """The signature checks ``settings`` turn on; ``ValueError`` (naming the key) if a key is unusable."""
        return ()

    def needs(self, settings: S) -> Sequence[Need]:
        """The telephony extra's modules the configured features need, checked at start."""
        return ()

    def hangup_request(self, call_id: str, settings: S) -> HangupRequest | Refusal:
        """The REST call that ends ``call_id`` (the carrier's id of the call), or why none is made."""
        return HangupOutcome.UNSUPPORTED, None

    def already_ended(self, status: int, codes: frozenset[str]) -> bool:
        """Whether a hang-up's error answer (HTTP ``status``, the error ``codes`` in its body) means
        the call had already ended."""
        return False

    def settings_of(self, telephony: object) -> S:
        """This carrier's section of the telephony settings."""
        section = getattr(telephony, self.name) if self.settings_model is not None else CarrierSettings()
        return cast("S", section)


# -- helpers the carriers share -------------------------------------------------------------


def bad_message(message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_EVENT, message)


def json_message(frame: Frame, carrier: str) -> dict[str, Any]:
    """A JSON text message as an object, or a ``ProtocolError``."""
    if isinstance(frame, bytes):
        raise ProtocolError(ErrorCode.BINARY_NOT_SUPPORTED, f"{carrier} sends JSON text messages only")
    try:
        data = wire_codec.loads(frame)
    except ValueError:
        raise ProtocolError(ErrorCode.INVALID_JSON, f"a {carrier} message is not valid JSON") from None
    if not isinstance(data, dict):
        raise bad_message(f"a {carrier} message must be a JSON object")
    return data


def media_payload(media: Mapping[str, Any], carrier: str) -> bytes:
    """The audio of a JSON media message's base64 ``payload``, or a ``ProtocolError``."""
    payload = media.get("payload")
    if not isinstance(payload, str):
        raise bad_message(f"a {carrier} media message has no payload")
    try:
        return wire_codec.b64decode(payload)
    except (binascii.Error, ValueError):
        raise bad_message(f"a {carrier} media payload is not valid base64") from None


def dump(message: Mapping[str, Any]) -> str:
    """A control or media message as compact JSON text."""
    return wire_codec.dumps(message)


def peek_json(frame: Frame) -> dict[str, Any] | None:
    """A text frame's JSON object, or None (for telling carriers apart: never raises)."""
    if not isinstance(frame, str):
        return None
    try:
        data = wire_codec.loads(frame)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def text_field(obj: Mapping[str, Any], *keys: str) -> str | None:
    """The first of ``keys`` that holds a non-empty string (numbers are taken as text)."""
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
    return None
