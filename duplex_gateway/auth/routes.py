"""The auth layer's own endpoints: minting client secrets, and telling a browser why it was refused.

``POST /v1/realtime/client_secrets`` is OpenAI's: a server holding a real key mints a short-lived
client secret for a browser, which connects with the subprotocol
``openai-insecure-api-key.<ek_...>``. Request: ``{"expires_after": {"anchor": "created_at",
"seconds": N}, "session": {...}}`` (both optional; N from 10 to 7200, default 600); answer:
``{"value": "ek_...", "expires_at": <unix>, "session": {...}}``. The session configuration is
checked as ``session.update`` would check it, carried in the secret, and becomes the defaults of
every session opened with it (the client may still change them with ``session.update``).

``GET /v1/auth/check?scope=realtime`` answers what a WebSocket handshake with the same credentials
would get (401, 403, 429, 503 with the same JSON error), or 200 and the key's name, scopes and open
sessions: a browser sees nothing of a refused handshake, and can ask here why.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from duplex_gateway.auth.gate import Gate
from duplex_gateway.auth.policy import AUTH_CHECK_PATH, CLIENT_SECRETS_PATH
from duplex_gateway.auth.principal import CLIENT_SECRET_SCOPES, Principal, PrincipalKind
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError, error_type_for

__all__ = ["DEFAULT_TTL_S", "MAX_TTL_S", "MIN_TTL_S", "SessionDescriber", "auth_routes"]

logger = logging.getLogger("duplex_gateway.auth")

#: A client secret's lifetime: OpenAI's default and bounds.
DEFAULT_TTL_S = 600
MIN_TTL_S = 10
MAX_TTL_S = 7200
_MAX_REQUEST_BYTES = 64 << 10

#: Checks a ``session`` object as ``session.update`` would (``ProtocolError`` if it is not valid)
#: and returns the session a secret minted with it opens, as ``session.created`` would show it.
SessionDescriber = Callable[[Mapping[str, object]], Mapping[str, object]]


def _error(status: int, code: ErrorCode, message: str, param: str | None = None) -> JSONResponse:
    error = {"type": error_type_for(code), "code": code.value, "message": message, "param": param}
    return JSONResponse({"error": error}, status_code=status)


async def _body(request: Request) -> bytes | None:
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > _MAX_REQUEST_BYTES:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _ttl(data: Mapping[str, object]) -> int | JSONResponse:
    expires_after = data.get("expires_after")
    if expires_after is None:
        return DEFAULT_TTL_S
    if not isinstance(expires_after, dict):
        return _error(400, ErrorCode.INVALID_VALUE, "expires_after must be an object", "expires_after")
    anchor = expires_after.get("anchor", "created_at")
    if anchor != "created_at":
        return _error(
            400, ErrorCode.INVALID_VALUE, "expires_after.anchor must be 'created_at'", "expires_after.anchor"
        )
    seconds = expires_after.get("seconds", DEFAULT_TTL_S)
    if isinstance(seconds, bool) or not isinstance(seconds, int) or not MIN_TTL_S <= seconds <= MAX_TTL_S:
        return _error(
            400,
            ErrorCode.INVALID_VALUE,
            f"expires_after.seconds must be a whole number from {MIN_TTL_S} to {MAX_TTL_S}",
            "expires_after.seconds",
        )
    return seconds


def auth_routes(
    gate: Gate, describe_session: SessionDescriber, clock: Callable[[], float] = time.time
) -> list[Route]:
    """``POST /v1/realtime/client_secrets`` and ``GET /v1/auth/check``, behind the middleware."""

    async def client_secrets(request: Request) -> Response:
        principal: Principal = request.auth  # a key with the client_secrets scope: the middleware saw to it
        raw = await _body(request)
        if raw is None:
            return _error(
                413, ErrorCode.MESSAGE_TOO_LARGE, f"the request body is above {_MAX_REQUEST_BYTES} bytes"
            )
        try:
            data = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return _error(400, ErrorCode.INVALID_JSON, "the request body is not JSON")
        if not isinstance(data, dict):
            return _error(400, ErrorCode.INVALID_VALUE, "the request body must be a JSON object")
        ttl = _ttl(data)
        if isinstance(ttl, JSONResponse):
            return ttl
        session = data.get("session")
        if session is not None and not isinstance(session, dict):
            return _error(400, ErrorCode.INVALID_VALUE, "session must be an object", "session")
        scopes = principal.scopes & CLIENT_SECRET_SCOPES
        if not scopes:
            return _error(
                403,
                ErrorCode.FORBIDDEN,
                f"the key {principal.name!r} opens no sessions (scopes realtime, duplex, observe), "
                "so a client secret from it could not either",
            )
        try:
            described = describe_session(session or {})
        except ProtocolError as exc:
            param = f"session.{exc.param.removeprefix('session.')}" if exc.param else "session"
            return _error(400, exc.code, exc.message, param)
        try:
            token, claims = gate.signer.mint(
                key_name=principal.name, scopes=scopes, now=clock(), ttl_s=ttl, session=session or None
            )
        except ValueError:
            return _error(
                400,
                ErrorCode.INVALID_VALUE,
                "the session configuration is too large to carry in a client secret; "
                "send the rest with session.update once connected",
                "session",
            )
        logger.info("client secret minted by key %s, valid for %d s", principal.name, ttl)
        return JSONResponse({"value": token, "expires_at": claims.expires_at, "session": dict(described)})

    async def check(request: Request) -> Response:
        principal: Principal = request.auth  # refused by the middleware unless the handshake would pass
        keyed = principal.kind in (PrincipalKind.KEY, PrincipalKind.CLIENT_SECRET)
        return JSONResponse(
            {
                "kind": principal.kind.value,
                "key": principal.name if keyed else None,
                "scopes": sorted(principal.scopes),
                "expires_at": principal.expires_at,
                "max_sessions": principal.max_sessions,
                "open_sessions": gate.caps.open_for_key(principal.name) if keyed else None,
            }
        )

    routes: list[tuple[str, Callable[[Request], Awaitable[Response]], str]] = [
        (CLIENT_SECRETS_PATH, client_secrets, "POST"),
        (AUTH_CHECK_PATH, check, "GET"),
    ]
    return [Route(path, endpoint, methods=[method]) for path, endpoint, method in routes]
