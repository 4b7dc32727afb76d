"""The floor: the least a Python WebSocket server can do to answer a caller.

A bare ``websockets`` server speaking just enough of the Realtime protocol for
the bench's callers: it keeps the appended audio of the current turn, and on
``response.create`` (or a commit with ``response_create``) streams the turn
back in 100 ms chunks paced in real time, as the gateway's ``echo`` engine does;
``response.cancel`` / ``barge_in`` stop the reply with ``response.done``
``cancelled``. No VAD, no resampling, no validation beyond JSON. What the
gateway costs above this is the price of everything it does besides moving
audio.

``python -m duplex_gateway.bench.floor --port N`` serves ``WS /v1/realtime`` and
``GET /healthz``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import itertools
import json
from http import HTTPStatus
from typing import Any

__all__ = ["FloorSession", "main", "serve"]

RATE = 24_000
CHUNK_MS = 100
_ids = itertools.count(1)


class FloorSession:
    """One caller's loopback on one connection."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._rate = RATE
        self._turn = bytearray()
        self._last_turn = b""
        self._reply: asyncio.Task[None] | None = None
        self._reply_id: str | None = None

    async def run(self) -> None:
        """Serve the connection until the caller leaves."""
        await self._send({"type": "session.created", "session": {"type": "realtime"}})
        try:
            async for message in self._ws:
                event = json.loads(message)
                if isinstance(event, dict):
                    await self._handle(event)
        finally:
            await self._stop_reply(send_done=False)

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "input_audio_buffer.append":
            self._turn += base64.b64decode(event.get("audio", ""))
        elif kind == "input_audio_buffer.commit":
            self._last_turn = bytes(self._turn)
            self._turn.clear()
            await self._send({"type": "input_audio_buffer.committed", "item_id": f"item_{next(_ids)}"})
            if event.get("response_create"):
                await self._start_reply()
        elif kind == "input_audio_buffer.clear":
            self._turn.clear()
            await self._send({"type": "input_audio_buffer.cleared"})
        elif kind == "response.create":
            await self._start_reply()
        elif kind in ("response.cancel", "barge_in"):
            await self._stop_reply(send_done=True)
        elif kind == "session.update":
            self._rate = _input_rate(event.get("session")) or self._rate
            await self._send({"type": "session.updated", "session": event.get("session")})

    async def _start_reply(self) -> None:
        await self._stop_reply(send_done=True)
        rid = f"resp_{next(_ids)}"
        self._reply_id = rid
        await self._send({"type": "response.created", "response": {"id": rid, "status": "in_progress"}})
        self._reply = asyncio.create_task(self._speak(rid, self._last_turn))

    async def _speak(self, rid: str, audio: bytes) -> None:
        loop = asyncio.get_running_loop()
        chunk = self._rate * CHUNK_MS // 1000 * 2
        started = loop.time()
        for index, offset in enumerate(range(0, len(audio), chunk)):
            delta = base64.b64encode(audio[offset : offset + chunk]).decode("ascii")
            await self._send({"type": "response.output_audio.delta", "response_id": rid, "delta": delta})
            delay = started + (index + 1) * CHUNK_MS / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        self._reply, self._reply_id = None, None
        await self._send({"type": "response.done", "response": {"id": rid, "status": "completed"}})

    async def _stop_reply(self, *, send_done: bool) -> None:
        task, rid = self._reply, self._reply_id
        self._reply, self._reply_id = None, None
        if task is None or task.done():
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        if send_done:
            await self._send({"type": "response.done", "response": {"id": rid, "status": "cancelled"}})

    async def _send(self, event: dict[str, Any]) -> None:
        with contextlib.suppress(Exception):  # the caller may be gone; its reader ends the session
            await self._ws.send(json.dumps(event))


def _input_rate(session: object) -> int | None:
    if not isinstance(session, dict):
        return None
    fmt = ((session.get("audio") or {}).get("input") or {}).get("format") or {}
    rate = fmt.get("rate") if isinstance(fmt, dict) else None
    return int(rate) if isinstance(rate, int) else None


async def serve(host: str, port: int) -> None:
    """Serve until cancelled."""
    from websockets.asyncio.server import ServerConnection
    from websockets.asyncio.server import serve as ws_serve
    from websockets.http11 import Request, Response

    async def handler(ws: ServerConnection) -> None:
        with contextlib.suppress(Exception):
            await FloorSession(ws).run()

    def health(connection: ServerConnection, request: Request) -> Response | None:
        if request.path == "/healthz":
            return connection.respond(HTTPStatus.OK, "ok\n")
        return None

    async with ws_serve(
        handler, host, port, process_request=health, max_size=None, ping_interval=None, compression=None
    ) as server:
        await server.serve_forever()


def main() -> None:
    """``python -m duplex_gateway.bench.floor``."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.host, args.port))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
