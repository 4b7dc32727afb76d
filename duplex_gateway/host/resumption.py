"""Session resume: a client whose socket dropped picks its session up again.

A session whose client vanished without ``session.close`` is *detached*, not
ended: its engine session keeps running for ``limits.resume_grace_s``, and the
events it produces are kept in a bounded :class:`Journal`. A new connection
whose first message is ``session.resume {session_id, resume_token,
last_received_server_event_seq}`` re-attaches and is sent ``session.resumed``
(outside the numbered stream, with a new token) and then every event after that
sequence number. Tokens are single-use: each attach issues a new one. This is
vLLM-Omni's contract, so its ``DuplexClient`` resumes by itself, as often as its
connection drops: a session still attached to a socket the gateway thinks alive
is taken over (that socket gets ``session.replaced``), and a resume after events
no longer held gets ``session.resync_required``.

A detached session lives in one process's memory. Several gateways behind one
load balancer each get a ``server.node_id``; their session ids name it
(:func:`new_session_id`), so the balancer can send a resume to its process
(docs/scaling.md), and a resume that lands elsewhere is told where it belongs.
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from duplex_gateway.state.writer import StoreWriter
from duplex_gateway.vocabulary.commands import SessionResume
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Socket

__all__ = ["Journal", "ResumeRegistry", "new_resume_token", "new_session_id", "node_of"]

T = TypeVar("T")


def new_resume_token() -> str:
    """A fresh, unguessable resume credential."""
    return secrets.token_urlsafe(24)


_NODE_SESSION_ID = re.compile(r"sess_([A-Za-z0-9-]{1,32})_[0-9a-f]{16}")


def new_session_id(node_id: str | None = None) -> str:
    """A fresh session id: ``sess_<hex>``, or ``sess_<node_id>_<hex>`` on a named node."""
    suffix = secrets.token_hex(8)
    return f"sess_{node_id}_{suffix}" if node_id else f"sess_{suffix}"


def node_of(session_id: str) -> str | None:
    """The node a session id was issued by (``None``: untagged, or not a gateway session id)."""
    match = _NODE_SESSION_ID.fullmatch(session_id)
    return match.group(1) if match else None


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    text: str | bytes


class Journal:
    """The most recent server events of a session, by sequence number, bounded in count and bytes.

    The client's ``session.event_ack`` trims it too, as vLLM-Omni's journal is trimmed:
    what a client has acknowledged it will never ask for again.
    """

    def __init__(self, *, max_events: int, max_bytes: int) -> None:
        self._entries: deque[_Entry] = deque()
        self._bytes = 0
        self._max_events = max_events
        self._max_bytes = max_bytes
        #: The highest sequence number ever dropped from the front (0: nothing dropped yet).
        self._dropped_through = 0
        self._head = 0

    @property
    def head(self) -> int:
        """The sequence number of the newest event appended (0: none yet)."""
        return self._head

    def append(self, seq: int, text: str | bytes) -> None:
        self._head = seq
        self._entries.append(_Entry(seq, text))
        self._bytes += len(text)
        while self._entries and (len(self._entries) > self._max_events or self._bytes > self._max_bytes):
            self._drop_first()

    def acknowledge(self, seq: int) -> None:
        """The client has every event up to ``seq``: they need not be kept for a resume."""
        if seq > self._head:
            raise ProtocolError(
                ErrorCode.INVALID_VALUE,
                f"server_event_seq {seq} is newer than the last event sent ({self._head})",
                param="server_event_seq",
            )
        while self._entries and self._entries[0].seq <= seq:
            self._drop_first()
        self._dropped_through = max(self._dropped_through, seq)

    def _drop_first(self) -> None:
        dropped = self._entries.popleft()
        self._bytes -= len(dropped.text)
        self._dropped_through = dropped.seq

    def can_replay_after(self, seq: int) -> bool:
        """Whether every event after ``seq`` is still held."""
        return seq >= self._dropped_through

    def carry_on(self, entries: Sequence[tuple[int, str | bytes]], head: int) -> None:
        """Start as the journal of a session taken over: ``entries`` (the events after what its
        client has), and ``head``, the session's last sequence number."""
        for seq, text in entries:
            self.append(seq, text)
        self._dropped_through = entries[0][0] - 1 if entries else head
        self._head = head

    def entries(self) -> list[tuple[int, str | bytes]]:
        """Every event held, with its sequence number, oldest first."""
        return [(entry.seq, entry.text) for entry in self._entries]

    def after(self, seq: int) -> list[str | bytes]:
        """The events after ``seq``, oldest first."""
        return [entry.text for entry in self._entries if entry.seq > seq]


class Resumable(Protocol):
    """What the registry needs from a resumable session (the connection provides it)."""

    resume_token: str

    @property
    def session_id(self) -> str: ...

    def can_replay_after(self, seq: int) -> bool: ...


R = TypeVar("R", bound=Resumable)


class ResumeRegistry(Generic[R]):
    """Resumable sessions by session id: detached ones waiting for their client, and attached ones.

    An attached session can be claimed too: its client may have lost a connection the
    gateway has not noticed yet (no FIN, no RST reached it), and vLLM-Omni's contract lets
    the resume take the session over from that socket.
    """

    def __init__(
        self,
        node_id: str | None = None,
        *,
        writer: StoreWriter | None = None,
        adopt: Callable[[SessionResume, Socket], Awaitable[R]] | None = None,
    ) -> None:
        self._parked: dict[str, R] = {}
        self._attached: dict[str, R] = {}
        #: This process's ``server.node_id``: a refused resume says which node holds the session.
        self.node_id = node_id
        #: Where resumable sessions are copied for the fleet (``server.state_store``; None: nowhere).
        self.writer = writer
        #: Takes over a session this process does not hold from the fleet's copy of it (raises
        #: ``ProtocolError`` when it cannot; None: no fleet).
        self.adopt = adopt

    def attach(self, session: R) -> None:
        """``session`` is served by a socket, and resumable from another."""
        self._parked.pop(session.session_id, None)
        self._attached[session.session_id] = session

    def park(self, session: R) -> None:
        self._attached.pop(session.session_id, None)
        self._parked[session.session_id] = session

    def unpark(self, session: R) -> None:
        """``session`` can no longer be resumed (it ended)."""
        for held in (self._parked, self._attached):
            if held.get(session.session_id) is session:
                del held[session.session_id]

    def claim(self, session_id: str, token: str, last_seq: int) -> R:
        """Take the session the credentials name, attached or not, or raise ``ProtocolError``.

        ``resume_gap``: the token is right but the journal no longer covers the gap; the
        session stays where it was.
        """
        session = self._parked.get(session_id) or self._attached.get(session_id)
        if session is None or not hmac.compare_digest(session.resume_token.encode(), token.encode()):
            message = "no detached session matches this session_id and resume_token; open a new session"
            owner = node_of(session_id) if session is None else None
            if owner is not None and owner != self.node_id:
                # The load balancer sent the resume to the wrong process (docs/scaling.md).
                message = (
                    f"session {session_id} belongs to gateway node {owner!r}, not to this one "
                    f"({self.node_id or 'unnamed'}): the load balancer must route a resume to the node "
                    "named in its session_id; open a new session"
                )
            raise ProtocolError(ErrorCode.INVALID_RESUME_TOKEN, message)
        if not session.can_replay_after(last_seq):
            raise ProtocolError(
                ErrorCode.RESUME_GAP,
                f"events after {last_seq} are no longer held; open a new session",
                param="last_received_server_event_seq",
            )
        self._parked.pop(session_id, None)
        self._attached.pop(session_id, None)
        return session

    def holds(self, session_id: str) -> bool:
        """Whether this process serves the session, attached or detached."""
        return session_id in self._parked or session_id in self._attached

    def parked(self) -> list[R]:
        return list(self._parked.values())
