"""Twilio's side of a media stream, in the message shapes of Twilio's Media Streams docs."""

from __future__ import annotations

import base64
import json

from tests.telephony.phone import Out

STREAM_SID = "MZ18ad3ab5a668481ce02b83e7395059f0"
CALL_SID = "CA8c6bd1d7a2b1e2f3a4b5c6d7e8f90a1b"
ACCOUNT_SID = "AC25e16e9a716a4a1786a7c45f39f8c5a8"


class TwilioWire:
    frame_bytes = 160  # 20 ms of μ-law at 8 kHz
    bytes_per_second = 8000
    echoes_marks_on_clear = True

    def __init__(self, parameters: dict[str, str] | None = None) -> None:
        self.parameters = parameters or {}
        self._seq = 0

    def _next(self) -> str:
        self._seq += 1
        return str(self._seq)

    def greeting(self) -> list[str | bytes]:
        connected = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        start = {
            "event": "start",
            "sequenceNumber": self._next(),
            "start": {
                "accountSid": ACCOUNT_SID,
                "streamSid": STREAM_SID,
                "callSid": CALL_SID,
                "tracks": ["inbound"],
                "customParameters": self.parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            },
            "streamSid": STREAM_SID,
        }
        return [json.dumps(connected), json.dumps(start)]

    def media(self, audio: bytes, index: int) -> str:
        return json.dumps(
            {
                "event": "media",
                "sequenceNumber": self._next(),
                "media": {
                    "track": "inbound",
                    "chunk": str(index + 1),
                    "timestamp": str(index * 20),
                    "payload": base64.b64encode(audio).decode(),
                },
                "streamSid": STREAM_SID,
            }
        )

    def mark_played(self, name: str) -> str:
        return json.dumps(
            {"event": "mark", "sequenceNumber": self._next(), "streamSid": STREAM_SID, "mark": {"name": name}}
        )

    def cleared(self) -> None:
        return None  # Twilio answers a clear only by echoing the pending marks

    def dtmf(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "streamSid": STREAM_SID,
                "sequenceNumber": self._next(),
                "dtmf": {"track": "inbound_track", "digit": digit},
            }
        )

    def stop(self) -> str:
        return json.dumps(
            {
                "event": "stop",
                "sequenceNumber": self._next(),
                "stop": {"accountSid": ACCOUNT_SID, "callSid": CALL_SID},
                "streamSid": STREAM_SID,
            }
        )

    def parse(self, frame: str | bytes) -> Out:
        assert isinstance(frame, str), "Twilio takes JSON text only"
        message = json.loads(frame)
        assert message.get("streamSid") == STREAM_SID, message
        kind = message["event"]
        if kind == "media":
            assert set(message) == {"event", "streamSid", "media"} and set(message["media"]) == {"payload"}
            return Out("media", 0.0, audio=base64.b64decode(message["media"]["payload"]), raw=message)
        if kind == "mark":
            assert set(message) == {"event", "streamSid", "mark"}
            return Out("mark", 0.0, name=message["mark"]["name"], raw=message)
        if kind == "clear":
            assert set(message) == {"event", "streamSid"}
            return Out("clear", 0.0, raw=message)
        return Out("other", 0.0, raw=message)
