"""Exotel Voicebot applet (bidirectional AgentStream).

JSON text frames in snake_case; ``sequence_number``, ``chunk``, ``timestamp`` and
``media_format.sample_rate`` are strings. Audio is base64 raw PCM16 little-endian
(``audio/x-raw``) at the rate the applet URL asks for (``?sample-rate=8000|16000|24000``),
both ways. Exotel plays reply audio well only in pieces of 3.2 KB to 100 KB that are
a whole multiple of 320 bytes: a shorter tail makes it wait and leaves a gap, so
the framing below has the playout cut and pad every piece to those rules. Marks are
echoed once the audio before them has played; the stream ends with ``stop``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from duplex_gateway.dialects import wire_codec
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.control import CarrierSettings
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["EXOTEL_RATES", "MAX_MEDIA_BYTES", "MEDIA_MULTIPLE", "MIN_MEDIA_BYTES", "SPEC", "ExotelCarrier"]

#: The sample rates the Voicebot applet streams at (8 kHz unless its URL asks for more).
EXOTEL_RATES = (8_000, 16_000, 24_000)
#: Exotel's outbound media rules: at least 3.2 KB, at most 100 KB, whole multiples of 320 bytes.
MIN_MEDIA_BYTES = 3_200
MAX_MEDIA_BYTES = 100_000
MEDIA_MULTIPLE = 320
#: ``media_format.encoding`` values that mean raw PCM16LE (``audio/x-raw`` is what Exotel writes).
_PCM_ENCODINGS = frozenset({"audio/x-raw", "raw", "slin", "audio/l16", "audio/x-l16"})


class ExotelCarrier:
    """One Exotel Voicebot stream."""

    name: ClassVar[str] = "exotel"
    # 100 ms pieces, never under 3.2 KB (so 200 ms at 8 kHz), padded to 320-byte multiples.
    framing = call.Framing(chunk_ms=100, min_bytes=MIN_MEDIA_BYTES, multiple=MEDIA_MULTIPLE)
    has_marks = True

    def __init__(self) -> None:
        self.stream_sid: str | None = None
        self.format: AudioFormat | None = None

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """An Exotel start: ``start.stream_sid`` and ``start.call_sid`` (snake_case, unlike Twilio's)."""
        message = call.peek_json(frame)
        start = message.get("start") if message else None
        return isinstance(start, dict) and "stream_sid" in start and "call_sid" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Exotel")
        kind = message.get("event")
        if kind == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise call.bad_message("an Exotel media message has no 'media' object")
            return [call.CallAudio(call.media_payload(media, "Exotel"))]
        if kind == "start":
            return [self._start(message)]
        if kind == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            return [call.MarkPlayed(name)] if isinstance(name, str) and name else []
        if kind == "dtmf":
            dtmf = message.get("dtmf")
            digit = call.text_field(dtmf, "digit") if isinstance(dtmf, dict) else None
            return [call.Dtmf(digit)] if digit else []
        if kind == "stop":
            stop = message.get("stop")
            reason = call.text_field(stop, "reason") if isinstance(stop, dict) else None
            # The reason ("callended", "stopped") ends up in the session's close reason: keep it short.
            return [call.CallEnded((reason or "stop")[:32])]
        if kind == "connected":
            return []
        raise call.bad_message(f"unknown Exotel event {str(kind)[:64]!r}")

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("an Exotel start message has no 'start' object")
        self.stream_sid = call.text_field(start, "stream_sid") or call.text_field(message, "stream_sid")
        if self.stream_sid is None:
            raise call.bad_message("an Exotel start message names no stream_sid")
        self.format = _format(start.get("media_format"))
        params = start.get("custom_parameters")
        parameters = {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "call_sid"),
            stream_id=self.stream_sid,
            caller=call.text_field(start, "from"),
            callee=call.text_field(start, "to"),
            parameters=parameters,
            input_format=self.format,
            output_format=self.format,
        )

    def media(self, audio: bytes) -> Sequence[Frame]:
        # One frame per piece: the playout cuts pieces of the framing above (3.2 to 4.8 KB), far
        # under Exotel's 100 KB maximum, so they need no further cutting here.
        payload = wire_codec.b64encode(audio)
        return [call.dump({"event": "media", "stream_sid": self.stream_sid, "media": {"payload": payload}})]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "mark", "stream_sid": self.stream_sid, "mark": {"name": name}})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clear", "stream_sid": self.stream_sid})

    def hangup(self) -> Frame | None:
        return None  # closing the socket ends the applet; the call flow goes on to the next one


def _format(media_format: object) -> AudioFormat:
    """The stream's audio format from ``start.media_format`` (absent: Exotel's default, PCM16 at 8 kHz)."""
    if media_format is None:
        return AudioFormat(encoding=Encoding.PCM16, rate=EXOTEL_RATES[0])
    if not isinstance(media_format, dict):
        raise call.bad_message("an Exotel start's 'media_format' is not an object")
    encoding = media_format.get("encoding")
    if encoding is not None and str(encoding).lower() not in _PCM_ENCODINGS:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            f"Exotel media format {str(encoding)[:64]!r} is not audio/x-raw",
        )
    rate_text = call.text_field(media_format, "sample_rate")
    try:
        rate = int(float(rate_text)) if rate_text is not None else EXOTEL_RATES[0]
    except (ValueError, OverflowError):  # "abc", "nan", "inf"
        rate = 0
    if rate not in EXOTEL_RATES:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"Exotel sample rate {str(rate_text)[:16]!r} is not 8000, 16000 or 24000",
        )
    return AudioFormat(encoding=Encoding.PCM16, rate=rate)


class ExotelSpec(call.CarrierSpec[CarrierSettings]):
    """Exotel: the Voicebot applet's stream; no answer webhook, no signature, no REST hang-up (closing the stream ends the call)."""

    name = "exotel"
    title = "Exotel"
    wire_class = ExotelCarrier


SPEC = ExotelSpec()
