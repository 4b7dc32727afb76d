"""vLLM-Omni's own ``DuplexClient`` at its defaults, as a new user points it at a server.

Its defaults are ``extra_body.auto_response: true`` and no turn detection, so a bare
``commit()`` must be answered; and its reconnect policy resumes a dropped session by
itself with ``session.resume``, adopting the new token ``session.resumed`` brings, as
often as the connection drops. The same scripts run against vLLM-Omni's own server
(``tests.omni.backend_server``: its WebSocket handler over the fake model stage), the
reference, and against real gateways with the ``echo``, ``vllm-omni`` and ``remote``
engines. A TCP proxy between client and server loses connections the way a network
does: reset on both sides, or on the client's side only, so the server still thinks
the old socket alive when the client comes back (a takeover).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm_omni", reason="the vLLM-Omni engines run in .venv-omni (make test runs them there)")

from vllm_omni.clients.duplex import DuplexClient, ResponseHandle

from tests.e2e.helpers import Gateway, GatewayFactory, load_speech
from tests.omni.conftest import Backend, start_backend, start_omni_gateway, stop_backends, wait_healthy

pytestmark = pytest.mark.e2e

MODEL = "fake-echo"
TURN_S = 1.0
#: Long enough for any number of resumes in a test; a dropped client is back within seconds.
GRACE_S = 30
TARGETS = ["reference", "echo", "vllm-omni", "remote"]


# -- a network that loses connections ------------------------------------------------------


class LossyProxy:
    """Forwards TCP to ``port``; loses the connections open so far on request."""

    def __init__(self, port: int) -> None:
        self._port = port
        self._server: asyncio.Server | None = None
        self._pairs: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        #: Connections whose client side was lost and that the server has since closed itself.
        self.half_open_closed_by_server = 0
        self._half_open: set[asyncio.StreamWriter] = set()
        self._kept: list[asyncio.StreamWriter] = []

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"ws://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for client, upstream in self._pairs:
            client.transport.abort()
            upstream.transport.abort()
        for writer in self._kept:
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def reset(self) -> None:
        """Reset every open connection on both sides: the server sees the drop at once."""
        for client, upstream in self._pairs:
            client.transport.abort()
            upstream.transport.abort()
        self._pairs.clear()

    def lose_client_side(self) -> None:
        """Reset the client's side only; the server's side stays open and hears nothing more."""
        for client, upstream in self._pairs:
            client.transport.abort()
            self._half_open.add(upstream)
            self._kept.append(upstream)
        self._pairs.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
        self._pairs.append((writer, up_writer))
        for source, sink, to_client in ((reader, up_writer, False), (up_reader, writer, True)):
            task = asyncio.create_task(self._pipe(source, sink, up_writer, to_client=to_client))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(
        self,
        source: asyncio.StreamReader,
        sink: asyncio.StreamWriter,
        upstream: asyncio.StreamWriter,
        *,
        to_client: bool,
    ) -> None:
        with contextlib.suppress(Exception):
            while data := await source.read(65536):
                if upstream in self._half_open:
                    continue  # nobody is there to hear it (frames may be compressed: unreadable here)
                sink.write(data)
        if upstream not in self._half_open:
            sink.transport.abort()
        elif to_client:
            self.half_open_closed_by_server += 1


@contextlib.asynccontextmanager
async def lossy(url: str) -> AsyncIterator[LossyProxy]:
    proxy = LossyProxy(int(url.rsplit(":", 1)[1]))
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


# -- the servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    # Each answer 8 chunks 200 ms apart: a reply is still streaming well after it starts.
    backend = start_backend(tmp_path_factory.mktemp("reference"), "reference", chunks=8, chunk_delay_ms=200)
    try:
        wait_healthy([backend])
        yield backend
    finally:
        stop_backends([backend])


_RESUMABLE = {"server": {"web_demo": False}, "limits": {"resume_grace_s": GRACE_S}}


def _start(name: str, request: pytest.FixtureRequest) -> str:
    factory: GatewayFactory = request.getfixturevalue("module_gateway_factory")
    gateway: Gateway
    if name == "reference":
        return request.getfixturevalue("backend").url  # type: ignore[no-any-return]
    if name == "echo":
        gateway = factory.start(
            {**_RESUMABLE, "engine": {"name": "echo", "echo": {"pace": 1.0}}}, name="echo"
        )
    elif name == "vllm-omni":
        calls: Path = request.getfixturevalue("calls_path")
        gateway = start_omni_gateway(
            factory,
            engine="vllm-omni",
            omni_factory="tests.omni.fake_stage:duplex_omni",
            calls=calls,
            name="vllm-omni",
            config=_RESUMABLE,
        )
    else:
        upstream: Backend = request.getfixturevalue("backend")
        gateway = factory.start(
            {**_RESUMABLE, "engine": {"name": "remote", "remote": {"backends": [{"url": upstream.url}]}}},
            name="remote",
        )
    return gateway.ws_url


@pytest.fixture(scope="module")
def servers() -> dict[str, str]:
    return {}


@pytest.fixture(params=TARGETS)
def server(request: pytest.FixtureRequest, servers: dict[str, str]) -> str:
    """The WebSocket base URL of the server under test, started once per module."""
    name: str = request.param
    if name not in servers:
        servers[name] = _start(name, request)
    return servers[name]


# -- the scripts ------------------------------------------------------------------------------------


def _speech() -> bytes:
    speech = load_speech(16_000)
    start = int(0.5 * 16_000) * 2  # the fixture's speech starts ≈0.5 s in
    return speech[start : start + int(TURN_S * 16_000) * 2]


class Session:
    """A ``DuplexClient`` at its defaults, and every event it dispatched."""

    def __init__(self, client: DuplexClient) -> None:
        self.client = client
        self.events: list[dict[str, Any]] = []
        self._responses = client.responses()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for event in self.client.events():
            self.events.append(event.raw)

    async def turn(self) -> ResponseHandle:
        """One caller turn ended by a bare ``commit()``; the reply, played and acknowledged."""
        await self.client.stream_pcm(_speech(), chunk_ms=100, realtime=False)
        await self.client.commit()
        handle = await asyncio.wait_for(anext(self._responses), 15)
        audio = b"".join([chunk async for chunk in handle.audio()])
        await handle.wait(15)
        assert handle.done_event is not None and handle.done_event.raw["response"]["status"] == "completed"
        assert len(audio) > 0
        # vLLM-Omni's server answers the next turn only once the client says what it played.
        await self.client.ack_playback(handle.played_ms, response_id=handle.response_id)
        return handle

    async def resumed(self, count: int) -> None:
        """Wait until the client has resumed its session ``count`` times in all."""
        async with asyncio.timeout(20):
            while sum(1 for e in self.events if e.get("type") == "connection.resumed") < count:
                await asyncio.sleep(0.02)

    def errors(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == "error"]

    async def aclose(self) -> None:
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


@contextlib.asynccontextmanager
async def default_client(url: str) -> AsyncIterator[Session]:
    # Nothing but the URL and the model: every other setting is DuplexClient's default.
    async with DuplexClient(url, model=MODEL) as client:
        session = Session(client)
        try:
            yield session
        finally:
            await session.aclose()


async def test_default_commit_is_answered(server: str) -> None:
    async with default_client(server) as session:
        assert session.client.config.auto_response and session.client.config.turn_detection is None
        first = await session.turn()
        second = await session.turn()
        assert first.response_id != second.response_id
        assert not session.errors(), session.errors()
        await session.client.close()


async def test_two_aborted_connections_are_resumed_and_the_next_turn_answered(server: str) -> None:
    async with lossy(server) as proxy, default_client(proxy.url) as session:
        client = session.client
        session_id, tokens = client.session_id, [client.resume_token]
        await session.turn()
        for drop in (1, 2):
            proxy.reset()
            await session.resumed(drop)
            # The rotated token was adopted: the next drop is resumed with it.
            assert client.session_id == session_id and client.resume_token not in tokens
            tokens.append(client.resume_token)
            await session.turn()
        resumed = [e for e in session.events if e.get("type") == "session.resumed"]
        assert len(resumed) == 2 and all("server_event_seq" not in e for e in resumed), resumed
        assert not session.errors(), session.errors()
        await client.close()


async def test_a_half_open_session_is_taken_over(server: str) -> None:
    async with lossy(server) as proxy, default_client(proxy.url) as session:
        client = session.client
        await session.turn()
        # The client's connection is gone; the server has heard nothing of it.
        proxy.lose_client_side()
        await session.resumed(1)
        await session.turn()
        # The server let go of the socket it still held (after telling it session.replaced).
        async with asyncio.timeout(10):
            while proxy.half_open_closed_by_server < 1:
                await asyncio.sleep(0.02)
        assert not session.errors(), session.errors()
        await client.close()


async def test_the_models_own_turn_taking_reaches_the_client(
    server: str, request: pytest.FixtureRequest
) -> None:
    """auto_response hands turn-taking to the model: its speak / listen decisions reach the
    client, and what it heard of the caller lands on the caller's item (not the reply's)."""
    native = request.node.callspec.params["server"] != "echo"  # echo has no turn-taking of its own
    async with default_client(server) as session:
        handle = await session.turn()
        events = session.events
        speak = [e for e in events if e.get("type") == "response.speak"]
        assert [e["response_id"] for e in speak] == ([handle.response_id] if native else [])
        (committed,) = [e for e in events if e.get("type") == "input_audio_buffer.committed"]
        heard = [
            e for e in events if e.get("type") == "conversation.item.input_audio_transcription.completed"
        ]
        if native:
            assert [(e["item_id"], e["transcript"]) for e in heard] == [
                (committed["item_id"], "1.0 s of caller audio")
            ]
            reply_items = {e["item"]["id"] for e in events if e.get("type") == "response.output_item.added"}
            assert committed["item_id"] not in reply_items
        await session.turn()  # and the conversation goes on
        # Turn-based again, the caller's chunk marked as silence: the model chooses to listen.
        mark = len(session.events)
        await session.client.send(
            {"type": "session.update", "session": {"extra_body": {"auto_response": False}}}
        )
        async with asyncio.timeout(10):
            while not any(e.get("type") == "session.updated" for e in session.events[mark:]):
                await asyncio.sleep(0.02)
        await session.client.append_audio(bytes(6400), is_speech=False)
        if native:
            async with asyncio.timeout(10):
                while not any(e.get("type") == "response.listen" for e in session.events[mark:]):
                    await asyncio.sleep(0.02)
        assert not session.errors(), session.errors()
        await session.client.close()
