"""The ASGI middleware that puts the auth layer in front of every HTTP request and WebSocket handshake.

Like Starlette's ``AuthenticationMiddleware``, it decides before the app runs and leaves the answer
in ``scope["auth"]`` (``request.auth``, ``websocket.auth``): a :class:`Principal`. A refused
WebSocket is answered before the upgrade with an HTTP status and a JSON error body, through the
ASGI ``websocket.http.response`` extension (uvicorn has it); on a server without it, the handshake
is closed before accept, which such servers answer with 403. Nothing behind it runs for a refused
request: no handler, no session, no engine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from duplex_gateway.auth.cors import cors_headers, is_cors_path, preflight
from duplex_gateway.auth.gate import Gate, client_address, route_path
from duplex_gateway.auth.policy import AUTH_CHECK_PATH, Denial
from duplex_gateway.host.closing import Failure, close_code
from duplex_gateway.vocabulary.errors import ErrorCode

__all__ = ["AuthMiddleware"]

logger = logging.getLogger("duplex_gateway.auth")

_DENIAL_EXTENSION = "websocket.http.response"


class _Gone(Exception):
    """The client went away while its body was read."""


class AuthMiddleware:
    """Authenticates and admits each request with ``gate`` before ``app`` sees it."""

    def __init__(
        self,
        app: ASGIApp,
        gate: Gate,
        *,
        on_refused: Callable[[Denial], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.app = app
        self.gate = gate
        #: Told of every refusal (the gateway counts them by ``Denial.reason``).
        self.on_refused = on_refused
        self._clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        if scope["type"] == "http" and is_cors_path(route_path(conn)):
            # A page on another origin: its preflight is answered here, before any credential is
            # asked for (a browser sends none with it), and what follows carries its CORS headers.
            if scope.get("method") == "OPTIONS" and "access-control-request-method" in conn.headers:
                answer = preflight(conn.headers, self.gate.origins)
                await send(
                    {"type": "http.response.start", "status": answer.status, "headers": answer.headers}
                )
                await send({"type": "http.response.body", "body": b""})
                return
            extra = cors_headers(conn.headers.get("origin"), conn.headers.get("host"), self.gate.origins)
            if extra:
                send = _with_headers(send, extra)
        body = b""
        check = self.gate.signature_check(conn)
        if check is not None and check.max_body_bytes > 0:
            try:
                read = await _read_body(conn, receive, check.max_body_bytes)
            except _Gone:
                return
            if read is None:
                too_large = Denial(
                    413,
                    ErrorCode.MESSAGE_TOO_LARGE,
                    "request body too large",
                    plain=True,
                    reason="body_too_large",
                )
                await self._refused(conn, scope, receive, send, too_large)
                return
            body = read
            receive = _replay(body, receive)
        # GET /v1/auth/check asks what a handshake would get: its answers are not refusals (not counted).
        probe = scope["type"] == "http" and route_path(conn) == AUTH_CHECK_PATH
        decision = self.gate.decide(conn, now=self._clock(), body=body)
        if isinstance(decision, Denial):
            if probe:
                await _refuse(scope, receive, send, decision)
            else:
                await self._refused(conn, scope, receive, send, decision)
            return
        scope["auth"] = decision
        if scope["type"] == "http":
            if probe and (denial := self.gate.would_admit(conn, decision)) is not None:
                await _refuse(scope, receive, send, denial)
                return
            await self.app(scope, receive, send)
            return
        held = self.gate.admit(conn, decision)
        if isinstance(held, Denial):
            await self._refused(conn, scope, receive, send, held, who=decision.name)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            held.release()

    async def _refused(
        self, conn: HTTPConnection, scope: Scope, receive: Receive, send: Send, denial: Denial, who: str = "-"
    ) -> None:
        # The path without its query: ?api_key= must not reach the log.
        kind = "WebSocket" if scope["type"] == "websocket" else scope.get("method", "GET")
        logger.info(
            "refused %s %s from %s (%s): %d %s",
            kind,
            scope["path"],
            client_address(conn) or "-",
            who,
            denial.status,
            denial.reason or denial.code.value,
        )
        if self.on_refused is not None:
            self.on_refused(denial)
        await _refuse(scope, receive, send, denial)


async def _refuse(scope: Scope, receive: Receive, send: Send, denial: Denial) -> None:
    if scope["type"] == "websocket":
        message = await receive()
        if message["type"] != "websocket.connect":
            return  # the client is already gone
        if _DENIAL_EXTENSION in (scope.get("extensions") or {}):
            await send(
                {
                    "type": "websocket.http.response.start",
                    "status": denial.status,
                    "headers": denial.headers(),
                }
            )
            await send({"type": "websocket.http.response.body", "body": denial.body()})
        else:
            await send(
                {
                    "type": "websocket.close",
                    "code": close_code(Failure.KEY_REFUSED),
                    "reason": denial.code.value,
                }
            )
        return
    await send({"type": "http.response.start", "status": denial.status, "headers": denial.headers()})
    await send({"type": "http.response.body", "body": denial.body()})


async def _read_body(conn: HTTPConnection, receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or None if it is longer than ``limit`` bytes."""
    declared = conn.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Gone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _with_headers(send: Send, headers: list[tuple[bytes, bytes]]) -> Send:
    """``send`` with ``headers`` added to the response's start."""

    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *headers]}
        await send(message)

    return sending


def _replay(body: bytes, receive: Receive) -> Receive:
    """``receive`` with the body already read handed out again, first."""
    pending = True

    async def replayed() -> Message:
        nonlocal pending
        if pending:
            pending = False
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
