"""The secrets a request presents, wherever it carries them. Pure: headers and query in, strings out.

* ``Authorization: Bearer <key>`` (the ``openai`` SDKs; server-side clients);
* ``X-API-Key: <key>`` (HTTP clients that cannot set ``Authorization``);
* the WebSocket subprotocol ``openai-insecure-api-key.<key>``, which is how a browser, unable to set
  headers on a WebSocket, sends a key (OpenAI's own browser flow sends a client secret this way);
* ``openai-insecure-api-key.b64.<base64url of the key's UTF-8, unpadded>``: a key a subprotocol
  token cannot carry (a space, ``/``, ``=``, non-ASCII). The ``b64.`` form is read in every place;
* ``?api_key=<key>``: kept for older clients only. URLs end up in logs (the server's access log
  among them), so it is discouraged.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["ENCODED_PREFIX", "KEY_PROTOCOL_PREFIX", "Credential", "offered_subprotocols", "presented"]

KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."
ENCODED_PREFIX = "b64."
#: Longer values are not keys (a header line holds at most 8 KiB anyway).
_MAX_CHARS = 8192


@dataclass(frozen=True, slots=True)
class Credential:
    """One secret a request presented, and where (for logs; never the secret itself)."""

    secret: str
    source: str  # "bearer", "x-api-key", "subprotocol", "query"


def offered_subprotocols(headers: Mapping[str, str]) -> list[str]:
    """The subprotocols a WebSocket handshake offers, in order."""
    value = headers.get("sec-websocket-protocol", "")
    return [p.strip() for p in value.split(",") if p.strip()]


def _decoded(value: str) -> str | None:
    if not value.startswith(ENCODED_PREFIX):
        return None
    data = value[len(ENCODED_PREFIX) :]
    with contextlib.suppress(binascii.Error, UnicodeDecodeError, ValueError):
        return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)).decode()
    return None


def presented(headers: Mapping[str, str], query: Mapping[str, str]) -> list[Credential]:
    """Every secret in ``headers`` (lower-case names) and ``query``, in the order they are tried."""
    raw: list[tuple[str, str]] = []
    authorization = headers.get("authorization", "")
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() == "bearer" and rest.strip():
        raw.append((rest.strip(), "bearer"))
    if api_key := headers.get("x-api-key", "").strip():
        raw.append((api_key, "x-api-key"))
    raw.extend(
        (protocol[len(KEY_PROTOCOL_PREFIX) :], "subprotocol")
        for protocol in offered_subprotocols(headers)
        if protocol.startswith(KEY_PROTOCOL_PREFIX) and len(protocol) > len(KEY_PROTOCOL_PREFIX)
    )
    if api_key := query.get("api_key", ""):
        raw.append((api_key, "query"))
    out: list[Credential] = []
    for secret, source in raw:
        if len(secret) > _MAX_CHARS:
            continue
        out.append(Credential(secret, source))
        # A key may itself begin with "b64.": both readings are tried.
        if (decoded := _decoded(secret)) is not None and decoded:
            out.append(Credential(decoded, source))
    return out
