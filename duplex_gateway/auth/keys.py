"""API keys as the gateway keeps them: a name, the SHA-256 of the key, what it may do. Never the key.

A presented secret is hashed once and compared with every stored hash in constant time, with no
early exit, so neither the time taken nor the order of the keys tells which key came close.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from duplex_gateway.auth.principal import ALL_SCOPES, Scope
from duplex_gateway.config import AuthSettings

__all__ = ["HASH_PREFIX", "ApiKey", "KeyStore", "hash_key"]

HASH_PREFIX = "sha256:"


def hash_key(key: str) -> str:
    """``sha256:<hex>`` of ``key``: what ``auth.keys[].hash`` holds."""
    return HASH_PREFIX + hashlib.sha256(key.encode()).hexdigest()


def _digest(hashed: str) -> bytes:
    if not hashed.startswith(HASH_PREFIX):
        raise ValueError(f"a key hash starts with {HASH_PREFIX!r}")
    digest = bytes.fromhex(hashed[len(HASH_PREFIX) :])
    if len(digest) != 32:
        raise ValueError("a SHA-256 key hash has 64 hex digits")
    return digest


@dataclass(frozen=True, slots=True, kw_only=True)
class ApiKey:
    """One configured key."""

    name: str
    digest: bytes
    scopes: frozenset[Scope] = ALL_SCOPES
    #: Engines the key is for; empty: any.
    engines: frozenset[str] = frozenset()
    max_sessions: int | None = None
    #: Record this key's sessions (``recording:``), whatever ``recording.enabled`` says.
    record: bool = False

    def __repr__(self) -> str:  # the digest stays out of logs too
        return f"ApiKey(name={self.name!r}, scopes={sorted(self.scopes)}, max_sessions={self.max_sessions})"

    def for_engine(self, engine: str) -> bool:
        return not self.engines or engine in self.engines


class KeyStore:
    """The configured keys, looked up by a presented secret or by name."""

    def __init__(self, keys: Iterable[ApiKey] = ()) -> None:
        self._keys = tuple(keys)
        self._by_name: Mapping[str, ApiKey] = {key.name: key for key in self._keys}
        if len(self._by_name) != len(self._keys):
            raise ValueError("two API keys have the same name")

    @classmethod
    def from_plaintext(cls, keys: Iterable[str]) -> KeyStore:
        """All-scopes keys from plaintext (``auth.api_keys``), named ``key-<first 8 hex of the hash>``."""
        out: dict[str, ApiKey] = {}
        for key in keys:
            hashed = hash_key(key)
            name = "key-" + hashed[len(HASH_PREFIX) : len(HASH_PREFIX) + 8]
            out.setdefault(name, ApiKey(name=name, digest=_digest(hashed)))
        return cls(out.values())

    @classmethod
    def from_settings(cls, auth: AuthSettings) -> KeyStore:
        """``auth.keys`` and the older ``auth.api_keys`` (each an all-scopes key)."""
        keys = [
            ApiKey(
                name=entry.name,
                digest=_digest(entry.hash),
                scopes=frozenset(Scope(scope) for scope in entry.scopes),
                engines=frozenset(entry.engines),
                max_sessions=entry.max_sessions,
                record=entry.record,
            )
            for entry in auth.keys
        ]
        names, digests = {key.name for key in keys}, {key.digest for key in keys}
        keys.extend(
            key
            for key in cls.from_plaintext(auth.api_keys)._keys
            if key.name not in names and key.digest not in digests
        )
        return cls(keys)

    @property
    def enabled(self) -> bool:
        """Whether any key is configured: without one, the gateway does no authentication."""
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def find(self, secret: str) -> ApiKey | None:
        """The key whose hash ``secret`` has, compared with every key in constant time."""
        digest = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).digest()
        found: ApiKey | None = None
        for key in self._keys:
            if hmac.compare_digest(digest, key.digest):
                found = key
        return found

    def named(self, name: str) -> ApiKey | None:
        return self._by_name.get(name)
