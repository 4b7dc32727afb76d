"""Claiming a session from its copy in the state store, for a resume that reached another gateway.

Checks, in order: the copy exists and the resume token is its token; its owner's lease
has lapsed (waiting up to ``wait_ms`` for a gateway that just died to stop renewing it),
which this gateway then holds; the journal still covers what the client missed. The
caller builds the session from what this returns.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from duplex_gateway.state.records import Replay, SessionRecord, token_matches
from duplex_gateway.state.store import StateStore, StoreUnavailable

__all__ = ["Claimed", "Refusal", "TakeoverRefused", "claim"]

#: How often a held lease is tried again while waiting for it to lapse.
_RETRY_S = 0.1


class Refusal(enum.Enum):
    """Why a session could not be taken over."""

    #: No copy, or another token: the client must open a new session.
    UNKNOWN = "unknown"
    #: Another gateway still renews its lease: it is alive and serves the session.
    HELD = "held"
    #: The journal no longer holds every event the client missed.
    GAP = "gap"
    #: The store did not answer.
    UNAVAILABLE = "unavailable"


class TakeoverRefused(Exception):
    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.message = message


@dataclass(frozen=True, slots=True)
class Claimed:
    """A session this gateway now holds the lease of: its record and what its client missed."""

    record: SessionRecord
    replay: Replay

    @property
    def head(self) -> int:
        """The session's last server_event_seq: it goes on from the one after."""
        return max(self.record.head, self.replay.head)


async def claim(
    store: StateStore,
    session_id: str,
    token: str,
    last_seq: int,
    *,
    owner: str,
    lease_ms: int,
    wait_ms: int,
) -> Claimed:
    """Take the session's lease for ``owner`` and read what its client missed, or raise :class:`TakeoverRefused`."""
    try:
        record = await store.load(session_id)
        if record is None or not token_matches(record, token):
            raise TakeoverRefused(
                Refusal.UNKNOWN, "no session in the fleet matches this session_id and resume_token"
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while not await store.take_lease(session_id, owner, lease_ms, unless_held=True):
            if loop.time() >= deadline:
                holder = await store.owner(session_id)
                raise TakeoverRefused(
                    Refusal.HELD, f"session {session_id} is served by gateway {holder!r}; resume it there"
                )
            await asyncio.sleep(_RETRY_S)
        replay = await store.replay(session_id, last_seq)
    except StoreUnavailable as exc:
        raise TakeoverRefused(Refusal.UNAVAILABLE, f"the fleet's state store is unavailable: {exc}") from exc
    if not replay.covers(last_seq):
        raise TakeoverRefused(Refusal.GAP, f"events after {last_seq} are no longer held")
    return Claimed(record, replay)
