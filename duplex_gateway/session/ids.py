"""The ids a session gives what it makes: caller and reply items, replies, function calls."""

from __future__ import annotations

import itertools
import secrets

__all__ = ["IdFactory"]


class IdFactory:
    """Ids as ``<prefix>_<salt><n>``: in order within one session, the salt telling sessions apart."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)
        self._salt = secrets.token_hex(4)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{self._salt}{next(self._counter):05d}"
