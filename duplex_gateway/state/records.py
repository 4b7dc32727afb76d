"""What a state store keeps of a session, as plain values (no I/O)."""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass

__all__ = [
    "Acknowledge",
    "AppendEvents",
    "Forget",
    "JournalEntry",
    "Replay",
    "SaveRecord",
    "SessionRecord",
    "Write",
    "token_digest",
    "token_matches",
]


def token_digest(token: str) -> str:
    """How a resume token is kept in the store: its SHA-256, so reading the store does not give one."""
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(record: SessionRecord, token: str) -> bool:
    """Whether ``token`` is the record's resume token (in constant time)."""
    return hmac.compare_digest(record.token_digest.encode(), token_digest(token).encode())


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """One numbered server event, as its frame went to the client (text or binary)."""

    seq: int
    frame: str | bytes


@dataclass(frozen=True, slots=True)
class SessionRecord:
    """A session as another gateway would need it to take the session over.

    ``config`` is the session's configuration as JSON (the engine-facing
    ``SessionConfig``); ``dialect`` and ``handshake`` say how its client talks.
    """

    session_id: str
    #: The gateway (``server.node_id``, or its generated name) serving it.
    owner: str
    token_digest: str
    dialect: str
    handshake: str
    config: str
    #: The session's resume grace: how long its state outlives a client that left.
    grace_ms: int
    #: The session's last server_event_seq when the record was written (the journal's own head
    #: is newer once events follow; this one survives a journal rewritten after an outage).
    head: int = 0

    def fields(self) -> dict[str, str]:
        """The record as a flat mapping of strings (a Redis hash)."""
        return {
            "head": str(self.head),
            "owner": self.owner,
            "token": self.token_digest,
            "dialect": self.dialect,
            "handshake": self.handshake,
            "config": self.config,
            "grace_ms": str(self.grace_ms),
        }

    @classmethod
    def from_fields(cls, session_id: str, fields: dict[str, str]) -> SessionRecord | None:
        """The record ``fields`` hold (None: missing fields, e.g. a record written in part)."""
        try:
            return cls(
                session_id=session_id,
                owner=fields["owner"],
                token_digest=fields["token"],
                dialect=fields["dialect"],
                handshake=fields["handshake"],
                config=fields["config"],
                grace_ms=int(fields["grace_ms"]),
                head=int(fields.get("head", "0")),
            )
        except (KeyError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Replay:
    """What a session's journal in the store holds for a resuming client."""

    #: The events after the client's last one, oldest first.
    entries: tuple[JournalEntry, ...]
    #: The oldest sequence number still kept (None: the journal holds no event).
    first_kept: int | None
    #: The newest sequence number ever written (0: none): the session goes on from the one after.
    head: int

    def covers(self, last_seq: int) -> bool:
        """Whether every event after ``last_seq`` is still kept."""
        return last_seq <= self.head and (self.first_kept is None or self.first_kept <= last_seq + 1)


# -- writes, made in batches ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SaveRecord:
    record: SessionRecord
    #: How long the record lives without renewal.
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class AppendEvents:
    session_id: str
    entries: tuple[JournalEntry, ...]
    #: The journal keeps this many of the latest events.
    max_events: int
    #: How long the session's data lives without renewal.
    ttl_ms: int


@dataclass(frozen=True, slots=True)
class Acknowledge:
    session_id: str
    seq: int


@dataclass(frozen=True, slots=True)
class Forget:
    session_id: str
    #: The lease too (False: only the data, about to be written again by the lease's holder).
    lease: bool = True


Write = SaveRecord | AppendEvents | Acknowledge | Forget
