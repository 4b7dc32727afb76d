"""WebSocket messages as every layer names them, and the part of a socket the gateway uses.

The dialects and carriers translate frames without touching a socket, so the type lives here rather
than beside the socket code in :mod:`duplex_gateway.host.transport`.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any, Protocol

__all__ = ["Frame", "Socket", "frame_size"]

#: A WebSocket message: text (JSON dialects) or binary (carriers' raw audio).
Frame = str | bytes


class Socket(Protocol):
    """The part of a WebSocket the gateway uses (Starlette's fits)."""

    async def receive(self) -> MutableMapping[str, Any]: ...
    async def send_text(self, data: str) -> None: ...
    async def close(self, code: int = 1000, reason: str | None = None) -> None: ...


def frame_size(frame: Frame) -> int:
    """Bytes of a message (a text one's UTF-8, counted without encoding it when it is ASCII)."""
    if isinstance(frame, str):
        return len(frame) if frame.isascii() else len(frame.encode())
    return len(frame)
