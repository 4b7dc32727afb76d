"""A session's WebSocket read and written straight through uvicorn's protocol, not message by message through ASGI.

Every caller frame and every reply chunk of a session crosses the socket, and through ASGI each
one is wrapped in a message dictionary, checked by Starlette's ``WebSocket`` state machine and
handed through uvicorn's ``send``, which serializes a frame object with websockets' general
framing. At a few hundred callers that machinery costs more CPU than the session's own work on
the frame. The gateway's WebSocket protocol (:mod:`duplex_gateway.server.ws_protocol`) offers its
connection in the ASGI scope's extensions; :func:`direct_socket` takes it once Starlette has
accepted, and the session reads and writes through it:

* ``receive`` takes uvicorn's receive queue directly (the same messages, the same pause and
  resume of TCP reads, so backpressure is unchanged);
* ``send_text`` and ``send_bytes`` write a whole unmasked frame to the transport themselves when
  no extension is negotiated (permessage-deflate is off by default), after the same checks
  uvicorn makes: wait while the transport's buffer is over its high-water mark, and refuse once
  the client is gone or the close was sent;
* ``write_now`` writes a frame at once, without awaiting, when the transport takes writes: the
  session's writer (:class:`~duplex_gateway.host.transport.Attachment`) calls it when nothing is
  queued before the frame, so a reply chunk costs no task switch while the client keeps up;
* ``close`` goes through uvicorn as before (once per connection, and it keeps the closing
  handshake's timers).

Anything else (a server other than the gateway's own, a test client) keeps Starlette's socket.
"""

from __future__ import annotations

import struct
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any, Final

from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import InvalidState
from websockets.protocol import State

from duplex_gateway.vocabulary.frames import Socket

if TYPE_CHECKING:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

__all__ = ["EXTENSION", "DirectSocket", "direct_socket"]

#: The ASGI scope extension under which the gateway's WebSocket protocol offers its connection.
EXTENSION: Final = "duplex_gateway.direct_socket"

_TEXT: Final = 0x81  # FIN + text opcode
_BINARY: Final = 0x82  # FIN + binary opcode
_LENGTH_16: Final = struct.Struct("!BBH")
_LENGTH_64: Final = struct.Struct("!BBQ")


def frame_header(first: int, length: int) -> bytes:
    """The header of a whole, unmasked frame (a server's) carrying ``length`` bytes (RFC 6455 §5.2)."""
    if length < 126:
        return bytes((first, length))
    if length < 1 << 16:
        return _LENGTH_16.pack(first, 126, length)
    return _LENGTH_64.pack(first, 127, length)


class DirectSocket:
    """One accepted WebSocket, read and written through uvicorn's sans-I/O protocol (see the module)."""

    __slots__ = ("_framing", "_protocol", "_websocket")

    def __init__(self, protocol: WebSocketsSansIOProtocol, websocket: WebSocket) -> None:
        self._protocol = protocol
        self._websocket = websocket
        # Frames are built here only when nothing (deflate) transforms them on the way out.
        self._framing = not protocol.conn.extensions

    async def receive(self) -> MutableMapping[str, Any]:
        """The next ASGI message of the connection: ``websocket.receive`` or ``websocket.disconnect``."""
        return await self._protocol.receive()  # type: ignore[return-value]

    async def send_text(self, data: str) -> None:
        """Send one text message (raises :class:`WebSocketDisconnect` once the client is gone)."""
        await self._send(data)

    async def send_bytes(self, data: bytes) -> None:
        """Send one binary message (raises :class:`WebSocketDisconnect` once the client is gone)."""
        await self._send(data)

    def write_now(self, frame: str | bytes) -> bool:
        """Write ``frame`` now if the connection is open, unpaused and frames are built here; else False.

        False means nothing was written: the caller sends it the awaiting way, which waits for
        the transport or finds the client gone.
        """
        protocol = self._protocol
        if not self._framing or not protocol.writable.is_set() or not self._open():
            return False
        first, payload = (_TEXT, frame.encode()) if isinstance(frame, str) else (_BINARY, frame)
        # One write: the transport copies small frames into its buffer either way.
        protocol.transport.write(frame_header(first, len(payload)) + payload)
        return True

    async def close(self, code: int = 1000, reason: str | None = None) -> None:
        """Close with ``code`` and ``reason`` through uvicorn (its closing handshake and timers)."""
        await self._websocket.close(code, reason)

    def _open(self) -> bool:
        """The checks uvicorn's ``send`` makes: the client is there and no close was sent."""
        protocol = self._protocol
        return not protocol.disconnected and not protocol.close_sent and protocol.conn.state is State.OPEN

    async def _send(self, frame: str | bytes) -> None:
        protocol = self._protocol
        if not protocol.writable.is_set():
            await protocol.writable.wait()
        if not self._open():
            raise WebSocketDisconnect(1006)
        if self.write_now(frame):
            return
        # A negotiated extension (deflate) transforms the frame: websockets' framing makes it.
        conn = protocol.conn
        try:
            if isinstance(frame, str):
                conn.send_text(frame.encode())
            else:
                conn.send_binary(frame)
        except InvalidState as exc:  # the connection is closing
            raise WebSocketDisconnect(1006) from exc
        protocol.transport.write(b"".join(conn.data_to_send()))


def direct_socket(websocket: WebSocket) -> Socket:
    """``websocket``'s direct socket where the server offers one (the gateway's own), else ``websocket``.

    Call it once ``websocket`` is accepted; from then on only the returned socket is used.
    """
    protocol = websocket.scope.get("extensions", {}).get(EXTENSION)
    if protocol is None:
        return websocket
    return DirectSocket(protocol, websocket)
