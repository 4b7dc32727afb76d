"""The state store's interface: what a gateway asks of it, whatever holds the data."""

from __future__ import annotations

import abc
from collections.abc import Sequence

from duplex_gateway.state.records import Replay, SessionRecord, Write

__all__ = ["StateStore", "StoreUnavailable"]


class StoreUnavailable(Exception):
    """The store did not answer in time, or refused the connection."""


class StateStore(abc.ABC):
    """Sessions' shared state. Every call is bounded in time and raises :class:`StoreUnavailable`.

    A session's data expires unless its owner renews it (:meth:`renew`), so a gateway
    that dies leaves nothing behind for longer than its lease and the session's grace.
    """

    #: The longest one call may take.
    timeout_s: float = 1.0

    @abc.abstractmethod
    async def ping(self) -> None:
        """Return if the store answers."""

    @abc.abstractmethod
    async def write(self, batch: Sequence[Write]) -> None:
        """Make ``batch``'s writes, in order, in one round trip where the store can."""

    @abc.abstractmethod
    async def load(self, session_id: str) -> SessionRecord | None:
        """The session's record (None: no such session, or it expired)."""

    @abc.abstractmethod
    async def replay(self, session_id: str, after_seq: int) -> Replay:
        """What the session's journal holds after ``after_seq``."""

    @abc.abstractmethod
    async def take_lease(self, session_id: str, owner: str, ttl_ms: int, *, unless_held: bool) -> bool:
        """Make ``owner`` the session's owner for ``ttl_ms``; returns whether it did.

        ``unless_held``: only if no other owner holds an unexpired lease (a takeover);
        otherwise unconditionally (the gateway that opened the session).
        """

    @abc.abstractmethod
    async def release_lease(self, session_id: str, owner: str) -> None:
        """Give up ``owner``'s lease at once (if it still holds it): another gateway may take the session now."""

    @abc.abstractmethod
    async def owner(self, session_id: str) -> str | None:
        """Who holds the session's lease now (None: nobody; it expired or was never taken)."""

    @abc.abstractmethod
    async def renew(self, owner: str, session_ids: Sequence[str], ttl_ms: int) -> list[str]:
        """Extend ``owner``'s leases and the sessions' data; returns the ids it no longer owns."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the connection."""
