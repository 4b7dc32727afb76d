"""Plivo audio streams, bidirectional (``<Stream bidirectional="true">``).

JSON text frames in camelCase; ``sequenceNumber`` is a number. Audio is base64 in the
``<Stream contentType>`` of the call, both ways: ``audio/x-l16`` at 8 or 16 kHz (the
default, 8 kHz) or ``audio/x-mulaw`` at 8 kHz. Reply audio goes out as ``playAudio``;
a ``checkpoint`` is the mark, answered by ``playedStream`` only once the audio before
it has played. ``clearAudio`` drops the audio Plivo holds and is answered by
``clearedAudio``; the checkpoints it dropped are never answered. Plivo sends no
``stop``: the socket just closes, and the gateway ends the session on disconnect.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from duplex_gateway.audio.format import AudioFormat, Encoding
from duplex_gateway.errors import ErrorCode, ProtocolError
from duplex_gateway.telephony import carrier as call
from duplex_gateway.transport import Frame

__all__ = ["L16_RATES", "PlivoCarrier", "extra_headers"]

#: Rates Plivo streams ``audio/x-l16`` at; μ-law is 8 kHz only.
L16_RATES = (8_000, 16_000)
_L16 = "audio/x-l16"
_MULAW = "audio/x-mulaw"


class PlivoCarrier:
    """One Plivo audio stream."""

    name: ClassVar[str] = "plivo"
    framing = call.Framing(chunk_ms=40)
    has_marks = True

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self.format: AudioFormat | None = None

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A Plivo start: ``start.streamId`` and ``start.callId``."""
        message = call.peek_json(frame)
        start = message.get("start") if message else None
        return isinstance(start, dict) and "streamId" in start and "callId" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Plivo")
        kind = message.get("event")
        if kind == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise call.bad_message("a Plivo media message has no 'media' object")
            if media.get("track", "inbound") not in ("inbound", "inbound_track"):
                return []  # only the caller's side is the caller
            return [call.CallAudio(self._payload(media))]
        if kind == "start":
            return [self._start(message)]
        if kind == "playedStream":
            return [call.MarkPlayed(_text(message, "name", "playedStream"))]
        if kind == "clearedAudio":
            return [call.CarrierCleared()]
        if kind == "dtmf":
            dtmf = message.get("dtmf")
            return [call.Dtmf(_text(dtmf if isinstance(dtmf, dict) else {}, "digit", "dtmf"))]
        if kind == "stop":
            return [call.CallEnded("stop")]  # not documented, but a stream that says so has ended
        raise call.bad_message(f"unknown Plivo event {str(kind)[:64]!r}")

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("a Plivo start message has no 'start' object")
        self.stream_id = call.text_field(start, "streamId") or call.text_field(message, "streamId")
        if self.stream_id is None:
            raise call.bad_message("a Plivo start message names no streamId")
        # A format the gateway cannot take raises UNSUPPORTED_*: the call dialect ends such a call.
        self.format = _format(start.get("mediaFormat") or {})
        raw = message.get("extra_headers", start.get("extra_headers"))
        if isinstance(raw, dict):
            parameters = {str(k): str(v) for k, v in raw.items() if v is not None}
        else:
            parameters = extra_headers(raw) if isinstance(raw, str) else {}
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "callId"),
            stream_id=self.stream_id,
            # Plivo passes the numbers only as the <Stream>'s extraHeaders (the gateway's webhook adds them).
            caller=_first(parameters, "from", "From", "caller"),
            callee=_first(parameters, "to", "To", "callee"),
            parameters=parameters,
            input_format=self.format,
            output_format=self.format,
        )

    def _payload(self, media: dict[str, Any]) -> bytes:
        audio = call.media_payload(media, "Plivo")
        if self.format is not None and len(audio) % self.format.encoding.bytes_per_sample:
            raise call.bad_message(f"a Plivo media payload of {len(audio)} bytes is not whole samples")
        return audio

    def media(self, audio: bytes) -> Sequence[Frame]:
        fmt = self.format or AudioFormat(encoding=Encoding.PCM16, rate=8_000)
        return [
            call.dump(
                {
                    "event": "playAudio",
                    "streamId": self.stream_id,
                    "media": {
                        "contentType": _MULAW if fmt.encoding is Encoding.G711_ULAW else _L16,
                        "sampleRate": fmt.rate,
                        "payload": base64.b64encode(audio).decode("ascii"),
                    },
                }
            )
        ]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "checkpoint", "streamId": self.stream_id, "name": name})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clearAudio", "streamId": self.stream_id})

    def hangup(self) -> Frame | None:
        return (
            None  # closing the stream ends it (with keepCallAlive, the answer XML goes on or the call ends)
        )


def extra_headers(raw: str) -> dict[str, str]:
    """``extra_headers`` as parameters: ``"k=v;k2=v2"`` (what ``<Stream extraHeaders>`` carries).

    Plivo's examples separate the pairs with ``;`` on the socket and ``,`` in the XML
    attribute; both are taken (keys and values are letters and digits only, so neither
    can be part of one)."""
    text = raw.strip()
    if text.startswith("{"):
        # Some Plivo deployments write an (often empty) JSON object instead.
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    parameters: dict[str, str] = {}
    for pair in re.split("[;,]", text):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            parameters[key.strip()] = value.strip()
    return parameters


def _format(fmt: Any) -> AudioFormat:
    if not isinstance(fmt, dict):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "a Plivo start's mediaFormat is not an object"
        )
    # L16 byte order: little-endian, taken and sent as the session's PCM16 unchanged. Plivo
    # documents audio/x-l16 as raw 16-bit linear PCM, not as an RTP L16 payload (which would
    # be big-endian, as Telnyx's is), and public Plivo integrations pass it through as
    # little-endian PCM16 both ways. A live call with the wrong order sounds like loud noise.
    raw = call.text_field(fmt, "encoding") or _L16
    mime, _, rest = raw.partition(";")
    encoding = mime.strip().lower()
    rate = _rate(fmt.get("sampleRate"), rest)
    if encoding == _MULAW:
        if rate not in (None, 8_000):
            raise ProtocolError(ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Plivo {_MULAW} at {rate} Hz: 8000 only")
        return AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)
    if encoding == _L16:
        rate = rate or 8_000
        if rate not in L16_RATES:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Plivo {_L16} at {rate} Hz: 8000 or 16000 only"
            )
        return AudioFormat(encoding=Encoding.PCM16, rate=rate)
    raise ProtocolError(
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        f"Plivo encoding {raw[:48]!r} is not {_L16} or {_MULAW} (the <Stream contentType>)",
    )


def _rate(value: Any, params: str) -> int | None:
    """``mediaFormat.sampleRate``, else a ``;rate=`` in the encoding; None when neither says."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if value is not None:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"a Plivo sampleRate is not a number: {str(value)[:32]!r}"
        )
    for part in params.split(";"):
        key, _, text = part.partition("=")
        if key.strip().lower() == "rate" and text.strip().isdigit():
            return int(text)
    return None


def _text(obj: Mapping[str, Any], key: str, kind: str) -> str:
    value = call.text_field(obj, key)  # a digit written as a number is still the digit
    if value is None:
        raise call.bad_message(f"a Plivo {kind} message has no {key}")
    return value


def _first(parameters: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        if parameters.get(key):
            return parameters[key]
    return None
