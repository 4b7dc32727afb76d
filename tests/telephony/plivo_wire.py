"""Plivo's side of an audio stream, in the message shapes of Plivo's audio streaming docs.

Audio is passed as Plivo carries it: μ-law bytes, or L16 as little-endian PCM16.
Plivo answers a ``checkpoint`` with ``playedStream`` only once the audio before it
has played; a ``clearAudio`` drops the checkpoints it holds without a word about
them and is answered by ``clearedAudio``. There is no ``stop``: the socket closes.
"""

from __future__ import annotations

import base64
import json
import time

from tests.telephony.phone import Out

CALL_ID = "1234c52c-1e8d-4a3b-8c7e-2f0f3a9d6b11"
STREAM_ID = "8765b1c2-4d3e-4f5a-9b8c-7d6e5f4a3b2c"
ACCOUNT_ID = "MAXXXXXXXXXXXXXXXXXX"
EXTRA_HEADERS = "userId=12345;sessionId=abc;from=14155550100;to=14155550199"

_CONTENT = {"mulaw": ("audio/x-mulaw", 1), "l16": ("audio/x-l16", 2)}


class PlivoWire:
    echoes_marks_on_clear = False

    def __init__(
        self, encoding: str = "mulaw", rate: int = 8_000, extra_headers: str = EXTRA_HEADERS
    ) -> None:
        self.content_type, width = _CONTENT[encoding]
        self.rate = rate
        self.extra_headers = extra_headers
        self.bytes_per_second = rate * width
        self.frame_bytes = self.bytes_per_second // 50  # 20 ms frames
        #: Every playedStream sent to the gateway, with when.
        self.echoed: list[tuple[str, float]] = []
        #: When the phone answered a clearAudio with clearedAudio.
        self.cleared_at: list[float] = []
        self._seq = 0
        self._chunk = 0

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    def start(self) -> dict[str, object]:
        return {
            "event": "start",
            "sequenceNumber": self._next(),
            "start": {
                "callId": CALL_ID,
                "streamId": STREAM_ID,
                "accountId": ACCOUNT_ID,
                "tracks": ["inbound"],
                "mediaFormat": {"encoding": self.content_type, "sampleRate": self.rate},
            },
            "extra_headers": self.extra_headers,
        }

    def greeting(self) -> list[str | bytes]:
        return [json.dumps(self.start())]  # Plivo has no greeting before its start

    def media(self, audio: bytes, index: int) -> str:
        self._chunk += 1  # counted over the whole stream (index restarts with each utterance)
        return json.dumps(
            {
                "event": "media",
                "sequenceNumber": self._next(),
                "streamId": STREAM_ID,
                "media": {
                    "track": "inbound",
                    "timestamp": str(index * 20),
                    "chunk": self._chunk,
                    "payload": base64.b64encode(audio).decode(),
                },
                "extra_headers": self.extra_headers,
            }
        )

    def mark_played(self, name: str) -> str:
        self.echoed.append((name, time.monotonic()))
        return json.dumps(
            {"event": "playedStream", "sequenceNumber": self._next(), "streamId": STREAM_ID, "name": name}
        )

    def cleared(self) -> str:
        self.cleared_at.append(time.monotonic())
        return json.dumps({"event": "clearedAudio", "sequenceNumber": self._next(), "streamId": STREAM_ID})

    def dtmf(self, digit: str) -> str:
        return json.dumps(
            {
                "event": "dtmf",
                "sequenceNumber": self._next(),
                "streamId": STREAM_ID,
                "dtmf": {"track": "inbound", "digit": digit, "timestamp": "3120"},
            }
        )

    def stop(self) -> None:
        return None  # Plivo just closes the socket

    def parse(self, frame: str | bytes) -> Out:
        assert isinstance(frame, str), "Plivo takes JSON text only"
        message = json.loads(frame)
        kind = message["event"]
        assert message.get("streamId") == STREAM_ID, message
        if kind == "playAudio":
            assert set(message) == {"event", "streamId", "media"}, message
            media = message["media"]
            assert set(media) == {"contentType", "sampleRate", "payload"}, media
            assert (media["contentType"], media["sampleRate"]) == (self.content_type, self.rate), media
            return Out("media", 0.0, audio=base64.b64decode(media["payload"]), raw=message)
        if kind == "checkpoint":
            assert set(message) == {"event", "streamId", "name"}, message
            return Out("mark", 0.0, name=message["name"], raw=message)
        if kind == "clearAudio":
            assert set(message) == {"event", "streamId"}, message
            return Out("clear", 0.0, raw=message)
        return Out("other", 0.0, raw=message)
