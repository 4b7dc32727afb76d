"""What the carriers' webhook signatures share: pure helpers, every comparison in constant time.

Each carrier's own signature (what it signs, with which key) lives in its module under
:mod:`duplex_gateway.telephony.carriers`; these are the pieces they have in common.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

__all__ = ["Params", "equal", "multi", "url_port_variants"]

#: Request parameters: a mapping (a value may be a list, for a repeated name) or (name, value) pairs.
Params = Mapping[str, str | Sequence[str]] | Iterable[tuple[str, str]]

_DEFAULT_PORTS = {"https": 443, "wss": 443, "http": 80, "ws": 80}


def multi(params: Params | None) -> dict[str, list[str]]:
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


def equal(a: str | bytes, b: str | bytes) -> bool:
    """``a == b`` in constant time."""
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
