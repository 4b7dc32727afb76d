"""Client secrets: round trip, expiry, tampering, another gateway's secret, size."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import pytest

from duplex_gateway.auth.principal import Scope
from duplex_gateway.auth.tokens import (
    MAX_TOKEN_CHARS,
    TOKEN_PREFIX,
    TokenError,
    TokenExpired,
    TokenSigner,
)

SECRET = b"s" * 32
NOW = 1_800_000_000.0


def _mint(signer: TokenSigner | None = None, **kwargs: object) -> str:
    options: dict[str, Any] = {"key_name": "web", "scopes": [Scope.REALTIME], "now": NOW, "ttl_s": 600}
    options.update(kwargs)
    token, _ = (signer or TokenSigner(SECRET)).mint(**options)
    return token


def test_round_trip() -> None:
    signer = TokenSigner(SECRET)
    session = {"type": "realtime", "instructions": "Sé breve.", "audio": {"output": {"voice": "alloy"}}}
    token, claims = signer.mint(
        key_name="web", scopes=[Scope.REALTIME, Scope.DUPLEX], now=NOW, ttl_s=600, session=session
    )
    assert token.startswith(TOKEN_PREFIX) and claims.expires_at == int(NOW) + 600
    # A subprotocol token: only characters a Sec-WebSocket-Protocol value may carry.
    assert all(c.isalnum() or c in "-_." for c in token)
    read = signer.verify(token, now=NOW + 599)
    assert read.key_name == "web" and read.scopes == {Scope.REALTIME, Scope.DUPLEX}
    assert read.issued_at == int(NOW) and read.expires_at == int(NOW) + 600 and read.session == session
    assert read.nonce == claims.nonce and len(read.nonce) >= 12
    # Two secrets minted at once differ.
    assert _mint(signer) != _mint(signer)


def test_expiry() -> None:
    token = _mint(ttl_s=60)
    signer = TokenSigner(SECRET)
    signer.verify(token, now=NOW + 59.9)
    with pytest.raises(TokenExpired):
        signer.verify(token, now=NOW + 60)
    assert issubclass(TokenExpired, TokenError)


def test_another_secret_is_refused() -> None:
    with pytest.raises(TokenError, match="signature"):
        TokenSigner(b"o" * 32).verify(_mint(), now=NOW)
    # An ephemeral secret of another process too.
    with pytest.raises(TokenError):
        TokenSigner.from_setting(None).verify(_mint(TokenSigner.from_setting(None)), now=NOW)


def test_tampering_is_refused() -> None:
    token = _mint()
    signed, _, signature = token.rpartition(".")
    payload = json.loads(zlib.decompress(base64.urlsafe_b64decode(signed[3:] + "==")))
    payload["s"], payload["exp"] = ["realtime", "admin"], payload["exp"] + 10_000
    forged = TOKEN_PREFIX + base64.urlsafe_b64encode(
        zlib.compress(json.dumps(payload).encode())
    ).decode().rstrip("=")
    signer = TokenSigner(SECRET)
    for bad in (
        f"{forged}.{signature}",  # altered claims, old signature
        f"{signed}.{signature[:-2]}AA",  # altered signature
        signed,  # no signature
        f"{signed}.",
        f"{signed}.{signature}x",
        "ek_",
        "ek_.",
        "sk-not-a-token",
        "ek_" + "A" * (MAX_TOKEN_CHARS + 1),
    ):
        with pytest.raises(TokenError):
            signer.verify(bad, now=NOW)


def test_a_signed_but_unreadable_payload_is_refused() -> None:
    signer = TokenSigner(SECRET)
    for packed in (
        b"not deflate",
        zlib.compress(b"[1,2]"),
        zlib.compress(b'{"v":2}'),
        zlib.compress(b'{"v":1,"k":"web","s":["root"],"iat":1,"exp":9999999999}'),
    ):
        signed = TOKEN_PREFIX + base64.urlsafe_b64encode(packed).decode().rstrip("=")
        token = f"{signed}.{base64.urlsafe_b64encode(signer._sign(signed)).decode().rstrip('=')}"
        with pytest.raises(TokenError):
            signer.verify(token, now=NOW)


def test_size_is_bounded() -> None:
    import secrets

    huge = {"instructions": secrets.token_hex(4000)}  # random: does not deflate
    with pytest.raises(ValueError, match="characters"):
        _mint(session=huge)
    # Ordinary instructions, even long ones, deflate well below the bound.
    _mint(session={"instructions": "Answer briefly and kindly. " * 300})


def test_secret_settings() -> None:
    assert TokenSigner.from_setting(None).ephemeral
    assert not TokenSigner.from_setting("x" * 32).ephemeral
    with pytest.raises(ValueError):
        TokenSigner(b"short")
