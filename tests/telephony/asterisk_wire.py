"""Asterisk ``chan_websocket``'s side of a call, in the shapes its source writes and reads.

Binary frames are raw audio in the channel's codec; control messages are text, plain
(``MEDIA_START connection_id:... format:ulaw ...``) or JSON (``f(json)``). Asterisk
parses the commands it gets in its own format only and ignores any over 128 bytes;
it re-frames binary audio into ``optimal_frame_size`` pieces and drops a partial one,
and ``FLUSH_MEDIA`` frees pending marks without a word.
"""

from __future__ import annotations

import json
from typing import Any

from tests.telephony.phone import Out

CONNECTION_ID = "media_connection1"
CHANNEL = "WebSocket/media_connection1/0x7f3a1c002b50"
CHANNEL_ID = "1761245643.1"
MAX_COMMAND_BYTES = 128


class AsteriskWire:
    bytes_per_second = 8000
    echoes_marks_on_clear = False

    def __init__(
        self,
        *,
        json_format: bool = False,
        codec: str = "ulaw",
        optimal_frame_size: int = 160,
        variables: dict[str, str] | None = None,
    ) -> None:
        self.json_format = json_format
        self.codec = codec
        self.optimal_frame_size = optimal_frame_size
        self.frame_bytes = optimal_frame_size  # 20 ms of μ-law at 8 kHz
        self.variables = variables or {}
        #: Every command the gateway sent, as Asterisk parsed it: (command, argument).
        self.commands: list[tuple[str, str | None]] = []

    def _event(self, event: str, plain: str, **fields: Any) -> str:
        if self.json_format:
            return json.dumps({"event": event, "channel_id": CHANNEL_ID, **fields}, separators=(",", ":"))
        return plain

    def greeting(self) -> list[str | bytes]:
        if self.json_format:
            start = {
                "event": "MEDIA_START",
                "connection_id": CONNECTION_ID,
                "channel": CHANNEL,
                "channel_id": CHANNEL_ID,
                "format": self.codec,
                "optimal_frame_size": self.optimal_frame_size,
                "ptime": 20,
                "channel_variables": {"MEDIA_WEBSOCKET_CONNECTION_ID": CONNECTION_ID, **self.variables},
            }
            return [json.dumps(start, separators=(",", ":"))]
        start_line = (
            f"MEDIA_START connection_id:{CONNECTION_ID} channel:{CHANNEL} channel_id:{CHANNEL_ID} "
            f"format:{self.codec} optimal_frame_size:{self.optimal_frame_size} ptime:20"
        )
        return [start_line]

    def media(self, audio: bytes, index: int) -> bytes:
        return audio

    def mark_played(self, name: str) -> str:
        return self._event("MEDIA_MARK_PROCESSED", f"MEDIA_MARK_PROCESSED {name}", correlation_id=name)

    def cleared(self) -> None:
        return None  # FLUSH_MEDIA is not acknowledged

    def dtmf(self, digit: str) -> str:
        return self._event("DTMF_END", f"DTMF_END digit:{digit} channel_id:{CHANNEL_ID}", digit=digit)

    def xoff(self) -> str:
        return self._event("MEDIA_XOFF", "MEDIA_XOFF")

    def xon(self) -> str:
        return self._event("MEDIA_XON", "MEDIA_XON")

    def stop(self) -> None:
        return None  # the channel hangs up by closing the socket

    def parse(self, frame: str | bytes) -> Out:
        if isinstance(frame, bytes):
            assert frame and len(frame) % self.optimal_frame_size == 0, (
                f"{len(frame)} bytes is not a whole number of {self.optimal_frame_size}-byte frames"
            )
            return Out("media", 0.0, audio=frame, raw=len(frame))
        assert len(frame.encode()) <= MAX_COMMAND_BYTES, f"Asterisk ignores a command this long: {frame!r}"
        if self.json_format:
            message = json.loads(frame)
            assert isinstance(message, dict) and isinstance(message.get("command"), str), frame
            command, argument = message["command"], message.get("correlation_id")
        else:
            assert not frame.lstrip().startswith("{"), f"a plain-text channel got JSON: {frame!r}"
            command, _, rest = frame.strip().partition(" ")
            argument = rest or None
        self.commands.append((command, argument))
        if command == "MARK_MEDIA":
            assert argument, frame
            return Out("mark", 0.0, name=argument, raw=frame)
        if command == "FLUSH_MEDIA":
            return Out("clear", 0.0, raw=frame)
        if command == "HANGUP":
            return Out("hangup", 0.0, raw=frame)
        return Out("other", 0.0, raw=frame)
