"""Vonage's side of a Voice API WebSocket, in the message shapes of Vonage's WebSocket docs.

Audio is binary PCM16 frames of 20 ms at the NCCO's rate; everything else is JSON text.
The NCCO's ``headers`` come back flattened into ``websocket:connected``.
"""

from __future__ import annotations

import json

from tests.telephony.phone import Out

CALL_UUID = "63f61863-4a51-4f6b-86e1-46edebcf9356"
CALLER = "447700900000"
CALLEE = "447700900001"


class VonageWire:
    """Vonage's messages; every audio frame the gateway sends is checked to be a whole 20 ms frame."""

    echoes_marks_on_clear = False  # a clear drops the pending notifies, then Vonage sends websocket:cleared

    def __init__(self, rate: int = 16_000, headers: dict[str, object] | None = None) -> None:
        self.rate = rate
        self.bytes_per_second = 2 * rate
        self.frame_bytes = self.bytes_per_second // 50  # 20 ms frames
        self.headers: dict[str, object] = (
            {"uuid": CALL_UUID, "from": CALLER, "to": CALLEE} if headers is None else headers
        )
        #: What the gateway sent that Vonage would not take, in words (the Phone's reader must not raise).
        self.problems: list[str] = []

    def connected(self) -> str:
        return json.dumps(
            {"event": "websocket:connected", "content-type": f"audio/l16;rate={self.rate}", **self.headers}
        )

    def greeting(self) -> list[str | bytes]:
        return [self.connected()]

    def media(self, audio: bytes, index: int) -> bytes:
        return audio

    def mark_played(self, name: str) -> str:
        return json.dumps({"event": "websocket:notify", "payload": {"mark": name}})

    def cleared(self) -> str:
        return json.dumps({"event": "websocket:cleared"})

    def dtmf(self, digit: str) -> str:
        return json.dumps({"event": "websocket:dtmf", "digit": digit, "duration": 260})

    def stop(self) -> None:
        return None  # Vonage ends a call by closing the socket

    def parse(self, frame: str | bytes) -> Out:
        if isinstance(frame, bytes):
            if len(frame) != self.frame_bytes:
                self.problems.append(f"an audio frame of {len(frame)} bytes, not {self.frame_bytes}")
            return Out("media", 0.0, audio=frame)
        message = json.loads(frame)
        action = message.get("action")
        if action == "notify" and set(message) == {"action", "payload"}:
            return Out("mark", 0.0, name=message["payload"]["mark"], raw=message)
        if action == "clear" and set(message) == {"action"}:
            return Out("clear", 0.0, raw=message)
        self.problems.append(f"a text message Vonage does not take: {message}")
        return Out("other", 0.0, raw=message)
