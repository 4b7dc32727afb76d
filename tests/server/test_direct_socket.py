"""The direct socket on a real uvicorn server with the gateway's WebSocket protocol, against the websockets client."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
import websockets
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.frames import Frame, Opcode
from websockets.streams import StreamReader

from duplex_gateway.server.direct_socket import DirectSocket, direct_socket, frame_header
from duplex_gateway.server.ws_protocol import stuck_client_protocol

#: Payload lengths around each of RFC 6455's three length encodings.
SIZES = (0, 1, 125, 126, 127, 65_535, 65_536, 200_000)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_frame_headers_parse_as_the_frames_they_announce(size: int, opcode: Opcode) -> None:
    payload = b"x" * size
    reader = StreamReader()
    reader.feed_data(frame_header(0x80 | opcode.value, size) + payload)
    reader.feed_eof()
    parser = Frame.parse(reader.read_exact, mask=False)
    try:
        next(parser)
    except StopIteration as done:
        frame = done.value
    else:  # pragma: no cover - the parser wanted more than the frame
        pytest.fail("incomplete frame")
    assert (frame.opcode, frame.fin, bytes(frame.data)) == (opcode, True, payload)


class _Echo:
    """An app that echoes each message through whatever :func:`direct_socket` gives it."""

    def __init__(self) -> None:
        self.kinds: list[type] = []
        self.after_close: list[BaseException] = []
        self.app = Starlette(routes=[WebSocketRoute("/echo", self.echo)])

    async def echo(self, websocket: WebSocket) -> None:
        await websocket.accept()
        sock: Any = direct_socket(websocket)
        self.kinds.append(type(sock))
        while True:
            message = await sock.receive()
            if message["type"] == "websocket.disconnect":
                try:
                    await sock.send_text("too late")
                except WebSocketDisconnect as exc:
                    self.after_close.append(exc)
                return
            if message.get("text") == "close please":
                await sock.close(4001, "asked")
                return
            if message.get("text") is not None:
                await sock.send_text(message["text"])
            else:
                await sock.send_bytes(message["bytes"])


@pytest.fixture(params=[False, True], ids=["plain", "deflate"])
async def echo(request: pytest.FixtureRequest) -> AsyncIterator[tuple[_Echo, str]]:
    app = _Echo()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    config = uvicorn.Config(
        app.app,
        ws=stuck_client_protocol(1.0),
        ws_per_message_deflate=request.param,
        ws_max_size=1 << 20,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[listener]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield app, f"ws://127.0.0.1:{listener.getsockname()[1]}/echo"
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 10)
        listener.close()


async def test_messages_of_every_length_go_both_ways_whole(echo: tuple[_Echo, str]) -> None:
    app, url = echo
    async with websockets.connect(url, max_size=1 << 20) as ws:
        for size in SIZES:
            await ws.send("é" * (size // 2))
            assert await ws.recv() == "é" * (size // 2)
            await ws.send(bytes(range(256)) * (size // 256) + b"!")
            assert await ws.recv() == bytes(range(256)) * (size // 256) + b"!"
    assert app.kinds == [DirectSocket]


async def test_a_close_goes_out_with_its_code_and_reason(echo: tuple[_Echo, str]) -> None:
    _, url = echo
    async with websockets.connect(url) as ws:
        await ws.send("close please")
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await ws.recv()
    assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "asked")  # type: ignore[union-attr]


async def test_sending_after_the_client_left_raises_disconnect(echo: tuple[_Echo, str]) -> None:
    app, url = echo
    async with websockets.connect(url) as ws:
        await ws.send("hello")
        assert await ws.recv() == "hello"
    for _ in range(200):
        if app.after_close:
            break
        await asyncio.sleep(0.01)
    assert len(app.after_close) == 1


async def test_other_servers_keep_starlettes_socket() -> None:
    websocket = WebSocket({"type": "websocket", "path": "/", "headers": []}, receive=None, send=None)  # type: ignore[arg-type]
    assert direct_socket(websocket) is websocket
