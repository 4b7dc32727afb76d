"""Client secrets (ephemeral keys): short-lived tokens the gateway signs and later accepts as keys.

A token is ``ek_<payload>.<signature>``: the payload is the claims as compact JSON, deflated and
base64url-encoded; the signature is HMAC-SHA256 over ``ek_<payload>`` with a key derived from the
server secret, base64url. Nothing in a token is secret (it names its key, scopes and expiry, and
carries the session configuration in the clear); it only cannot be forged or altered. The
signature is checked, in constant time, before anything in the payload is read or inflated.

Pure: the clock comes in as ``now``; randomness only for the nonce and an unset secret.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import secrets
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from duplex_gateway.auth.principal import Scope

__all__ = ["MAX_TOKEN_CHARS", "TOKEN_PREFIX", "TokenClaims", "TokenError", "TokenExpired", "TokenSigner"]

TOKEN_PREFIX = "ek_"
#: Longest token minted or read: it travels in a subprotocol header, and header lines are
#: capped at 8 KiB by the server's WebSocket layer.
MAX_TOKEN_CHARS = 4096
_VERSION = 1
_MAX_PAYLOAD_BYTES = 64 << 10
_LABEL = b"duplex-gateway client secret v1"
_SCOPE_NAMES = frozenset(scope.value for scope in Scope)


class TokenError(Exception):
    """Not a valid client secret (the message says why, in words fit for the client)."""


class TokenExpired(TokenError):
    """A genuine client secret past its expiry."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenClaims:
    key_name: str
    scopes: frozenset[Scope]
    issued_at: int
    expires_at: int
    #: The session configuration the secret was minted with (Realtime wire JSON), if any.
    session: Mapping[str, object] | None = None
    nonce: str = ""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class TokenSigner:
    """Mints and verifies client secrets with one server secret."""

    def __init__(self, secret: bytes, *, ephemeral: bool = False) -> None:
        if len(secret) < 16:
            raise ValueError("a token secret has at least 16 bytes")
        self._key = hmac.new(secret, _LABEL, hashlib.sha256).digest()
        #: Whether the secret is this process's own random one.
        self.ephemeral = ephemeral

    @classmethod
    def from_setting(cls, secret: str | None) -> TokenSigner:
        """``auth.token_secret``, or a random secret when it is unset (tokens then die with the process)."""
        if secret:
            return cls(secret.encode())
        return cls(secrets.token_bytes(32), ephemeral=True)

    def _sign(self, signed: str) -> bytes:
        return hmac.new(self._key, signed.encode("ascii"), hashlib.sha256).digest()

    def mint(
        self,
        *,
        key_name: str,
        scopes: Iterable[Scope],
        now: float,
        ttl_s: int,
        session: Mapping[str, object] | None = None,
    ) -> tuple[str, TokenClaims]:
        """A new token and its claims. ``ValueError`` if it would be longer than :data:`MAX_TOKEN_CHARS`."""
        claims = TokenClaims(
            key_name=key_name,
            scopes=frozenset(scopes),
            issued_at=int(now),
            expires_at=int(now) + ttl_s,
            session=session,
            nonce=_b64(secrets.token_bytes(9)),
        )
        body: dict[str, object] = {
            "v": _VERSION,
            "k": claims.key_name,
            "s": sorted(claims.scopes),
            "iat": claims.issued_at,
            "exp": claims.expires_at,
            "n": claims.nonce,
        }
        if session is not None:
            body["c"] = session
        packed = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        signed = TOKEN_PREFIX + _b64(zlib.compress(packed, 9))
        token = f"{signed}.{_b64(self._sign(signed))}"
        if len(token) > MAX_TOKEN_CHARS:
            raise ValueError(
                f"the client secret would be {len(token)} characters, more than {MAX_TOKEN_CHARS}"
            )
        return token, claims

    def verify(self, token: str, *, now: float) -> TokenClaims:
        """The claims of ``token``; :class:`TokenExpired` or :class:`TokenError` if it is not accepted."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            raise TokenError("not a client secret")
        signed, dot, signature = token.rpartition(".")
        if not dot:
            raise TokenError("not a client secret")
        try:
            given = _unb64(signature)
        except (binascii.Error, ValueError):
            raise TokenError("not a client secret") from None
        if _b64(given) != signature:
            # Only the form the gateway wrote: base64 decoding also takes "/" for "_", "+" for "-"
            # and ignores a last character's spare bits, so an altered string could pass.
            raise TokenError("not a client secret")
        if not hmac.compare_digest(self._sign(signed), given):
            raise TokenError("the client secret's signature does not match (another gateway's, or altered)")
        try:
            inflater = zlib.decompressobj()
            packed = inflater.decompress(_unb64(signed[len(TOKEN_PREFIX) :]), _MAX_PAYLOAD_BYTES)
            data = json.loads(packed)
        except (binascii.Error, ValueError, zlib.error):
            raise TokenError("the client secret cannot be read") from None
        claims = _claims(data)
        if now >= claims.expires_at:
            raise TokenExpired("the client secret has expired")
        return claims


def _claims(data: object) -> TokenClaims:
    if not isinstance(data, dict) or data.get("v") != _VERSION:
        raise TokenError("the client secret is of an unknown version")
    name, scopes, issued, expires = data.get("k"), data.get("s"), data.get("iat"), data.get("exp")
    session = data.get("c")
    if (
        not isinstance(name, str)
        or not isinstance(scopes, list)
        or not all(isinstance(s, str) and s in _SCOPE_NAMES for s in scopes)
        or not isinstance(issued, int)
        or not isinstance(expires, int)
        or (session is not None and not isinstance(session, dict))
    ):
        raise TokenError("the client secret cannot be read")
    return TokenClaims(
        key_name=name,
        scopes=frozenset(Scope(s) for s in scopes),
        issued_at=issued,
        expires_at=expires,
        session=session,
        nonce=str(data.get("n", "")),
    )
