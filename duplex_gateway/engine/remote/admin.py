"""Admin endpoints of the ``remote`` engine (mounted by the app through ``engine.admin_routes()``).

============================  ===================================================
``GET /admin/backends``       ``[{url, healthy, draining, sessions, cap, last_error}]``
``POST /admin/backends/drain``    ``{"url": ...}``: no new sessions there; the
                                  backend's snapshot, 404 for an unknown url
``POST /admin/backends/undrain``  ``{"url": ...}``: take sessions again
============================  ===================================================

Served by the gateway, they sit behind its auth layer (:mod:`duplex_gateway.auth`), which asks
for a key with the ``admin`` scope. Mounted on their own with ``api_keys``, the same layer guards
them with those keys (``Authorization: Bearer KEY``, ``X-API-Key: KEY``), else 401.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from duplex_gateway.auth import AuthMiddleware, Gate, KeyStore, TokenSigner
from duplex_gateway.engine.remote.pool import Backend

__all__ = ["ManagedBackends", "backend_routes"]

_MAX_BODY = 4096


class ManagedBackends(Protocol):
    """What the admin routes need of the engine (:class:`~.engine.RemoteEngine`): its backends, and drain."""

    def snapshot(self) -> list[dict[str, object]]:
        """The backends as ``GET /admin/backends`` shows them."""
        ...

    def drain(self, url: str) -> Backend:
        """Place no new session on ``url``; ``KeyError`` if unknown."""
        ...

    def undrain(self, url: str) -> Backend:
        """Place sessions on ``url`` again; ``KeyError`` if unknown."""
        ...


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def backend_routes(engine: ManagedBackends, api_keys: Sequence[str] = ()) -> list[Route]:
    """The admin routes for ``engine``; with ``api_keys``, guarded by them (outside the gateway's app)."""
    middleware: list[Middleware] | None = None
    if api_keys:
        keys = KeyStore.from_plaintext(api_keys)
        gate = Gate(keys=keys, signer=TokenSigner.from_setting(None), engine="remote")
        middleware = [Middleware(AuthMiddleware, gate=gate)]

    async def list_backends(request: Request) -> Response:
        return JSONResponse(engine.snapshot())

    def change(action: Callable[[str], Backend]) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            body = await request.body()
            if len(body) > _MAX_BODY:
                return _error(413, "too_large", "the request body is too large")
            try:
                data = json.loads(body or b"null")
            except ValueError:
                return _error(400, "invalid_json", 'the body must be JSON: {"url": "ws://host:port"}')
            url = data.get("url") if isinstance(data, dict) else None
            if not isinstance(url, str) or not url:
                return _error(
                    400, "missing_field", 'the body must name the backend: {"url": "ws://host:port"}'
                )
            try:
                backend = action(url)
            except KeyError:
                return _error(404, "unknown_backend", f"no backend {url}")
            return JSONResponse(backend.snapshot())

        return endpoint

    return [
        Route("/admin/backends", list_backends, methods=["GET"], middleware=middleware),
        Route("/admin/backends/drain", change(engine.drain), methods=["POST"], middleware=middleware),
        Route("/admin/backends/undrain", change(engine.undrain), methods=["POST"], middleware=middleware),
    ]
