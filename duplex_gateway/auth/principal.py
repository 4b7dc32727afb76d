"""Who a request is, once the auth layer has decided: the :class:`Principal` handlers read."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ALL_SCOPES", "CLIENT_SECRET_SCOPES", "Principal", "PrincipalKind", "Scope"]


class Scope(enum.StrEnum):
    """What a key may open (``auth.keys[].scopes``)."""

    REALTIME = "realtime"  # /v1/realtime, OpenAI's Realtime dialect
    DUPLEX = "duplex"  # /v1/duplex and /v1/realtime?duplex=1, vLLM-Omni's duplex handshake
    TELEPHONY = "telephony"  # carrier streams on a key, and hanging calls up
    OBSERVE = "observe"  # /v1/realtime?call_id=..., watching a live session
    ADMIN = "admin"  # /admin/...
    CLIENT_SECRETS = "client_secrets"  # POST /v1/realtime/client_secrets


ALL_SCOPES = frozenset(Scope)
#: What a client secret may carry of its key's scopes: a browser holds it, so it opens sessions
#: and never administers, hangs calls up or mints more secrets.
CLIENT_SECRET_SCOPES = frozenset({Scope.REALTIME, Scope.DUPLEX, Scope.OBSERVE})


class PrincipalKind(enum.StrEnum):
    ANONYMOUS = "anonymous"  # authentication is off, or the endpoint is public
    KEY = "key"  # an API key from the configuration
    CLIENT_SECRET = "client_secret"  # an ephemeral key minted by POST /v1/realtime/client_secrets
    CARRIER = "carrier"  # a carrier, by its signature (or an unsigned carrier endpoint)


@dataclass(frozen=True, slots=True, kw_only=True)
class Principal:
    """The caller of one request or WebSocket, as ``scope["auth"]`` (``request.auth``) holds it."""

    kind: PrincipalKind
    #: The key's name (a client secret's: the key that minted it), ``carrier:<name>``, or ``anonymous``.
    #: Logs and metrics show this, never a key.
    name: str
    scopes: frozenset[Scope]
    #: Sessions the key may hold at once; None: no cap.
    max_sessions: int | None = None
    #: A client secret's expiry (Unix seconds).
    expires_at: int | None = None
    #: A client secret's session configuration (Realtime wire JSON): the session's defaults.
    session: Mapping[str, object] | None = None
    #: The key asks for its sessions to be recorded (``auth.keys[].record``).
    record: bool = False

    @property
    def is_key(self) -> bool:
        """Authenticated by a configured key or by a client secret it minted."""
        return self.kind in (PrincipalKind.KEY, PrincipalKind.CLIENT_SECRET)


ANONYMOUS = Principal(kind=PrincipalKind.ANONYMOUS, name="anonymous", scopes=ALL_SCOPES)
