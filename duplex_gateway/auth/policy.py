"""What each endpoint asks of its caller, which browser origins may call, and how a refusal reads.

Pure data and functions: a path and its query in, a requirement out. The gateway's endpoints are
listed here once, so a route the table does not know is public over HTTP (the web demo, probes)
and asks for the ``realtime`` scope over WebSocket (a session, whatever its path).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from duplex_gateway.auth.principal import Scope
from duplex_gateway.vocabulary.errors import ErrorCode, error_type_for

__all__ = [
    "AUTH_CHECK_PATH",
    "CLIENT_SECRETS_PATH",
    "HTTP_RULES",
    "LIVE_SESSIONS_PATH",
    "Denial",
    "Open",
    "OriginPolicy",
    "Requirement",
    "requirement",
]

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
#: ``POST /v1/realtime/calls``: a WebRTC call's SDP offer (its ``/{call_id}/...`` are telephony's).
CALLS_PATH = "/v1/realtime/calls"
#: ``POST /v1/live/sessions``: a Live API WebRTC session's offer (``WS`` on the same path: the
#: Live WebSocket); its ``/{session_id}/hangup`` is hanging a call up, as under ``CALLS_PATH``.
LIVE_SESSIONS_PATH = "/v1/live/sessions"
#: ``GET /v1/auth/check?scope=realtime``: what a WebSocket handshake with these credentials would
#: get, as HTTP a browser can read (a refused handshake shows a page script nothing).
AUTH_CHECK_PATH = "/v1/auth/check"


class Open(enum.Enum):
    """Endpoints no API key is asked for."""

    PUBLIC = "public"  # anyone (health probes, the web demo)
    CARRIER = "carrier"  # a carrier's: its signature where one is configured, else anyone or a key


Requirement = Scope | Open
_SCOPE_NAMES = frozenset(scope.value for scope in Scope)

#: HTTP paths that need a scope: a path equal to the prefix, or under it (``prefix/...``).
HTTP_RULES: tuple[tuple[str, Scope], ...] = (
    (CLIENT_SECRETS_PATH, Scope.CLIENT_SECRETS),
    ("/v1/realtime/calls", Scope.TELEPHONY),
    (LIVE_SESSIONS_PATH, Scope.TELEPHONY),
    ("/admin", Scope.ADMIN),
    # What the gateway is doing (session counts, key names in refusals) is an operator's business.
    ("/metrics", Scope.ADMIN),
)


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("1", "true")


def requirement(
    kind: str,
    path: str,
    query: Mapping[str, str],
    http_rules: Sequence[tuple[str, Scope]] = HTTP_RULES,
) -> Requirement:
    """What a ``kind`` (``"http"`` / ``"websocket"``) request to ``path`` must show."""
    if path == "/telephony" or path.startswith("/telephony/"):
        return Open.CARRIER
    if kind == "websocket":
        if path == "/v1/realtime":
            if "call_id" in query:
                return Scope.OBSERVE
            return Scope.DUPLEX if _truthy(query.get("duplex")) else Scope.REALTIME
        if path == "/v1/duplex":
            return Scope.DUPLEX
        return Scope.REALTIME
    if path == AUTH_CHECK_PATH:
        name = query.get("scope", Scope.REALTIME.value)
        return Scope(name) if name in _SCOPE_NAMES else Scope.REALTIME
    if path in (CALLS_PATH, LIVE_SESSIONS_PATH):
        # A WebRTC call is a session, as its WebSocket twin is (a browser's client secret opens it).
        return Scope.REALTIME
    for prefix, scope in http_rules:
        if path == prefix or path.startswith(prefix + "/"):
            return scope
    return Open.PUBLIC


# -- origins -------------------------------------------------------------------------------


def _origin_parts(origin: str) -> tuple[str, str] | None:
    """``(scheme, host[:port])`` of an origin, lower-case, without a default port."""
    try:
        parts = urlsplit(origin.strip().lower())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    default = 443 if parts.scheme == "https" else 80
    return parts.scheme, host if port in (None, default) else f"{host}:{port}"


class OriginPolicy:
    """``auth.allowed_origins``: exact origins, ``scheme://*.domain`` wildcards, ``null``; empty: any."""

    def __init__(self, allowed: Sequence[str] = ()) -> None:
        self.any = not allowed
        self._exact: set[tuple[str, str]] = set()
        self._wildcards: list[tuple[str, str]] = []  # (scheme, ".domain[:port]")
        self._null = False
        for entry in allowed:
            if entry == "null":
                self._null = True
            elif "://*." in entry:
                scheme, _, rest = entry.lower().partition("://*.")
                self._wildcards.append((scheme, "." + rest.rstrip("/")))
            elif (parts := _origin_parts(entry)) is not None:
                self._exact.add(parts)

    def allows(self, origin: str | None, host: str | None) -> bool:
        """Whether a request with ``Origin: origin`` to ``Host: host`` may go on.

        No ``Origin`` (not a browser, or a same-origin GET) and the gateway's own origin (the demo
        page it serves) always may.
        """
        if origin is None or self.any:
            return True
        if origin.strip() == "null":
            return self._null
        parts = _origin_parts(origin)
        if parts is None:
            return False
        if host is not None and parts[1] == _host(host):
            return True
        if parts in self._exact:
            return True
        scheme, netloc = parts
        return any(scheme == s and netloc.endswith(suffix) for s, suffix in self._wildcards)


def _host(host: str) -> str:
    host = host.strip().lower()
    for default in (":80", ":443"):
        if host.endswith(default):
            return host[: -len(default)]
    return host


# -- refusals ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Denial:
    """A request refused before it reaches a handler (a WebSocket: before the upgrade)."""

    status: int
    code: ErrorCode
    message: str
    retry_after_s: int | None = None
    #: A plain-text body of just ``message`` (carriers' webhooks), instead of the JSON error object.
    plain: bool = False
    #: Why, in a word, for metrics (``missing_key``, ``invalid_key``, ``expired_secret``, ``scope``,
    #: ``engine``, ``origin``, ``signature``, ``rate``, ``key_cap``, ``ip_cap``, ``body_too_large``).
    reason: str = ""

    def body(self) -> bytes:
        if self.plain:
            return self.message.encode()
        error = {
            "type": error_type_for(self.code),
            "code": self.code.value,
            "message": self.message,
            "param": None,
        }
        return json.dumps({"error": error}).encode()

    def headers(self) -> list[tuple[bytes, bytes]]:
        content_type = b"text/plain; charset=utf-8" if self.plain else b"application/json"
        out = [(b"content-type", content_type), (b"content-length", str(len(self.body())).encode())]
        if self.retry_after_s is not None:
            out.append((b"retry-after", str(self.retry_after_s).encode()))
        if self.status == 401 and not self.plain:
            out.append((b"www-authenticate", b'Bearer realm="duplex-gateway"'))
        return out
