"""The floor servers: one loopback session, the same frames from ``websockets`` and from ``picows``."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from websockets.asyncio.client import connect

from duplex_gateway.bench.floor import FAST, STANDARD, FloorSession, serve, serve_picows

pytestmark = pytest.mark.e2e

#: 300 ms of 24 kHz PCM16: three reply chunks.
TURN = bytes(range(256)) * 56 + bytes(14_400 - 256 * 56)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def _running(server: Callable[[str, int], Awaitable[None]]) -> AsyncIterator[int]:
    port = _free_port()
    task = asyncio.create_task(server("127.0.0.1", port))
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            await asyncio.sleep(0.02)
        yield port
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _events(ws: object, until: str) -> list[dict[str, object]]:
    seen = []
    async with asyncio.timeout(5):
        while True:
            event = json.loads(await ws.recv())  # type: ignore[attr-defined]
            seen.append(event)
            if event["type"] == until:
                return seen


@pytest.mark.parametrize("server", [serve, serve_picows], ids=["websockets", "picows"])
async def test_a_committed_turn_comes_back_paced_and_a_cancel_stops_it(
    server: Callable[[str, int], Awaitable[None]],
) -> None:
    async with _running(server) as port:
        health = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5).read()
        )
        assert health == b"ok\n"
        async with connect(f"ws://127.0.0.1:{port}/v1/realtime", max_size=None) as ws:
            assert (await _events(ws, "session.created"))[-1]["session"] == {"type": "realtime"}
            for offset in range(0, len(TURN), 4800):
                audio = base64.b64encode(TURN[offset : offset + 4800]).decode()
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
            await ws.send(json.dumps({"type": "input_audio_buffer.commit", "response_create": True}))
            seen = await _events(ws, "response.done")
            kinds = [e["type"] for e in seen]
            assert kinds == [
                "input_audio_buffer.committed",
                "response.created",
                *["response.output_audio.delta"] * 3,
                "response.done",
            ]
            echoed = b"".join(base64.b64decode(str(e["delta"])) for e in seen if "delta" in e)
            assert echoed == TURN
            assert seen[-1]["response"] == {"id": seen[1]["response"]["id"], "status": "completed"}  # type: ignore[index]
            # Again, cut after the first chunk: response.done says cancelled and no audio follows it.
            await ws.send(json.dumps({"type": "response.create"}))
            await _events(ws, "response.output_audio.delta")
            await ws.send(json.dumps({"type": "response.cancel"}))
            done = (await _events(ws, "response.done"))[-1]
            assert done["response"]["status"] == "cancelled"  # type: ignore[index]
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.4):
                    await ws.recv()
            # A message split over frames is one message (a client may fragment).
            await ws.send(
                json.dumps({"type": "input_audio_buffer.clear"})[i : i + 7] for i in range(0, 36, 7)
            )
            assert (await _events(ws, "input_audio_buffer.cleared"))[-1][
                "type"
            ] == "input_audio_buffer.cleared"


@pytest.mark.parametrize("codec", [STANDARD, FAST], ids=["standard", "fast"])
async def test_the_session_speaks_the_same_whatever_its_codec(codec: object) -> None:
    sent: list[str] = []

    async def send(text: str) -> None:
        sent.append(text)

    session = FloorSession(send, codec)  # type: ignore[arg-type]
    greeting = [json.loads(t) for t in session.opened()]
    assert greeting == [{"type": "session.created", "session": {"type": "realtime"}}]
    update = {"type": "session.update", "session": {"audio": {"input": {"format": {"rate": 16_000}}}}}
    assert [json.loads(t)["type"] for t in session.receive(json.dumps(update))] == ["session.updated"]
    assert session.receive(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA"})) == []
    assert session.receive("[1, 2]") == []
    with pytest.raises(ValueError):
        session.receive("not json")
    assert session.stop_reply() == []
