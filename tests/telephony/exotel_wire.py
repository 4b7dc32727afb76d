"""Exotel's side of a Voicebot stream, in the message shapes of Exotel's AgentStream docs."""

from __future__ import annotations

import base64
import json

from tests.telephony.phone import Out

STREAM_SID = "MZ4f2a7c9e0b1d3f5a6c8e0a2b4d6f8a1c"
CALL_SID = "CA9b8c7d6e5f4a3b2c1d0e9f8a7b6c5d4e"
ACCOUNT_SID = "AC1e2d3c4b5a69788796a5b4c3d2e1f0a9"
CALLER = "+919876543210"
CALLEE = "+918012345678"

#: Exotel's rules for the media it is sent: 3.2 KB to 100 KB, whole multiples of 320 bytes.
MIN_BYTES, MAX_BYTES, MULTIPLE = 3_200, 100_000, 320


class ExotelWire:
    """Exotel's messages; every media frame the gateway sends is checked against Exotel's chunk rules."""

    echoes_marks_on_clear = False  # Exotel does not document echoing marks on a clear

    def __init__(self, rate: int = 8_000, parameters: dict[str, str] | None = None) -> None:
        self.rate = rate
        self.bytes_per_second = 2 * rate
        self.frame_bytes = self.bytes_per_second // 10  # Exotel streams 100 ms frames
        self.parameters = parameters or {}
        #: What the gateway sent that Exotel would not take, in words (the Phone's reader must not raise).
        self.problems: list[str] = []
        self._seq = 0

    def _next(self) -> str:
        self._seq += 1
        return str(self._seq)

    def connected(self) -> str:
        return json.dumps({"event": "connected"})

    def start(self) -> str:
        return json.dumps(
            {
                "event": "start",
                "sequence_number": self._next(),
                "stream_sid": STREAM_SID,
                "start": {
                    "stream_sid": STREAM_SID,
                    "call_sid": CALL_SID,
                    "account_sid": ACCOUNT_SID,
                    "from": CALLER,
                    "to": CALLEE,
                    "custom_parameters": self.parameters,
                    "media_format": {
                        "encoding": "audio/x-raw",
                        "sample_rate": str(self.rate),
                        "bit_rate": "16",
                    },
                },
            }
        )

    def greeting(self) -> list[str | bytes]:
        return [self.connected(), self.start()]

    def media(self, audio: bytes, index: int) -> str:
        return json.dumps(
            {
                "event": "media",
                "sequence_number": self._next(),
                "stream_sid": STREAM_SID,
                "media": {
                    "chunk": str(index + 1),
                    "timestamp": str(index * 100),
                    "payload": base64.b64encode(audio).decode(),
                },
            }
        )

    def mark_played(self, name: str) -> str:
        return json.dumps(
            {
                "event": "mark",
                "sequence_number": self._next(),
                "stream_sid": STREAM_SID,
                "mark": {"name": name},
            }
        )

    def cleared(self) -> None:
        return None  # Exotel does not acknowledge a clear

    def dtmf(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequence_number": self._next(),
                "stream_sid": STREAM_SID,
                "dtmf": {"digit": digit, "duration": "100"},
            }
        )

    def stop(self) -> str:
        return json.dumps(
            {
                "event": "stop",
                "sequence_number": self._next(),
                "stream_sid": STREAM_SID,
                "stop": {"call_sid": CALL_SID, "account_sid": ACCOUNT_SID, "reason": "callended"},
            }
        )

    def parse(self, frame: str | bytes) -> Out:
        if not isinstance(frame, str):
            self.problems.append("a binary frame (Exotel takes JSON text only)")
            return Out("other", 0.0, raw=frame)
        message = json.loads(frame)
        if message.get("stream_sid") != STREAM_SID:
            self.problems.append(f"a message without the stream's stream_sid: {message}")
        kind = message.get("event")
        if kind == "media":
            if set(message) != {"event", "stream_sid", "media"} or set(message["media"]) != {"payload"}:
                self.problems.append(f"a media message of another shape: {sorted(message)}")
            audio = base64.b64decode(message["media"]["payload"])
            if not MIN_BYTES <= len(audio) <= MAX_BYTES or len(audio) % MULTIPLE:
                self.problems.append(f"a media payload of {len(audio)} bytes")
            return Out("media", 0.0, audio=audio, raw=message)
        if kind == "mark":
            if set(message) != {"event", "stream_sid", "mark"}:
                self.problems.append(f"a mark message of another shape: {sorted(message)}")
            return Out("mark", 0.0, name=message["mark"]["name"], raw=message)
        if kind == "clear":
            if set(message) != {"event", "stream_sid"}:
                self.problems.append(f"a clear message of another shape: {sorted(message)}")
            return Out("clear", 0.0, raw=message)
        self.problems.append(f"an event Exotel does not take: {kind!r}")
        return Out("other", 0.0, raw=message)
