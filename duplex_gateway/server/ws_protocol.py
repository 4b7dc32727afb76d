"""uvicorn's WebSocket protocol, except that a connection whose client reads nothing is dropped.

It also offers the app its connection for a direct socket (:mod:`duplex_gateway.server.direct_socket`).

uvicorn ends a WebSocket's TCP connection with ``transport.close()``, which first writes out
everything still buffered. A client that stopped reading never lets that happen: as long as
its kernel answers TCP's window probes, the connection (a file descriptor, uvicorn's write
buffer, the kernel's buffers) stays open for good, long after its session ended. Holding a
server's sockets that way costs a client nothing.

So once the app is done with a connection, what is left gets a deadline to go out: the close
frame uvicorn's close timeout (10 s) to be answered, as before; a connection the app could not
even queue its close on (a stalled client, see ``limits.send_timeout_s``) ``grace_s``. A
connection that still has bytes it could not write then is aborted (a TCP reset), not closed.
A client that takes what it was sent within that time gets all of it, and the close.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.http11 import Request

from duplex_gateway.server.direct_socket import EXTENSION

__all__ = ["stuck_client_protocol"]


def stuck_client_protocol(grace_s: float) -> type[WebSocketsSansIOProtocol]:
    """uvicorn's sans-I/O WebSocket protocol that drops, after ``grace_s``, a client reading nothing."""

    class DropStuckClients(WebSocketsSansIOProtocol):
        def handle_connect(self, event: Request) -> None:
            super().handle_connect(event)
            scope = getattr(self, "scope", None)
            if scope is not None:  # an upgrade accepted: the app's task starts after this returns
                scope["extensions"][EXTENSION] = self

        async def send(self, message: Any) -> None:
            await super().send(message)
            if message["type"] == "websocket.close" and self.close_timer is not None:
                # uvicorn would close gracefully when the client does not answer the close in
                # time: behind unread bytes that waits for ever.
                self.close_timer.cancel()
                self.close_timer = self.loop.call_later(self.close_timeout, self._close_or_drop)

        async def run_asgi(self) -> None:
            await super().run_asgi()
            if self.close_timer is None and not self.disconnected:
                # The app is done without a close on the wire; uvicorn closed the transport,
                # which is gone once its buffer is written, if ever.
                self.loop.call_later(grace_s, self._drop_if_stuck)

        def _close_or_drop(self) -> None:
            self.close_timer = None
            if self.transport.get_write_buffer_size() > 0:
                self.transport.abort()
            else:
                self.transport.close()

        def _drop_if_stuck(self) -> None:
            if not self.disconnected and self.transport.get_write_buffer_size() > 0:
                self.transport.abort()

    return DropStuckClients
