"""Twilio Media Streams, bidirectional (``<Connect><Stream>``).

JSON text frames; audio is base64 μ-law at 8 kHz both ways. Twilio echoes a mark
once the audio sent before it has played, and on ``clear`` echoes every pending
mark at once (the playout's clear epoch tells those apart). ``sequenceNumber``,
``chunk`` and ``timestamp`` are strings.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any, ClassVar

from duplex_gateway.audio.format import AudioFormat, Encoding
from duplex_gateway.errors import ErrorCode, ProtocolError
from duplex_gateway.telephony import carrier as call
from duplex_gateway.transport import Frame

__all__ = ["MULAW_8K", "TwilioCarrier"]

MULAW_8K = AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)


class TwilioCarrier:
    """One Twilio media stream."""

    name: ClassVar[str] = "twilio"
    framing = call.Framing(chunk_ms=40)
    has_marks = True

    def __init__(self) -> None:
        self.stream_sid: str | None = None

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A Twilio start: ``start.streamSid`` and ``start.callSid``."""
        message = call.peek_json(frame)
        start = message.get("start") if message else None
        return isinstance(start, dict) and "streamSid" in start and "callSid" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Twilio")
        kind = message.get("event")
        if kind == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise call.bad_message("a Twilio media message has no 'media' object")
            track = media.get("track", "inbound")
            if track not in ("inbound", "inbound_track"):
                return []  # only the caller's side is the caller
            return [call.CallAudio(call.media_payload(media, "Twilio"))]
        if kind == "start":
            return [self._start(message)]
        if kind == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            return [call.MarkPlayed(name)] if isinstance(name, str) and name else []
        if kind == "dtmf":
            dtmf = message.get("dtmf")
            digit = dtmf.get("digit") if isinstance(dtmf, dict) else None
            return [call.Dtmf(digit)] if isinstance(digit, str) and digit else []
        if kind == "stop":
            return [call.CallEnded("stop")]
        if kind == "connected":
            return []
        raise call.bad_message(f"unknown Twilio event {str(kind)[:64]!r}")

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("a Twilio start message has no 'start' object")
        self.stream_sid = call.text_field(start, "streamSid") or call.text_field(message, "streamSid")
        if self.stream_sid is None:
            raise call.bad_message("a Twilio start message names no streamSid")
        fmt = start.get("mediaFormat")
        if isinstance(fmt, dict) and fmt.get("encoding") not in (None, "audio/x-mulaw"):
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"Twilio media format {fmt.get('encoding')!r} is not audio/x-mulaw"
            )
        params = start.get("customParameters")
        parameters = {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "callSid"),
            stream_id=self.stream_sid,
            # Twilio passes the numbers only as the TwiML's <Parameter>s (the gateway's webhook adds them).
            caller=parameters.get("from") or parameters.get("From"),
            callee=parameters.get("to") or parameters.get("To"),
            parameters=parameters,
            input_format=MULAW_8K,
            output_format=MULAW_8K,
        )

    def media(self, audio: bytes) -> Sequence[Frame]:
        payload = base64.b64encode(audio).decode("ascii")
        return [call.dump({"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}})]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clear", "streamSid": self.stream_sid})

    def hangup(self) -> Frame | None:
        return None  # closing the stream ends a <Connect><Stream> call

