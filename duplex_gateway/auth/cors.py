"""CORS for the endpoints a page on another origin calls with ``fetch``: the WebRTC offers.

Those are ``POST /v1/realtime/calls`` (an SDP body) and ``POST /v1/live/sessions`` (JSON).

A browser posts a WebRTC offer with an ``Authorization`` header and an ``application/sdp`` body,
so it first asks with a preflight ``OPTIONS``; then it lets the page read the answer (and its
``Location``) only if the response names the page's origin. The origins allowed are the
WebSocket's (``auth.allowed_origins``, any when it is empty). Pure: headers in, headers out.
"""

from __future__ import annotations

from collections.abc import Mapping

from duplex_gateway.auth.policy import CALLS_PATH, LIVE_SESSIONS_PATH, OriginPolicy

__all__ = ["CORS_PATHS", "Preflight", "cors_headers", "is_cors_path", "preflight"]

#: Paths a cross-origin page may call (the path, and everything under it).
CORS_PATHS = (CALLS_PATH, LIVE_SESSIONS_PATH)
_ALLOWED_METHODS = "POST, OPTIONS"
_ALLOWED_HEADERS = frozenset({"authorization", "content-type", "openai-beta", "openai-organization"})
#: How long a browser may keep a preflight's answer (seconds).
_MAX_AGE_S = 600


def is_cors_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in CORS_PATHS)


def cors_headers(origin: str | None, host: str | None, origins: OriginPolicy) -> list[tuple[bytes, bytes]]:
    """What a response to a request from ``origin`` carries so that its page may read it (none: it may not)."""
    if origin is None or not origins.allows(origin, host):
        return []
    return [
        (b"access-control-allow-origin", origin.encode("latin-1")),
        (b"access-control-expose-headers", b"Location"),
        (b"vary", b"Origin"),
    ]


class Preflight:
    """The answer to a preflight: its status and headers."""

    def __init__(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.headers = headers


def preflight(headers: Mapping[str, str], origins: OriginPolicy) -> Preflight:
    """A CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) answered.

    ``403`` with no CORS headers for an origin not allowed, a method other than POST or a header
    the endpoint does not read; the browser then refuses the page's request.
    """
    origin = headers.get("origin")
    allowed = cors_headers(origin, headers.get("host"), origins)
    method = headers.get("access-control-request-method", "").upper()
    asked = {
        h.strip().lower() for h in headers.get("access-control-request-headers", "").split(",") if h.strip()
    }
    if not allowed or method != "POST" or not asked <= _ALLOWED_HEADERS:
        return Preflight(403, [(b"vary", b"Origin")])
    return Preflight(
        204,
        [
            *allowed,
            (b"access-control-allow-methods", _ALLOWED_METHODS.encode()),
            (b"access-control-allow-headers", ", ".join(sorted(asked)).encode() or b"content-type"),
            (b"access-control-max-age", str(_MAX_AGE_S).encode()),
        ],
    )
