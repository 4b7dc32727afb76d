"""A real OpenAI-compatible chat-completions server for tests: uvicorn on loopback, in a thread.

``POST /v1/chat/completions`` streams ``chat.completion.chunk`` events exactly as OpenAI
does (a role chunk, content in small pieces, tool calls with their arguments in fragments,
a finish chunk, a usage chunk when ``stream_options.include_usage`` asks, ``data: [DONE]``);
``GET /v1/models`` lists one model. Each test scripts the replies and reads back what
was sent::

    with running_chat_server() as server:
        server.script(Reply(text="Hello there. How are you?"))
        ...  # point a client at server.url ("http://127.0.0.1:<port>/v1")
        assert server.requests[0].body["messages"][-1]["content"] == "hi"

Replies are used in order; with none left, the server answers :func:`echo_reply` (it
repeats the last user message, so an end-to-end test can tell the model's answer from a
fallback). The server runs its own event loop in a thread, so sync and async tests alike
can use it, and so can code under test that runs its own loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import uvicorn

__all__ = [
    "MODEL_ID",
    "ChatServer",
    "RecordedRequest",
    "Reply",
    "ScriptedToolCall",
    "echo_reply",
    "running_chat_server",
]

MODEL_ID = "test-chat-model"

_Scope = Mapping[str, Any]
_Receive = Callable[[], Awaitable[dict[str, Any]]]
_Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ScriptedToolCall:
    name: str
    #: The arguments' JSON text, streamed in ``fragments`` pieces.
    arguments: str
    #: The call id; None: ``call_<n>``.
    id: str | None = None
    fragments: int = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """What the server answers to one chat-completions request."""

    text: str = ""
    tool_calls: tuple[ScriptedToolCall, ...] = ()
    #: None: ``tool_calls`` when there are tool calls, else ``stop``.
    finish_reason: str | None = None
    #: (prompt_tokens, completion_tokens) for the usage chunk; None: no usage chunk.
    usage: tuple[int, int] | None = (17, 9)
    #: Characters of text per content chunk, and the pause between chunks.
    chunk_chars: int = 4
    delay_s: float = 0.002
    #: An HTTP error status (>= 400) answered with OpenAI's error body carrying ``error``.
    status: int = 200
    error: str = "scripted failure"
    #: Wait this long before answering at all (no status line: "no first byte").
    delay_first_s: float = 0.0
    #: After the text, hold the stream open this long without sending, or until the client goes.
    stall_s: float = 0.0
    #: ``data:`` payloads sent verbatim after the text, e.g. a malformed chunk.
    raw: tuple[str, ...] = ()
    #: Send the finish chunk (and the usage chunk), then ``data: [DONE]``; without either the
    #: stream just ends, as when a server dies mid-reply.
    finish: bool = True
    done: bool = True
    #: Send each event in writes of this many bytes (SSE lines split across network chunks).
    fragment_bytes: int | None = None
    #: False: answer one ``chat.completion`` JSON object even when a stream was asked for.
    stream: bool = True
    #: Send an SSE comment line before each event (as some proxies do to keep connections alive).
    keepalive: bool = False


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    method: str
    path: str
    #: Header names in lower case.
    headers: Mapping[str, str]
    #: The JSON body (None: none or not JSON).
    body: Any


def echo_reply(body: Any) -> Reply:
    """The reply when no scripted one is left: ``The model heard: <last user message>.``"""
    heard = ""
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            heard = str(message.get("content") or "")
            break
    return Reply(text=f"The model heard: {heard.rstrip('.')}.")


@dataclass
class ChatServer:
    """The running server's handle: its URL, its script and what it received."""

    default_reply: Callable[[Any], Reply] = echo_reply
    #: Set once a client has gone away while its reply was still streaming (or stalled).
    disconnected: threading.Event = field(default_factory=threading.Event)
    #: Set once a reply has started stalling.
    stalling: threading.Event = field(default_factory=threading.Event)
    #: Streams completed to the end, and streams the client abandoned.
    completed: int = 0
    disconnects: int = 0
    port: int = 0
    _replies: deque[Reply] = field(default_factory=deque)
    _requests: list[RecordedRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        """The API base URL, as a client's settings take it."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def requests(self) -> list[RecordedRequest]:
        """Every request received so far, oldest first."""
        with self._lock:
            return list(self._requests)

    @property
    def chat_requests(self) -> list[RecordedRequest]:
        return [r for r in self.requests if r.path == "/v1/chat/completions"]

    def script(self, *replies: Reply) -> None:
        """Answer the next chat requests with ``replies``, in order."""
        with self._lock:
            self._replies.extend(replies)

    async def wait_disconnected(self, timeout_s: float = 5.0) -> bool:
        """Whether a client abandons a stream within ``timeout_s`` (without blocking the loop)."""
        return await asyncio.to_thread(self.disconnected.wait, timeout_s)

    async def wait_stalling(self, timeout_s: float = 5.0) -> bool:
        return await asyncio.to_thread(self.stalling.wait, timeout_s)

    # -- the ASGI app --------------------------------------------------------------------

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            message = await receive()
            raw += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        path, method = scope["path"], scope["method"]
        with self._lock:
            self._requests.append(RecordedRequest(method, path, headers, body))
        if method == "GET" and path == "/v1/models":
            models = {"object": "list", "data": [{"id": MODEL_ID, "object": "model", "owned_by": "tests"}]}
            await _send_json(send, 200, models)
        elif method == "POST" and path == "/v1/chat/completions":
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                await _send_json(send, 400, _error_body("messages are required", 400))
                return
            with self._lock:
                reply = self._replies.popleft() if self._replies else None
            await self._complete(body, reply or self.default_reply(body), receive, send)
        else:
            await _send_json(send, 404, _error_body(f"no route {method} {path}", 404))

    async def _complete(self, body: dict[str, Any], reply: Reply, receive: _Receive, send: _Send) -> None:
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            if reply.delay_first_s and await self._hold(gone, reply.delay_first_s):
                self._note_disconnect()
                return
            if reply.status >= 400:
                await _send_json(send, reply.status, _error_body(reply.error, reply.status))
                return
            if not body.get("stream") or not reply.stream:
                await _send_json(send, 200, _completion(body, reply))
                return
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
                }
            )
            try:
                finished = await self._stream(body, reply, send, gone)
            except OSError:  # the client went away between our check and the write
                finished = False
            if finished:
                self.completed += 1
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                self._note_disconnect()
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher

    async def _stream(self, body: dict[str, Any], reply: Reply, send: _Send, gone: asyncio.Event) -> bool:
        """Send the reply's events; False if the client went away first."""
        chunk_id = f"chatcmpl-{int(time.time() * 1000)}"
        created = int(time.time())
        model = str(body.get("model") or MODEL_ID)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return json.dumps(
                {
                    "id": chunk_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "system_fingerprint": "fp_tests",
                    "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
                }
            )

        async def event(data: str) -> bool:
            if gone.is_set():
                return False
            if reply.keepalive:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
            payload = f"data: {data}\n\n".encode()
            step = reply.fragment_bytes or len(payload)
            for at in range(0, len(payload), step):
                await send({"type": "http.response.body", "body": payload[at : at + step], "more_body": True})
                if reply.fragment_bytes:
                    await asyncio.sleep(0.001)
            await asyncio.sleep(reply.delay_s)
            return not gone.is_set()

        if not await event(chunk({"role": "assistant", "content": ""})):
            return False
        text = reply.text
        for at in range(0, len(text), max(1, reply.chunk_chars)):
            if not await event(chunk({"content": text[at : at + reply.chunk_chars]})):
                return False
        for number, call in enumerate(reply.tool_calls):
            call_id = call.id or f"call_{number}"
            opening = {"index": number, "id": call_id, "type": "function"}
            first = {"tool_calls": [opening | {"function": {"name": call.name, "arguments": ""}}]}
            if not await event(chunk(first)):
                return False
            for piece in _fragments(call.arguments, call.fragments):
                if not await event(
                    chunk({"tool_calls": [{"index": number, "function": {"arguments": piece}}]})
                ):
                    return False
        for data in reply.raw:
            if not await event(data):
                return False
        if reply.stall_s:
            self.stalling.set()
            if await self._hold(gone, reply.stall_s):
                return False
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        if reply.finish and not await event(chunk({}, finish)):
            return False
        options = body.get("stream_options") or {}
        if reply.finish and reply.usage is not None and options.get("include_usage"):
            prompt, completion = reply.usage
            usage = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            usage_chunk = json.loads(chunk({}))
            usage_chunk["choices"], usage_chunk["usage"] = [], usage
            if not await event(json.dumps(usage_chunk)):
                return False
        return await event("[DONE]") if reply.done else True

    async def _hold(self, gone: asyncio.Event, seconds: float) -> bool:
        """Wait ``seconds``, less if the client goes or the server closes; True if the client went."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not gone.is_set() and not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gone.wait(), 0.05)
        return gone.is_set()

    def _note_disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected.set()


def _fragments(text: str, count: int) -> list[str]:
    size = max(1, -(-len(text) // max(1, count)))
    return [text[at : at + size] for at in range(0, len(text), size)] or [""]


def _error_body(message: str, status: int) -> dict[str, Any]:
    kind = (
        "authentication_error"
        if status == 401
        else "invalid_request_error"
        if status < 500
        else "server_error"
    )
    return {"error": {"message": message, "type": kind, "param": None, "code": status}}


def _completion(body: dict[str, Any], reply: Reply) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{n}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            }
            for n, c in enumerate(reply.tool_calls)
        ]
    finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
    return {
        "id": "chatcmpl-tests",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": str(body.get("model") or MODEL_ID),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
    }


async def _send_json(send: _Send, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data, "more_body": False})


@contextlib.contextmanager
def running_chat_server(*, default_reply: Callable[[Any], Reply] = echo_reply) -> Iterator[ChatServer]:
    """A :class:`ChatServer` listening on a free loopback port for the ``with`` block."""
    server = ChatServer(default_reply=default_reply)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    server.port = sock.getsockname()[1]
    config = uvicorn.Config(server, log_level="warning", lifespan="off", timeout_graceful_shutdown=2)
    uv = uvicorn.Server(config)
    thread = threading.Thread(
        target=lambda: asyncio.run(uv.serve(sockets=[sock])), name="chat-test-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 10
    while not uv.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        if not uv.started:
            raise RuntimeError("the chat test server did not start")
        yield server
    finally:
        server._closing.set()
        uv.should_exit = True
        thread.join(10)
        sock.close()
