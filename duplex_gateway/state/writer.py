"""A gateway's writes to the state store: taken without waiting, made in batches on one task.

Sessions tell the writer what changed (:meth:`StoreWriter.event`, ``acknowledged``,
``configured``, ``token``, ``ended``) and go on at once: no frame waits on the store.
The writer's task gathers what changed since its last round into one batch, writes
it, takes the lease of each session new to the store, and renews every lease it
holds a third of the lease's time apart.

When the store fails (down, slow past its timeout), nothing is retried piecemeal:
every session that had writes in flight is marked for a rewrite, and once the
store answers again each of them is written whole from the session's own journal
(its record, every event still held, its lease). Until then another gateway finds
no session or an older copy of it, never one with a hole in its journal: a copy
whose journal fell behind is deleted before it is rewritten. A session that
piles up more events than its journal holds while the store is away is
rewritten the same way, so the writer holds no more than a journal's worth of
events per session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from duplex_gateway.state.records import (
    Acknowledge,
    AppendEvents,
    Forget,
    JournalEntry,
    SaveRecord,
    SessionRecord,
    Write,
    token_digest,
)
from duplex_gateway.state.store import StateStore, StoreUnavailable

__all__ = ["SessionMirror", "StoreWriter"]

logger = logging.getLogger(__name__)

#: The longest wait between tries while the store is down.
_MAX_BACKOFF_S = 2.0


@dataclass(slots=True)
class _Mirrored:
    """What the writer knows of one session, and what of it the store does not have yet."""

    dialect: str
    handshake: str
    token_digest: str
    #: The session's events still held, for a rewrite.
    journal: Callable[[], Sequence[JournalEntry]]
    config: str = ""
    #: The newest server_event_seq the session told of.
    head: int = 0
    pending: list[JournalEntry] = field(default_factory=list)
    acknowledged: int | None = None
    record_stale: bool = True
    #: The store's copy must be replaced whole (a write failed, or too much piled up).
    rewrite: bool = False
    leased: bool = False


class StoreWriter:
    """Mirrors the sessions of one gateway (``owner``) into a :class:`StateStore`.

    ``lease_ms``: how long a lease lasts unrenewed, so how long a dead gateway keeps
    another from taking its sessions over. ``grace_ms``: how long a session's data
    outlives its lease (the resume grace). ``max_events``: the journal's length.
    ``on_lost``: told of a session whose lease another gateway holds now.
    """

    def __init__(
        self,
        store: StateStore,
        *,
        owner: str,
        lease_ms: int,
        grace_ms: int,
        max_events: int,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self._lease_ms = lease_ms
        self._grace_ms = grace_ms
        self._max_events = max_events
        self._on_lost = on_lost
        self._sessions: dict[str, _Mirrored] = {}
        self._changed: set[str] = set()
        self._forgotten: set[str] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        #: One round at a time: the task's and a hand-off's.
        self._rounds = asyncio.Lock()
        #: Whether the store answered the last write or renewal.
        self.healthy = True
        #: Why it did not, while it does not.
        self.problem: str | None = None
        #: Rounds that failed, since start.
        self.failures = 0

    # -- what sessions tell it (never waits) ---------------------------------------------------

    def track(
        self,
        session_id: str,
        *,
        dialect: str,
        handshake: str,
        token: str,
        journal: Callable[[], Sequence[JournalEntry]],
    ) -> SessionMirror:
        """Start mirroring a resumable session; ``journal`` gives the events it still holds."""
        self._forgotten.discard(session_id)
        self._sessions[session_id] = _Mirrored(dialect, handshake, token_digest(token), journal)
        self._touch(session_id)
        return SessionMirror(self, session_id)

    def configured(self, session_id: str, frame: str) -> None:
        """The session's configuration changed: ``frame`` is the event that told its client."""
        mirrored = self._sessions.get(session_id)
        if mirrored is not None:
            mirrored.config = frame
            mirrored.record_stale = True
            self._touch(session_id)

    def token(self, session_id: str, token: str) -> None:
        """The session has a new resume token (the old one is spent)."""
        mirrored = self._sessions.get(session_id)
        if mirrored is not None:
            mirrored.token_digest = token_digest(token)
            mirrored.record_stale = True
            self._touch(session_id)

    def event(self, session_id: str, seq: int, frame: str | bytes) -> None:
        mirrored = self._sessions.get(session_id)
        if mirrored is None:
            return
        mirrored.head = seq
        if mirrored.rewrite:
            return  # to be rewritten whole from its journal anyway
        mirrored.pending.append(JournalEntry(seq, frame))
        if len(mirrored.pending) > self._max_events:
            mirrored.pending.clear()
            mirrored.rewrite = True
        self._touch(session_id)

    def acknowledged(self, session_id: str, seq: int) -> None:
        mirrored = self._sessions.get(session_id)
        if mirrored is not None:
            mirrored.acknowledged = seq
            self._touch(session_id)

    async def hand_off(self, session_id: str) -> bool:
        """Write all of the session's copy now, give up its lease and stop mirroring it (it is not deleted).

        For a session about to be served by another gateway (this one is restarting). False:
        the store did not take it in time; the session is still mirrored here.
        """
        mirrored = self._sessions.get(session_id)
        if mirrored is None or not self.healthy:
            return False
        try:
            async with asyncio.timeout(2 * self.store.timeout_s):
                await self._round_now()
                if mirrored.rewrite or not mirrored.leased:
                    return False  # the round failed for it: its copy is not whole
                await self.store.release_lease(session_id, self.owner)
        except (TimeoutError, StoreUnavailable):
            return False
        self._sessions.pop(session_id, None)
        return True

    async def _round_now(self) -> None:
        """A round, in turn with the task's own (one at a time)."""
        async with self._rounds:
            await self._round()

    def ended(self, session_id: str) -> None:
        """The session is over: everything of it is deleted from the store."""
        if self._sessions.pop(session_id, None) is not None:
            self._changed.discard(session_id)
            self._forgotten.add(session_id)
            self._wake.set()

    def _touch(self, session_id: str) -> None:
        self._changed.add(session_id)
        self._wake.set()

    # -- its task --------------------------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="state-store-writer")

    async def close(self) -> None:
        """Stop; one last round writes what is pending, if the store answers."""
        task, self._task = self._task, None
        if task is None:
            return
        # A flag, not a cancel: a cancel that lands as the wait's own deadline passes can be
        # taken for the deadline, and the loop would go on.
        self._closing = True
        self._wake.set()
        with contextlib.suppress(TimeoutError, StoreUnavailable):
            async with asyncio.timeout(2 * self.store.timeout_s + _MAX_BACKOFF_S):
                await asyncio.shield(task)
        if not task.done():
            task.cancel()
        with contextlib.suppress(StoreUnavailable):
            await self._round_now()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        renew_every = self._lease_ms / 3000
        renew_at = loop.time()  # at once: whether the store answers is known from the start
        backoff = 0.0
        while not self._closing:
            waiter = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait([waiter], timeout=max(0.0, renew_at - loop.time()))
            finally:
                waiter.cancel()
            if self._closing:
                return
            if backoff:
                await asyncio.sleep(backoff)
            try:
                await self._round_now()
                if loop.time() >= renew_at:
                    renew_at = loop.time() + renew_every
                    await self._renew()
            except StoreUnavailable as exc:
                backoff = min(_MAX_BACKOFF_S, max(0.1, backoff * 2))
                self._failed(str(exc))
            except Exception as exc:  # a bug must cost mirroring, not the gateway
                backoff = _MAX_BACKOFF_S
                logger.exception("state store writer failed")
                self._failed(f"{type(exc).__name__}: {exc}")
            else:
                backoff = 0.0
                if not self.healthy:
                    logger.warning("state store %s answers again", self.owner)
                self.healthy, self.problem = True, None

    async def _round(self) -> None:
        """Write everything that changed since the last round."""
        self._wake.clear()
        changed, self._changed = self._changed, set()
        forgotten, self._forgotten = self._forgotten, set()
        batch: list[Write] = [Forget(session_id) for session_id in forgotten]
        fresh: list[str] = []
        try:
            for session_id in changed:
                mirrored = self._sessions.get(session_id)
                if mirrored is not None:
                    batch.extend(self._writes(session_id, mirrored))
                    if not mirrored.leased:
                        fresh.append(session_id)
            # The lease first: a copy is never there for another gateway to take while unheld.
            for session_id in fresh:
                await self.store.take_lease(session_id, self.owner, self._lease_ms, unless_held=False)
                if (mirrored := self._sessions.get(session_id)) is not None:
                    mirrored.leased = True
            await self.store.write(batch)
        except BaseException:
            # Whatever of the batch the store took, these sessions' copies may be behind now:
            # each is rewritten whole once the store answers; the ended are deleted then.
            for session_id in changed:
                if (mirrored := self._sessions.get(session_id)) is not None:
                    mirrored.rewrite = True
                    mirrored.pending.clear()
                    mirrored.leased = False
            self._changed |= changed & self._sessions.keys()
            self._forgotten |= forgotten
            raise

    def _writes(self, session_id: str, mirrored: _Mirrored) -> list[Write]:
        ttl_ms = self._lease_ms + self._grace_ms
        writes: list[Write] = []
        if mirrored.rewrite:
            writes.append(Forget(session_id, lease=False))
            mirrored.pending = list(mirrored.journal())
            mirrored.record_stale = True
            mirrored.acknowledged = None
            mirrored.rewrite = False
        if mirrored.record_stale:
            record = SessionRecord(
                session_id=session_id,
                owner=self.owner,
                token_digest=mirrored.token_digest,
                dialect=mirrored.dialect,
                handshake=mirrored.handshake,
                config=mirrored.config,
                grace_ms=self._grace_ms,
                head=mirrored.head,
            )
            writes.append(SaveRecord(record, ttl_ms))
            mirrored.record_stale = False
        if mirrored.pending:
            writes.append(AppendEvents(session_id, tuple(mirrored.pending), self._max_events, ttl_ms))
            mirrored.pending = []
        if mirrored.acknowledged is not None:
            writes.append(Acknowledge(session_id, mirrored.acknowledged))
            mirrored.acknowledged = None
        return writes

    async def _renew(self) -> None:
        leased = [session_id for session_id, m in self._sessions.items() if m.leased]
        if not leased:
            # Nothing to renew: ask anyway, so a store that went down shows while no session writes.
            await self.store.ping()
            return
        for session_id in await self.store.renew(self.owner, leased, self._lease_ms):
            # Another gateway took it over (its client resumed there): stop mirroring it here.
            logger.info("session %s is served by another gateway now", session_id)
            self._sessions.pop(session_id, None)
            if self._on_lost is not None:
                self._on_lost(session_id)

    def _failed(self, problem: str) -> None:
        self.failures += 1
        if self.healthy:
            logger.warning(
                "state store unavailable (%s): sessions go on, resumable on this gateway only", problem
            )
        self.healthy, self.problem = False, problem


class SessionMirror:
    """One session's side of a :class:`StoreWriter`: what the session tells it, none of which waits."""

    __slots__ = ("_writer", "session_id")

    def __init__(self, writer: StoreWriter, session_id: str) -> None:
        self._writer = writer
        self.session_id = session_id

    def event(self, seq: int, frame: str | bytes) -> None:
        """A numbered server event went into the session's journal."""
        self._writer.event(self.session_id, seq, frame)

    def acknowledged(self, seq: int) -> None:
        self._writer.acknowledged(self.session_id, seq)

    def configured(self, frame: str) -> None:
        """The session's configuration changed; ``frame`` told the client."""
        self._writer.configured(self.session_id, frame)

    def token(self, token: str) -> None:
        self._writer.token(self.session_id, token)

    def ended(self) -> None:
        self._writer.ended(self.session_id)
