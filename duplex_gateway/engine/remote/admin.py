"""Admin endpoints of the ``remote`` engine (mounted by the app through ``engine.admin_routes()``).

============================  ===================================================
``GET /admin/backends``       ``[{url, healthy, draining, sessions, cap, last_error}]``
``POST /admin/backends/drain``    ``{"url": ...}``: no new sessions there; the
                                  backend's snapshot, 404 for an unknown url
``POST /admin/backends/undrain``  ``{"url": ...}``: take sessions again
============================  ===================================================

With API keys configured, a request must carry one (``Authorization: Bearer KEY``,
``X-API-Key: KEY`` or ``?api_key=KEY``), else 401.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

if TYPE_CHECKING:
    from duplex_gateway.engine.remote.engine import RemoteEngine

__all__ = ["backend_routes"]

_MAX_BODY = 4096


def _authorized(request: Request, keys: Sequence[str]) -> bool:
    if not keys:
        return True
    presented: list[str] = []
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        presented.append(auth[7:].strip())
    if "x-api-key" in request.headers:
        presented.append(request.headers["x-api-key"])
    if "api_key" in request.query_params:
        presented.append(request.query_params["api_key"])
    return any(hmac.compare_digest(p.encode(), k.encode()) for p in presented for k in keys)


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status)


def backend_routes(engine: RemoteEngine, api_keys: Sequence[str]) -> list[Route]:
    """The admin routes for ``engine``, guarded by ``api_keys``."""
    keys = tuple(api_keys)

    def guarded(
        handler: Callable[[Request], Awaitable[Response]],
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not _authorized(request, keys):
                return _error(401, "unauthorized", "a valid API key is required")
            return await handler(request)

        return endpoint

    async def list_backends(request: Request) -> Response:
        return JSONResponse(engine.snapshot())

    def change(action: Callable[[str], object]) -> Callable[[Request], Awaitable[Response]]:
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
                action(url)
            except KeyError:
                return _error(404, "unknown_backend", f"no backend {url}")
            return JSONResponse(engine.pool.get(url).snapshot())

        return endpoint

    return [
        Route("/admin/backends", guarded(list_backends), methods=["GET"]),
        Route("/admin/backends/drain", guarded(change(engine.drain)), methods=["POST"]),
        Route("/admin/backends/undrain", guarded(change(engine.undrain)), methods=["POST"]),
    ]
