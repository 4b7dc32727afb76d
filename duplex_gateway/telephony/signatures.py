"""Carriers' webhook signatures: pure functions, every comparison in constant time.

* Twilio ``X-Twilio-Signature``: base64 HMAC-SHA1, keyed with the auth token, over the
  full URL Twilio requested followed by every POST parameter's name and value, sorted
  by name (a repeated name: its distinct values, sorted). A JSON body is not among the
  parameters: Twilio puts ``bodySHA256=<hex SHA-256 of the body>`` in the URL, signs the
  URL alone, and the body must hash to that value. Twilio's own signing is not
  consistent about the default port, so the URL is tried with and without it.
* Plivo ``X-Plivo-Signature-V3``: base64 HMAC-SHA256, keyed with the auth token, over
  the URL (query sorted; POST parameters appended), a dot and the
  ``X-Plivo-Signature-V3-Nonce``; the header may hold several signatures, comma-separated.
* Telnyx ``telnyx-signature-ed25519``: a base64 Ed25519 signature of
  ``<telnyx-timestamp>|<raw body>`` by the key whose public half the portal shows
  (base64), with the timestamp within a tolerance of the local clock.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, parse_qsl, urlsplit, urlunsplit

if TYPE_CHECKING:
    # cryptography comes with the telephony extra; only Telnyx's Ed25519 signatures use it.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "Params",
    "plivo_v3_signature",
    "telnyx_public_key",
    "twilio_body_hash",
    "twilio_signature",
    "url_port_variants",
    "validate_plivo_v3",
    "validate_telnyx",
    "validate_twilio",
]

#: Request parameters: a mapping (a value may be a list, for a repeated name) or (name, value) pairs.
Params = Mapping[str, str | Sequence[str]] | Iterable[tuple[str, str]]

_DEFAULT_PORTS = {"https": 443, "wss": 443, "http": 80, "ws": 80}


def _multi(params: Params | None) -> dict[str, list[str]]:
    """``params`` as every name's values, in the order given."""
    out: dict[str, list[str]] = {}
    if params is None:
        return out
    items: Iterable[tuple[str, str | Sequence[str]]]
    items = params.items() if isinstance(params, Mapping) else params
    for name, value in items:
        values = out.setdefault(name, [])
        if isinstance(value, str):
            values.append(value)
        else:
            values.extend(value)
    return out


def _equal(a: str | bytes, b: str | bytes) -> bool:
    a_bytes = a.encode() if isinstance(a, str) else a
    b_bytes = b.encode() if isinstance(b, str) else b
    return hmac.compare_digest(a_bytes, b_bytes)


def url_port_variants(url: str) -> list[str]:
    """``url`` as given, without its port, and with the scheme's default port (duplicates dropped)."""
    parts = urlsplit(url)
    variants = [url]
    host = parts.hostname
    if host is None:
        return variants
    if ":" in host:  # an IPv6 literal keeps its brackets
        host = f"[{host}]"
    userinfo = parts.netloc.rpartition("@")[0]
    prefix = f"{userinfo}@" if userinfo else ""
    try:
        port = parts.port
    except ValueError:
        return variants
    without = urlunsplit(parts._replace(netloc=prefix + host))
    variants.append(without)
    default = _DEFAULT_PORTS.get(parts.scheme.lower())
    if port is None and default is not None:
        variants.append(urlunsplit(parts._replace(netloc=f"{prefix}{host}:{default}")))
    return list(dict.fromkeys(variants))


# -- Twilio -----------------------------------------------------------------------------------


def twilio_signature(auth_token: str, url: str, params: Params | None = None) -> str:
    """The ``X-Twilio-Signature`` Twilio sends for a request to ``url`` with POST ``params``."""
    message = url
    multi = _multi(params)
    for name in sorted(multi):
        for value in sorted(set(multi[name])):
            message += name + value
    digest = hmac.new(auth_token.encode(), message.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def twilio_body_hash(body: bytes | str) -> str:
    """The ``bodySHA256`` Twilio puts in the URL of a request with a JSON body."""
    return hashlib.sha256(body.encode() if isinstance(body, str) else body).hexdigest()


def validate_twilio(
    auth_token: str,
    url: str,
    params: Params | None,
    signature: str | None,
    *,
    body: bytes | str | None = None,
) -> bool:
    """Whether ``signature`` is Twilio's for ``url`` and ``params``.

    If the URL carries ``bodySHA256``, the parameters are not signed and ``body`` (the raw
    request body) must hash to that value.
    """
    if not signature or not auth_token:
        return False
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    body_ok = True
    if "bodySHA256" in query:
        body_ok = body is not None and _equal(twilio_body_hash(body), query["bodySHA256"][0])
        params = None
    matches = [_equal(twilio_signature(auth_token, candidate, params), signature.strip())
               for candidate in url_port_variants(url)]
    return body_ok and any(matches)


# -- Plivo ------------------------------------------------------------------------------------


def _plivo_signed_url(url: str, params: Params | None, method: str) -> str:
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    query = _multi(parse_qsl(parts.query, keep_blank_values=True))
    posted = _multi(params)
    if method.upper() == "GET":
        for name, values in posted.items():  # a GET's parameters are its query
            query.setdefault(name, []).extend(values)
        posted = {}
    sorted_query = "&".join(
        f"{name}={value}" for name in sorted(query) for value in sorted(query[name])
    )
    if sorted_query or posted:
        base += "?" + sorted_query
    if sorted_query and posted:
        base += "."
    return base + "".join(name + value for name in sorted(posted) for value in sorted(posted[name]))


def plivo_v3_signature(
    auth_token: str, url: str, nonce: str, params: Params | None = None, method: str = "POST"
) -> str:
    """The ``X-Plivo-Signature-V3`` Plivo sends for a ``method`` request to ``url`` with ``params``."""
    message = f"{_plivo_signed_url(url, params, method)}.{nonce}"
    digest = hmac.new(auth_token.encode(), message.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def validate_plivo_v3(
    auth_token: str,
    url: str,
    nonce: str | None,
    signatures: str | None,
    params: Params | None = None,
    method: str = "POST",
) -> bool:
    """Whether any of the comma-separated ``signatures`` is Plivo's for this request."""
    if not signatures or nonce is None or not auth_token:
        return False
    expected = plivo_v3_signature(auth_token, url, nonce, params, method)
    matches = [_equal(expected, given.strip()) for given in signatures.split(",")]
    return any(matches)


# -- Telnyx -----------------------------------------------------------------------------------


def telnyx_public_key(key: str) -> Ed25519PublicKey:
    """The Ed25519 public key the Telnyx portal shows (base64 of 32 bytes, or PEM).

    ``ValueError`` if ``key`` is not one; ``ImportError`` without the telephony extra.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = key.strip()
    if text.startswith("-----BEGIN"):
        loaded = load_pem_public_key(text.encode())
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("the Telnyx public key is not an Ed25519 key")
        return loaded
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ValueError("the Telnyx public key is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"the Telnyx public key must be 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def validate_telnyx(
    public_key: Ed25519PublicKey | str,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
    *,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether ``signature`` signs ``timestamp|payload``, ``timestamp`` within ``tolerance_s`` of now."""
    if not signature or not timestamp:
        return False
    try:
        stamp = int(timestamp.strip())
        raw_signature = base64.b64decode(signature.strip(), validate=True)
        key = telnyx_public_key(public_key) if isinstance(public_key, str) else public_key
    except ValueError:  # binascii.Error is a ValueError
        return False
    from cryptography.exceptions import InvalidSignature

    clock = time.time() if now is None else now
    if abs(clock - stamp) > tolerance_s:
        return False
    try:
        key.verify(raw_signature, timestamp.strip().encode() + b"|" + payload)
    except InvalidSignature:
        return False
    return True
