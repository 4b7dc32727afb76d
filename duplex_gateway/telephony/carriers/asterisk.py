"""Asterisk ``chan_websocket`` (``Dial(WebSocket/<connection>/c(ulaw)f(json))``).

Binary frames carry raw audio in the channel's codec, both ways. Control messages are
text, in the format the channel was set up with: plain text (``MEDIA_START
connection_id:... format:ulaw optimal_frame_size:160 ptime:20``, the default) or JSON
(``{"event":"MEDIA_START",...}``, ``f(json)``). Asterisk reads commands in that same
format only, so the gateway answers in the format of the channel's ``MEDIA_START``.

Asterisk re-frames reply audio into ``optimal_frame_size`` pieces and drops the
trailing partial frame of each binary message, so every binary frame sent here is a
whole multiple of it. ``MARK_MEDIA <name>`` comes back as ``MEDIA_MARK_PROCESSED
<name>`` when the audio queued before it has been played; ``FLUSH_MEDIA`` drops the
queue, marks included, without a word. Commands over 128 bytes are ignored by
Asterisk, so the marks' names stay short. ``MEDIA_XOFF`` / ``MEDIA_XON`` are its
flow control; ``HANGUP`` ends the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.control import CarrierSettings
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import MAX_RATE, AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["SPEC", "AsteriskCarrier", "asterisk_format"]

#: Asterisk drops text commands longer than this (``MAX_TEXT_MESSAGE_LEN``).
MAX_COMMAND_BYTES = 128
#: Reply audio goes out in pieces of at least this much (a whole number of the channel's frames).
_CHUNK_MS = 40
#: Signed linear rates by Asterisk's format name (``slin`` is 8 kHz).
_SLIN_RATES = {
    "slin": 8_000,
    "slin12": 12_000,
    "slin16": 16_000,
    "slin24": 24_000,
    "slin32": 32_000,
    "slin44": 44_100,
    "slin48": 48_000,
    "slin96": 96_000,
    "slin192": 192_000,
}
#: Channel variables that may carry the calling number (set with ``Set(__CALLER=${CALLERID(num)})``).
_CALLER_VARIABLES = ("CALLERID(num)", "CALLERID_NUM", "CALLERIDNUM", "CALLER", "CALLER_ID", "FROM")
#: ... and the number called (``Set(__CALLEE=${EXTEN})``).
_CALLEE_VARIABLES = ("EXTEN", "CALLEE", "DNID", "CALLED", "TO")
#: Events that need no answer.
_IGNORED = frozenset({"STATUS", "QUEUE_DRAINED", "MEDIA_BUFFERING_COMPLETED"})


def asterisk_format(name: str) -> AudioFormat:
    """The gateway's format for Asterisk's codec ``name``; a ``ProtocolError`` for one it cannot take."""
    key = name.strip().lower()
    if key == "ulaw":
        return AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)
    if key == "alaw":
        return AudioFormat(encoding=Encoding.G711_ALAW, rate=8_000)
    rate = _SLIN_RATES.get(key.replace("sln", "slin", 1) if key.startswith("sln") else key)
    if rate is not None and rate <= MAX_RATE:
        return AudioFormat(encoding=Encoding.PCM16, rate=rate)
    raise ProtocolError(
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        f"Asterisk format {name[:32]!r} is not supported: dial with c(ulaw), c(alaw) or c(slin16)"
        " (signed linear up to 48 kHz)",
    )


class AsteriskCarrier:
    """One Asterisk WebSocket channel."""

    name: ClassVar[str] = "asterisk"
    has_marks = True

    def __init__(self) -> None:
        #: The channel speaks JSON (``f(json)``): known from its first control message.
        self.uses_json: bool | None = None
        self.format: AudioFormat | None = None
        self.frame_bytes = 1
        self._framing = call.Framing(chunk_ms=_CHUNK_MS)
        self._silence = b"\x00"
        #: A MEDIA_START was refused: the next message ends the call.
        self._refused = False
        self._started = False

    @property
    def framing(self) -> call.Framing:
        return self._framing

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A ``MEDIA_START``, plain text or JSON."""
        if not isinstance(frame, str):
            return False
        text = frame.lstrip()
        if text.startswith("{"):
            message = call.peek_json(text)
            return message is not None and message.get("event") == "MEDIA_START"
        return text.split(" ", 1)[0] == "MEDIA_START"

    # -- Asterisk -> gateway -------------------------------------------------------------

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        if self._refused:
            self._refused = False
            return [call.CallEnded("unsupported_format")]
        if isinstance(frame, bytes):
            return self._audio(frame)
        text = frame.strip()
        if not text:
            raise call.bad_message("an empty Asterisk control message")
        is_json = text.startswith("{")
        if self.uses_json is None:
            self.uses_json = is_json
        kind, fields = _json_event(text) if is_json else _plain_event(text)
        if kind == "MEDIA_START":
            return self._start(fields, is_json)
        if kind == "MEDIA_MARK_PROCESSED":
            name = _text(fields, "correlation_id")
            return [call.MarkPlayed(name)] if name else []
        if kind == "MEDIA_XOFF":
            return [call.FlowPaused()]
        if kind == "MEDIA_XON":
            return [call.FlowResumed()]
        if kind == "DTMF_END":
            digit = _text(fields, "digit")
            return [call.Dtmf(digit)] if digit else []
        if kind == "ERROR":
            return [call.CarrierError("asterisk_error", _text(fields, "error_text") or text[:200])]
        if kind in _IGNORED:
            return []
        raise call.bad_message(f"unknown Asterisk event {kind[:64]!r}")

    def _audio(self, audio: bytes) -> list[call.CallEvent]:
        if not audio:
            return []
        if self.format is not None and len(audio) % self.format.encoding.bytes_per_sample:
            raise ProtocolError(
                ErrorCode.INVALID_AUDIO_LENGTH, f"{len(audio)} bytes is not whole {self.format} samples"
            )
        return [call.CallAudio(audio)]

    def _start(self, fields: Mapping[str, Any], is_json: bool) -> list[call.CallEvent]:
        if self._started:
            return []  # a repeated start changes nothing
        self.uses_json = is_json
        codec = _text(fields, "format")
        if codec is None:
            raise call.bad_message("an Asterisk MEDIA_START names no format")
        try:
            fmt = asterisk_format(codec)
        except ProtocolError:
            self._refused = True
            raise
        ptime = _positive_int(fields.get("ptime")) or 20
        frame_bytes = _positive_int(fields.get("optimal_frame_size")) or fmt.byte_count(ptime)
        if frame_bytes % fmt.encoding.bytes_per_sample:
            raise call.bad_message(f"an Asterisk optimal_frame_size of {frame_bytes} is not whole samples")
        self._started = True
        self.format, self.frame_bytes = fmt, frame_bytes
        frame_ms = max(1, round(fmt.duration_ms(frame_bytes)))
        # A piece is the fewest whole frames that make _CHUNK_MS (each piece is followed by a mark).
        frames = max(1, -(-_CHUNK_MS // frame_ms))
        self._framing = call.Framing(chunk_ms=frames * frame_ms, multiple=frame_bytes)
        self._silence = {Encoding.G711_ULAW: b"\xff", Encoding.G711_ALAW: b"\xd5"}.get(fmt.encoding, b"\x00")
        raw = fields.get("channel_variables")
        variables = (
            {str(k).lstrip("_"): str(v) for k, v in raw.items() if isinstance(v, str | int | float)}
            if isinstance(raw, dict)
            else {}
        )
        connection_id = _text(fields, "connection_id")
        return [
            call.CallStart(
                carrier=self.name,
                call_id=_text(fields, "channel_id") or connection_id,
                stream_id=connection_id,
                caller=_lookup(variables, _CALLER_VARIABLES),
                callee=_lookup(variables, _CALLEE_VARIABLES),
                parameters=variables,
                input_format=fmt,
                output_format=fmt,
            )
        ]

    # -- gateway -> Asterisk -------------------------------------------------------------

    def media(self, audio: bytes) -> Sequence[Frame]:
        if not audio:
            return []
        short = -len(audio) % self.frame_bytes
        # Asterisk would drop a partial last frame: it is padded with silence instead.
        return [audio + self._silence * short if short else audio]

    def mark(self, name: str) -> Frame | None:
        return self._command("MARK_MEDIA", name)

    def clear(self) -> Frame | None:
        return self._command("FLUSH_MEDIA")

    def hangup(self) -> Frame | None:
        return self._command("HANGUP")

    def _command(self, command: str, correlation_id: str | None = None) -> Frame | None:
        if self.uses_json:
            message: dict[str, str] = {"command": command}
            if correlation_id is not None:
                message["correlation_id"] = correlation_id
            text = json.dumps(message, separators=(",", ":"))
        else:
            text = command if correlation_id is None else f"{command} {correlation_id}"
        if len(text.encode()) > MAX_COMMAND_BYTES:
            return None  # Asterisk would ignore it
        return text


# -- control messages ------------------------------------------------------------------------


def _json_event(text: str) -> tuple[str, dict[str, Any]]:
    message = call.json_message(text, "Asterisk")
    kind = message.get("event")
    if not isinstance(kind, str) or not kind:
        raise call.bad_message("an Asterisk JSON message has no 'event'")
    return kind, message


def _plain_event(text: str) -> tuple[str, dict[str, Any]]:
    """``EVENT key:value key:value`` (``error_text`` runs to the end); ``EVENT id`` for the id events."""
    kind, _, rest = text.partition(" ")
    rest = rest.strip()
    if not kind.replace("_", "").isalnum() or not kind.isupper():
        raise call.bad_message(f"an Asterisk control message {text[:64]!r} names no event")
    if kind in ("MEDIA_MARK_PROCESSED", "MEDIA_BUFFERING_COMPLETED"):
        return kind, {"correlation_id": rest}
    fields: dict[str, Any] = {}
    while rest:
        token, _, tail = rest.partition(" ")
        key, colon, value = token.partition(":")
        if key == "error_text" and colon:
            fields[key] = rest[len("error_text:") :]
            break
        if colon and key:
            fields[key] = value
        rest = tail.strip()
    return kind, fields


def _text(fields: Mapping[str, Any], key: str) -> str | None:
    return call.text_field(fields, key)


def _positive_int(value: object) -> int | None:
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 8:
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 20:
        return value
    return None


def _lookup(variables: Mapping[str, str], names: Sequence[str]) -> str | None:
    folded = {key.upper(): value for key, value in variables.items() if value}
    for name in names:
        value = folded.get(name.upper())
        if value:
            return value
    return None


class AsteriskSpec(call.CarrierSpec[CarrierSettings]):
    """Asterisk ``chan_websocket``: dialled by the dialplan, no webhook or signature; ``HANGUP`` ends a call in-band."""

    name = "asterisk"
    title = "Asterisk"
    wire_class = AsteriskCarrier
    #: chan_websocket asks for the "media" subprotocol.
    subprotocols = frozenset({"media"})


SPEC = AsteriskSpec()
