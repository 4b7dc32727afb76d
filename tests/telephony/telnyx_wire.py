"""Telnyx's side of a media stream, in the message shapes of Telnyx's media streaming docs.

Audio is passed as the RTP payload Telnyx carries: μ-law or A-law bytes, or L16 in
network byte order (big-endian). Telnyx echoes a mark once the audio before it has
played and, on a ``clear``, echoes every queued mark at once; it does not answer the
clear itself. Outbound messages carry no stream id.
"""

from __future__ import annotations

import base64
import json
import time

from tests.telephony.phone import Out

STREAM_ID = "32DE0DEA-53CB-4B21-89A4-9E1819C043BC"
CALL_CONTROL_ID = "v3:T02llQxIyaRkhfRKxgAP8nY511EhFLizdvdUKJiSw8d6A9BborherQ"
CALL_SESSION_ID = "ff55a038-6f5d-11ef-9692-02420aeffb1f"
USER_ID = "3E6F995F-85F7-4705-9741-53B116D28237"
CALLER = "+13122010094"
CALLEE = "+13122123456"
CLIENT_STATE = "aGF2ZSBhIG5pY2UgZGF5ID1d"

#: Bytes per sample of each encoding on the wire.
_WIDTH = {"PCMU": 1, "PCMA": 1, "L16": 2}


class TelnyxWire:
    echoes_marks_on_clear = True

    def __init__(
        self, encoding: str = "PCMU", rate: int = 8_000, parameters: dict[str, str] | None = None
    ) -> None:
        self.encoding = encoding
        self.rate = rate
        self.parameters = parameters if parameters is not None else {"customer_id": "customer_123"}
        self.bytes_per_second = rate * _WIDTH[encoding]
        self.frame_bytes = self.bytes_per_second // 50  # 20 ms RTP packets
        #: Every mark echoed to the gateway, with when (played, or returned by a clear).
        self.echoed: list[tuple[str, float]] = []
        self._seq = 0
        self._chunks: dict[str, int] = {}

    def _next(self) -> str:
        self._seq += 1
        return str(self._seq)

    def start(self) -> dict[str, object]:
        return {
            "event": "start",
            "sequence_number": self._next(),
            "start": {
                "user_id": USER_ID,
                "call_control_id": CALL_CONTROL_ID,
                "call_session_id": CALL_SESSION_ID,
                "from": CALLER,
                "to": CALLEE,
                "tags": ["TAG1", "TAG2"],
                "client_state": CLIENT_STATE,
                "custom_parameters": self.parameters,
                "media_format": {"encoding": self.encoding, "sample_rate": self.rate, "channels": 1},
            },
            "stream_id": STREAM_ID,
        }

    def greeting(self) -> list[str | bytes]:
        return [json.dumps({"event": "connected", "version": "1.0.0"}), json.dumps(self.start())]

    def media(self, audio: bytes, index: int, track: str = "inbound") -> str:
        # media.chunk counts a track's frames over the whole stream (index restarts with each utterance).
        self._chunks[track] = chunk = self._chunks.get(track, 0) + 1
        return json.dumps(
            {
                "event": "media",
                "sequence_number": self._next(),
                "media": {
                    "track": track,
                    "chunk": str(chunk),
                    "timestamp": str(index * 20),
                    "payload": base64.b64encode(audio).decode(),
                },
                "stream_id": STREAM_ID,
            }
        )

    def mark_played(self, name: str) -> str:
        self.echoed.append((name, time.monotonic()))
        return json.dumps(
            {"event": "mark", "sequence_number": self._next(), "stream_id": STREAM_ID, "mark": {"name": name}}
        )

    def cleared(self) -> None:
        return None  # Telnyx answers a clear only by returning the queued marks

    def dtmf(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "stream_id": STREAM_ID,
                "occurred_at": "2025-06-05T08:54:19.698408Z",
                "sequence_number": self._next(),
                "dtmf": {"digit": digit},
            }
        )

    def error(
        self, code: str = "100005", title: str = "rate_limit_reached", detail: str = "Too many requests"
    ) -> str:
        return json.dumps(
            {
                "event": "error",
                "sequence_number": self._next(),
                "stream_id": STREAM_ID,
                "error": {"title": title, "code": code, "detail": detail},
            }
        )

    def stop(self) -> str:
        return json.dumps(
            {
                "event": "stop",
                "sequence_number": self._next(),
                "stop": {"user_id": USER_ID, "call_control_id": CALL_CONTROL_ID},
                "stream_id": STREAM_ID,
            }
        )

    def parse(self, frame: str | bytes) -> Out:
        assert isinstance(frame, str), "Telnyx takes JSON text only"
        message = json.loads(frame)
        kind = message["event"]
        if kind == "media":
            assert set(message) == {"event", "media"} and set(message["media"]) == {"payload"}, message
            audio = base64.b64decode(message["media"]["payload"])
            # RTP chunks Telnyx plays are 20 ms to 30 s of audio, whole samples.
            assert len(audio) >= self.frame_bytes and len(audio) % _WIDTH[self.encoding] == 0, len(audio)
            return Out("media", 0.0, audio=audio, raw=message)
        if kind == "mark":
            assert set(message) == {"event", "mark"} and set(message["mark"]) == {"name"}, message
            return Out("mark", 0.0, name=message["mark"]["name"], raw=message)
        if kind == "clear":
            assert set(message) == {"event"}, message
            return Out("clear", 0.0, raw=message)
        return Out("other", 0.0, raw=message)
