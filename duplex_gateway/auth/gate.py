"""The decision for one HTTP request or WebSocket handshake: a :class:`Principal`, or a :class:`Denial`.

In order, cheapest and least revealing first: the connection rate of the client's address
(WebSocket sessions), the browser origin, the carrier's signature or the credentials, the key's
engine and scopes. The concurrent caps are counted separately (:meth:`Gate.admit`), for as long
as a WebSocket stays open. Pure apart from the carriers' checks it is handed: ``now`` comes in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from starlette.requests import HTTPConnection

from duplex_gateway.auth.credentials import presented
from duplex_gateway.auth.keys import KeyStore
from duplex_gateway.auth.limits import CapReached, RateLimiter, SessionCaps, SessionHold, retry_after
from duplex_gateway.auth.policy import (
    AUTH_CHECK_PATH,
    HTTP_RULES,
    Denial,
    Open,
    OriginPolicy,
    Requirement,
    requirement,
)
from duplex_gateway.auth.principal import (
    ANONYMOUS,
    CLIENT_SECRET_SCOPES,
    Principal,
    PrincipalKind,
    Scope,
)
from duplex_gateway.auth.tokens import TOKEN_PREFIX, TokenError, TokenExpired, TokenSigner
from duplex_gateway.config import GatewaySettings
from duplex_gateway.vocabulary.errors import ErrorCode

__all__ = ["CAPACITY_RETRY_AFTER_S", "Gate", "SignatureCheck", "client_address", "route_path"]

logger = logging.getLogger(__name__)

#: ``Retry-After`` of a 503 for a full cap: when a session ends is not known, so a short guess.
CAPACITY_RETRY_AFTER_S = 5


@dataclass(frozen=True, slots=True, kw_only=True)
class SignatureCheck:
    """A carrier's own proof for one endpoint, checked by the auth layer instead of an API key."""

    carrier: str
    path: str
    #: HTTP methods it covers; ``"WEBSOCKET"`` for a media stream's upgrade.
    methods: frozenset[str]
    #: Whether ``(connection, body)`` carries the carrier's valid signature.
    verify: Callable[[HTTPConnection, bytes], bool]
    #: Above 0, the request body (at most this many bytes, else 413) is read for ``verify``.
    max_body_bytes: int = 0


def route_path(conn: HTTPConnection) -> str:
    path: str = conn.scope["path"]
    root: str = conn.scope.get("root_path", "")
    return path[len(root) :] if root and path.startswith(root) else path


def client_address(conn: HTTPConnection) -> str | None:
    """The client's IP (the server puts a trusted proxy's ``X-Forwarded-For`` there)."""
    client = conn.scope.get("client")
    return str(client[0]) if client else None


class Gate:
    """Decides who a request is and whether it may go on."""

    def __init__(
        self,
        *,
        keys: KeyStore,
        signer: TokenSigner,
        engine: str,
        origins: OriginPolicy | None = None,
        checks: Sequence[SignatureCheck] = (),
        rate: RateLimiter | None = None,
        caps: SessionCaps | None = None,
        http_rules: Sequence[tuple[str, Scope]] = HTTP_RULES,
    ) -> None:
        self.keys = keys
        self.signer = signer
        self.engine = engine
        self.origins = origins or OriginPolicy()
        self.rate = rate
        self.caps = caps or SessionCaps()
        self.http_rules = tuple(http_rules)
        self._checks: Mapping[tuple[str, str], SignatureCheck] = {
            (check.path, method): check for check in checks for method in check.methods
        }

    @classmethod
    def from_settings(cls, settings: GatewaySettings, checks: Sequence[SignatureCheck] = ()) -> Gate:
        limits = settings.limits
        per_minute = limits.connections_per_minute_per_ip
        return cls(
            keys=KeyStore.from_settings(settings.auth),
            signer=TokenSigner.from_setting(settings.auth.token_secret),
            engine=settings.engine.name,
            origins=OriginPolicy(settings.auth.allowed_origins),
            checks=checks,
            rate=RateLimiter(per_minute) if per_minute else None,
            caps=SessionCaps(limits.max_sessions_per_ip),
        )

    # -- the decision ----------------------------------------------------------------------

    def signature_check(self, conn: HTTPConnection) -> SignatureCheck | None:
        """The carrier check that covers this request, if one is configured."""
        method = "WEBSOCKET" if conn.scope["type"] == "websocket" else conn.scope.get("method", "GET")
        return self._checks.get((route_path(conn), method))

    def requirement(self, conn: HTTPConnection) -> Requirement:
        return requirement(conn.scope["type"], route_path(conn), conn.query_params, self.http_rules)

    def decide(self, conn: HTTPConnection, *, now: float, body: bytes = b"") -> Principal | Denial:
        """Who ``conn`` is, or why it is refused. A WebSocket handshake to a session spends a rate token."""
        need = self.requirement(conn)
        websocket = conn.scope["type"] == "websocket"
        probe = not websocket and route_path(conn) == AUTH_CHECK_PATH
        address = client_address(conn)
        # Carriers stream many calls from few addresses: the per-address limits are for clients.
        if (
            (websocket or probe)
            and need is not Open.CARRIER
            and self.rate is not None
            and address is not None
        ):
            wait = self.rate.wait_s(address, now) if probe else self.rate.take(address, now)
            if wait > 0:
                return Denial(
                    429,
                    ErrorCode.RATE_LIMITED,
                    f"too many connections from this address (at most "
                    f"{int(self.rate.capacity)} a minute); try again in {retry_after(wait)} s",
                    retry_after_s=retry_after(wait),
                    reason="rate",
                )
        if not self.origins.allows(conn.headers.get("origin"), conn.headers.get("host")):
            return Denial(
                403,
                ErrorCode.ORIGIN_NOT_ALLOWED,
                "this origin may not use the gateway (auth.allowed_origins)",
                reason="origin",
            )
        if need is Open.PUBLIC:
            return ANONYMOUS
        if need is Open.CARRIER:
            return self._carrier(conn, body)
        return self._keyed(conn, need, now)

    def _carrier(self, conn: HTTPConnection, body: bytes) -> Principal | Denial:
        check = self.signature_check(conn)
        if check is not None:
            if check.verify(conn, body):
                return Principal(
                    kind=PrincipalKind.CARRIER, name=f"carrier:{check.carrier}", scopes=frozenset()
                )
            # Carriers read only the status; a webhook keeps its plain-text answer.
            return Denial(
                403,
                ErrorCode.INVALID_SIGNATURE,
                "invalid signature",
                plain=conn.scope["type"] == "http",
                reason="signature",
            )
        # No signature configured for it: open, as before keys existed. API keys are not asked for,
        # nor read: a carrier sends none of ours (its own JWT may ride in Authorization).
        carrier = route_path(conn).removeprefix("/telephony").strip("/").split("/")[0] or "detect"
        return Principal(kind=PrincipalKind.CARRIER, name=f"carrier:{carrier[:32]}", scopes=frozenset())

    def _keyed(self, conn: HTTPConnection, need: Scope, now: float) -> Principal | Denial:
        principal = self.authenticate(conn, now=now)
        if isinstance(principal, Denial):
            return principal
        if need is Scope.CLIENT_SECRETS and principal.kind is PrincipalKind.CLIENT_SECRET:
            return Denial(
                403,
                ErrorCode.FORBIDDEN,
                "a client secret cannot mint client secrets; use an API key",
                reason="scope",
            )
        if need not in principal.scopes:
            return Denial(
                403,
                ErrorCode.FORBIDDEN,
                f"the key {principal.name!r} does not have the {need} scope",
                reason="scope",
            )
        return principal

    def authenticate(self, conn: HTTPConnection, *, now: float) -> Principal | Denial:
        """The key or client secret ``conn`` presents; anonymous when no key is configured."""
        credentials = presented(conn.headers, conn.query_params)
        expired = False
        for credential in credentials:
            if credential.secret.startswith(TOKEN_PREFIX):
                try:
                    claims = self.signer.verify(credential.secret, now=now)
                except TokenExpired:
                    expired = True
                    continue
                except TokenError:
                    continue
                if not self.keys.enabled and claims.key_name == ANONYMOUS.name:
                    # Authentication is off: the secret only brings its session along.
                    return replace(ANONYMOUS, expires_at=claims.expires_at, session=claims.session)
                minted_by = self.keys.named(claims.key_name)
                if minted_by is None:
                    continue  # the key is gone, and its secrets with it
                if not minted_by.for_engine(self.engine):
                    return self._other_engine(minted_by.name)
                return Principal(
                    kind=PrincipalKind.CLIENT_SECRET,
                    name=minted_by.name,
                    scopes=claims.scopes & minted_by.scopes & CLIENT_SECRET_SCOPES,
                    max_sessions=minted_by.max_sessions,
                    expires_at=claims.expires_at,
                    record=minted_by.record,
                    session=claims.session,
                )
            key = self.keys.find(credential.secret)
            if key is not None:
                if not key.for_engine(self.engine):
                    return self._other_engine(key.name)
                return Principal(
                    kind=PrincipalKind.KEY,
                    name=key.name,
                    scopes=key.scopes,
                    max_sessions=key.max_sessions,
                    record=key.record,
                )
        if not self.keys.enabled:
            return ANONYMOUS
        if expired:
            return Denial(
                401,
                ErrorCode.UNAUTHORIZED,
                "the client secret has expired; mint a new one",
                reason="expired_secret",
            )
        if not credentials:
            return Denial(
                401,
                ErrorCode.UNAUTHORIZED,
                "a valid API key is required (Authorization: Bearer KEY, or the subprotocol "
                "openai-insecure-api-key.KEY)",
                reason="missing_key",
            )
        return Denial(401, ErrorCode.UNAUTHORIZED, "the API key is not valid", reason="invalid_key")

    def _other_engine(self, name: str) -> Denial:
        return Denial(
            403, ErrorCode.FORBIDDEN, f"the key {name!r} is not for the {self.engine} engine", reason="engine"
        )

    # -- the caps ----------------------------------------------------------------------------

    def _cap_denial(self, reached: CapReached, principal: Principal) -> Denial:
        if reached.who == "key":
            message = f"the key {principal.name!r} has its {reached.limit} sessions open; try again later"
        else:
            message = f"this address has its {reached.limit} sessions open; try again later"
        return Denial(
            503,
            ErrorCode.SESSION_LIMIT,
            message,
            retry_after_s=CAPACITY_RETRY_AFTER_S,
            reason=f"{reached.who}_cap",
        )

    def _counted(self, conn: HTTPConnection, principal: Principal) -> tuple[str | None, str | None]:
        key = principal.name if principal.is_key else None
        # A carrier's address is its media server, shared by every call.
        address = None if principal.kind is PrincipalKind.CARRIER else client_address(conn)
        return key, address

    def admit(self, conn: HTTPConnection, principal: Principal) -> SessionHold | Denial:
        """Count a WebSocket session against its key's and its address's caps, or refuse it (503)."""
        key, address = self._counted(conn, principal)
        held = self.caps.acquire(key, principal.max_sessions, address)
        return self._cap_denial(held, principal) if isinstance(held, CapReached) else held

    def would_admit(self, conn: HTTPConnection, principal: Principal) -> Denial | None:
        """What :meth:`admit` would answer now, counting nothing (``/v1/auth/check``)."""
        key, address = self._counted(conn, principal)
        reached = self.caps.check(key, principal.max_sessions, address)
        return None if reached is None else self._cap_denial(reached, principal)
