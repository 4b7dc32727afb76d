"""The floors: the least a Python WebSocket server can do to answer a caller.

A bare server speaking just enough of the Realtime protocol for the bench's
callers: it keeps the appended audio of the current turn, and on
``response.create`` (or a commit with ``response_create``) streams the turn back
in 100 ms chunks paced in real time, as the gateway's ``echo`` engine does;
``response.cancel`` / ``barge_in`` stop the reply with ``response.done``
``cancelled``. No VAD, no resampling, no validation beyond JSON. What the
gateway costs above this is the price of everything it does besides moving
audio.

Two servers run the same session (:class:`FloorSession`):

* ``websockets`` (the ``floor`` target): the library the gateway's own
  WebSocket protocol comes from, with the standard library's JSON and base64.
* ``picows`` (``floor-picows``): a WebSocket server written in Cython, called
  back per frame with no task switch, with orjson and pybase64. Where this one
  stops is where a Python server's own work stops; it needs the bench extra.

Both run on uvloop. ``python -m duplex_gateway.bench.floor --port N [--server picows]``
serves ``WS /v1/realtime`` and ``GET /healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import itertools
import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

__all__ = ["FAST", "STANDARD", "Codec", "FloorSession", "main", "serve", "serve_picows"]

RATE = 24_000
CHUNK_MS = 100
_ids = itertools.count(1)


@dataclasses.dataclass(frozen=True, slots=True)
class Codec:
    """JSON and base64, as a floor server does them."""

    loads: Callable[[str | bytes], Any]
    dumps: Callable[[Any], str]
    b64decode: Callable[[str], bytes]
    b64encode: Callable[[bytes], str]


#: The standard library's.
STANDARD = Codec(
    loads=json.loads,
    dumps=json.dumps,
    b64decode=base64.b64decode,
    b64encode=lambda data: base64.b64encode(data).decode("ascii"),
)


def _fast() -> Codec:
    from duplex_gateway.dialects import wire_codec

    return Codec(wire_codec.loads, wire_codec.dumps, wire_codec.b64decode, wire_codec.b64encode)


#: orjson and pybase64, through the gateway's own wire codec.
FAST = _fast()


class FloorSession:
    """One caller's loopback on one connection, apart from how its frames travel.

    :meth:`receive` handles one message and returns the frames to send at once, in
    order; a reply's audio is sent later, paced, through ``send`` by a task of
    its own.
    """

    def __init__(self, send: Callable[[str], Awaitable[None]], codec: Codec = STANDARD) -> None:
        self._send = send
        self._codec = codec
        self._rate = RATE
        self._turn = bytearray()
        self._last_turn = b""
        self._reply: asyncio.Task[None] | None = None
        self._reply_id: str | None = None

    def opened(self) -> list[str]:
        """The frames that greet a new connection."""
        return [self._out({"type": "session.created", "session": {"type": "realtime"}})]

    def receive(self, message: str | bytes) -> list[str]:
        """Handle one client message; the frames it answers with."""
        event = self._codec.loads(message)
        if not isinstance(event, dict):
            return []
        kind = event.get("type")
        if kind == "input_audio_buffer.append":
            self._turn += self._codec.b64decode(event.get("audio", ""))
            return []
        if kind == "input_audio_buffer.commit":
            self._last_turn = bytes(self._turn)
            self._turn.clear()
            out = [self._out({"type": "input_audio_buffer.committed", "item_id": f"item_{next(_ids)}"})]
            return out + self._start_reply() if event.get("response_create") else out
        if kind == "input_audio_buffer.clear":
            self._turn.clear()
            return [self._out({"type": "input_audio_buffer.cleared"})]
        if kind == "response.create":
            return self._start_reply()
        if kind in ("response.cancel", "barge_in"):
            return self.stop_reply()
        if kind == "session.update":
            self._rate = _input_rate(event.get("session")) or self._rate
            return [self._out({"type": "session.updated", "session": event.get("session")})]
        return []

    def stop_reply(self) -> list[str]:
        """Stop the reply being spoken: its ``response.done`` (nothing if none is)."""
        task, rid = self._reply, self._reply_id
        self._reply, self._reply_id = None, None
        if task is None or task.done():
            return []
        # A cancelled task sends nothing more: it resumes only to raise CancelledError.
        task.cancel()
        return [self._out({"type": "response.done", "response": {"id": rid, "status": "cancelled"}})]

    def _start_reply(self) -> list[str]:
        out = self.stop_reply()
        rid = f"resp_{next(_ids)}"
        self._reply_id = rid
        out.append(self._out({"type": "response.created", "response": {"id": rid, "status": "in_progress"}}))
        self._reply = asyncio.create_task(self._speak(rid, self._last_turn))
        return out

    async def _speak(self, rid: str, audio: bytes) -> None:
        loop = asyncio.get_running_loop()
        chunk = self._rate * CHUNK_MS // 1000 * 2
        started = loop.time()
        for index, offset in enumerate(range(0, len(audio), chunk)):
            delta = self._codec.b64encode(audio[offset : offset + chunk])
            await self._send(
                self._out({"type": "response.output_audio.delta", "response_id": rid, "delta": delta})
            )
            delay = started + (index + 1) * CHUNK_MS / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self._reply, self._reply_id = None, None
        await self._send(self._out({"type": "response.done", "response": {"id": rid, "status": "completed"}}))

    def _out(self, event: dict[str, Any]) -> str:
        return self._codec.dumps(event)


def _input_rate(session: object) -> int | None:
    if not isinstance(session, dict):
        return None
    fmt = ((session.get("audio") or {}).get("input") or {}).get("format") or {}
    rate = fmt.get("rate") if isinstance(fmt, dict) else None
    return int(rate) if isinstance(rate, int) else None


async def serve(host: str, port: int) -> None:
    """The ``websockets`` floor, until cancelled."""
    from websockets.asyncio.server import ServerConnection
    from websockets.asyncio.server import serve as ws_serve
    from websockets.http11 import Request, Response

    async def handler(ws: ServerConnection) -> None:
        async def send(text: str) -> None:
            with contextlib.suppress(Exception):  # the caller may be gone; its reader ends the session
                await ws.send(text)

        session = FloorSession(send)
        try:
            for text in session.opened():
                await send(text)
            async for message in ws:
                for text in session.receive(message):
                    await send(text)
        except Exception:  # noqa: BLE001 - a caller that sent garbage or vanished ends its session alone
            pass
        finally:
            session.stop_reply()

    def health(connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        return None

    async with ws_serve(
        handler, host, port, process_request=health, max_size=None, ping_interval=None, compression=None
    ) as server:
        await server.serve_forever()


async def serve_picows(host: str, port: int) -> None:
    """The ``picows`` floor, until cancelled."""
    from picows import (
        WSFrame,
        WSListener,
        WSMsgType,
        WSTransport,
        WSUpgradeRequest,
        WSUpgradeResponse,
        WSUpgradeResponseWithListener,
        ws_create_server,
    )

    class Listener(WSListener):
        def __init__(self) -> None:
            self._transport: WSTransport | None = None
            self._session = FloorSession(self._send_later, FAST)
            # A message split over frames, until its last frame.
            self._parts: list[bytes] = []

        async def _send_later(self, text: str) -> None:
            self._send(text)

        def _send(self, text: str) -> None:
            transport = self._transport
            if transport is not None and not transport.is_disconnected:
                transport.send(WSMsgType.TEXT, text.encode())

        def on_ws_connected(self, transport: WSTransport) -> None:
            self._transport = transport
            for text in self._session.opened():
                self._send(text)

        def on_ws_frame(self, transport: WSTransport, frame: WSFrame) -> None:
            kind = frame.msg_type
            if kind == WSMsgType.CLOSE:
                transport.send_close(frame.get_close_code())
                transport.disconnect()
                return
            if kind not in (WSMsgType.TEXT, WSMsgType.BINARY, WSMsgType.CONTINUATION):
                return
            if not frame.fin or self._parts:
                self._parts.append(frame.get_payload_as_bytes())
                if not frame.fin:
                    return
                message: bytes = b"".join(self._parts)
                self._parts.clear()
            else:
                message = frame.get_payload_as_bytes()
            try:
                out = self._session.receive(message)
            except ValueError:  # not JSON, or not base64: the floor validates nothing more
                return
            for text in out:
                self._send(text)

        def on_ws_disconnected(self, transport: WSTransport) -> None:
            self._session.stop_reply()
            self._transport = None

    def route(request: WSUpgradeRequest) -> Any:
        if request.path == b"/healthz":
            return WSUpgradeResponseWithListener(WSUpgradeResponse.create_ok_response(b"ok\n"), None)
        return Listener()

    server = await ws_create_server(route, host, port, max_frame_size=64 * 1024 * 1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    """``python -m duplex_gateway.bench.floor``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--server", choices=("websockets", "picows"), default="websockets")
    args = parser.parse_args()
    run = serve_picows if args.server == "picows" else serve
    try:
        import uvloop

        uvloop.run(run(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
