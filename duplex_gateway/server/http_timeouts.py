"""A time limit on each HTTP request's head, and so on every WebSocket handshake.

uvicorn waits for a request's head for as long as the client takes: a client that
connects and sends half a handshake (or nothing) holds its socket for good, and a few
thousand such clients use up the process's file descriptors while holding no session
a limit would count. :func:`head_timeout_protocol` is uvicorn's own HTTP protocol with
one change: the head (request line and headers) must be complete within a deadline,
counted from the connection (or, on a kept-alive connection, from the next request's
first byte); past it the connection is closed. Bodies, responses and WebSockets after
the upgrade are untouched (the WebSocket layer has its own keepalive).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["head_timeout_protocol"]


class _HeadTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is late."""

    head_timeout_s: float = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._head_timer is None:  # the next request on a kept-alive connection
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._head_timer = self.loop.call_later(self.head_timeout_s, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        transport: Any = self.transport
        if not transport.is_closing():
            transport.close()


def head_timeout_protocol(seconds: float) -> type[Any]:
    """uvicorn's HTTP protocol (``Config(http=...)``) with ``seconds`` for each request head."""
    return type("HeadTimeoutProtocol", (_HeadTimeoutProtocol,), {"head_timeout_s": float(seconds)})
