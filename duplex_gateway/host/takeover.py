"""``session.resume`` as the connection carries it out: a new socket claims a session, the session takes it.

Two sides, each a connection: the one whose socket sent ``session.resume`` as its
first message hands its socket over (:meth:`Takeover.hand_over`); the session it
names takes that socket (:meth:`Takeover.take`), tells a socket it still had
``session.replaced``, and replays what the client missed (:meth:`Takeover.greet`).
Between sockets, a detached session waits out its grace (:meth:`Takeover.await_return`).
The registry, the journal and the tokens are :mod:`duplex_gateway.host.resumption`'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from duplex_gateway.dialects.base import Dialect
from duplex_gateway.host.closing import Failure, close_for
from duplex_gateway.host.outbox import Outbox
from duplex_gateway.host.reader import Reader
from duplex_gateway.host.resumption import ResumeRegistry, new_resume_token
from duplex_gateway.host.transport import Attachment
from duplex_gateway.ops.logs import bind_session
from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.session_stats import SessionStats
from duplex_gateway.session.machine import Session
from duplex_gateway.state.records import JournalEntry
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import SessionResume
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from duplex_gateway.host.connection import Connection

__all__ = ["Takeover"]

logger = logging.getLogger(__name__)


class Takeover:
    """One connection's part in session resume, on either side of it."""

    def __init__(
        self,
        host: Connection,
        session: Session,
        dialect: Dialect,
        *,
        resumes: ResumeRegistry[Connection] | None,
        outbox: Outbox,
        reader: Reader,
        metrics: GatewayMetrics,
        stats: SessionStats,
        send_timeout_s: float,
        send_error: Callable[[ProtocolError], None],
    ) -> None:
        """``resumes``: the registry of resumable sessions (None: resume is turned off)."""
        self._host = host
        self._session = session
        self._dialect = dialect
        self._resumes = resumes
        self._outbox = outbox
        self._reader = reader
        self._metrics = metrics
        self._stats = stats
        self._send_timeout_s = send_timeout_s
        self._send_error = send_error
        #: Sockets that have served this session, the current one included.
        self.generation = 0
        #: Set when a resume attaches a socket; cleared when the session is parked.
        self._resumed = asyncio.Event()

    # -- the socket that sent session.resume ------------------------------------------------------

    async def hand_over(self, command: SessionResume) -> bool:
        """Give this socket to the detached session ``command`` names; False if refused."""
        if self._resumes is None:
            self._metrics.resume("disabled")
            self._send_error(
                ProtocolError(
                    ErrorCode.INVALID_RESUME_TOKEN, "session resume is turned off", event_id=command.event_id
                )
            )
            return False
        try:
            target = await self._claim(command)
        except ProtocolError as exc:
            self._metrics.resume("gap" if exc.code is ErrorCode.RESUME_GAP else "refused")
            attachment = self._outbox.attachment
            if exc.code is ErrorCode.RESUME_GAP and attachment is not None:
                # vLLM-Omni's answer: the client must start over (its DuplexClient gives up
                # at once instead of retrying a resume that cannot succeed).
                attachment.send(
                    self._dialect.render_unsequenced(
                        ev.SessionResyncRequired(session_id=command.session_id, reason="journal_gap")
                    )
                )
            else:
                self._send_error(exc.with_event_id(command.event_id))
            return False
        attachment = self._outbox.attachment
        assert attachment is not None
        # Stop this connection's writer first so only the resumed session writes to the socket.
        await attachment.finish(None, self._send_timeout_s)
        self._outbox.attachment = None
        await target.resume(attachment.socket, command.last_received_server_event_seq)
        return True

    async def _claim(self, command: SessionResume) -> Connection:
        """The session ``command`` names: held here, or else taken over from the fleet's copy of it."""
        assert self._resumes is not None
        try:
            return self._resumes.claim(
                command.session_id, command.resume_token, command.last_received_server_event_seq
            )
        except ProtocolError as exc:
            # A session held here refused the token: the store's copy, a writer round behind, may
            # still have the token just spent, and the lease is this gateway's own, so taking the
            # copy over would make a second of the session with a used token.
            if (
                exc.code is not ErrorCode.INVALID_RESUME_TOKEN
                or self._resumes.adopt is None
                or self._resumes.holds(command.session_id)
            ):
                raise
        attachment = self._outbox.attachment
        assert attachment is not None
        return await self._resumes.adopt(command, attachment.socket)

    # -- the session it names ------------------------------------------------------------------------

    def take(self, attachment: Attachment) -> str:
        """Serve the session on ``attachment`` from now on; returns the new resume token.

        The session may still be attached: its client lost a connection this gateway has
        not noticed yet. That socket is told ``session.replaced`` and let go.
        """
        session_id = self._session.session_id
        replaced = self._outbox.attachment
        if replaced is not None:
            replaced.send(
                self._dialect.render_unsequenced(
                    ev.SessionReplaced(session_id=session_id, attachment_generation=self.generation)
                )
            )
            replaced.close_after(close_for(Failure.REPLACED))
            # Its reader may wait on a socket that will never say another word.
            self._reader.supersede(replaced)
            logger.info("session %s taken over by a new connection", session_id)
        bind_session(session_id)
        self._metrics.resume("resumed")
        self._stats.resumes += 1
        self._resumed.set()
        self.generation += 1
        token = self._session.resume_token = new_resume_token()
        if self._outbox.mirror is not None:
            self._outbox.mirror.token(token)
        self._outbox.attachment = attachment
        if self._resumes is not None:
            self._resumes.attach(self._host)
        return token

    def greet(self, attachment: Attachment, last_seq: int) -> None:
        """Send the resumed client ``session.resumed`` and every event after ``last_seq``."""
        # session.resumed carries no sequence number, as vLLM-Omni sends it: DuplexClient
        # drops an event numbered at or below its last seen one as a replayed duplicate,
        # and with it the new resume_token, so its next resume would fail.
        attachment.send(self._dialect.render_unsequenced(self._session.resumed(self.generation)))
        self._outbox.replay(attachment, last_seq)
        logger.info("session %s resumed after event %d", self._session.session_id, last_seq)

    async def farewell(self) -> None:
        """This socket's reader was stopped by a resume: close the socket it read (``session_replaced``)."""
        task = asyncio.current_task()
        replaced = self._reader.superseded.pop(task) if task is not None else None
        if replaced is not None:
            await replaced.finish(close_for(Failure.REPLACED), self._send_timeout_s)

    def mirror(self) -> None:
        """Copy the session to the fleet's state store from now on, if the gateway has one."""
        writer = self._resumes.writer if self._resumes is not None else None
        journal = self._outbox.journal
        token = self._session.resume_token
        if writer is None or journal is None or token is None or self._outbox.mirror is not None:
            return
        self._outbox.mirror = writer.track(
            self._session.session_id,
            dialect=self._host.dialect_label,
            handshake=self._session.handshake.value,
            token=token,
            journal=lambda: [JournalEntry(seq, frame) for seq, frame in journal.entries()],
        )

    @property
    def movable(self) -> bool:
        """The fleet can take this session over: its copy in the state store is being kept."""
        writer = self._resumes.writer if self._resumes is not None else None
        return self._outbox.mirror is not None and writer is not None and writer.healthy

    async def let_go(self) -> bool:
        """Hand the session to the fleet: its copy written whole and its lease given up; False if it cannot be."""
        writer = self._resumes.writer if self._resumes is not None else None
        if not self.movable or writer is None or not await writer.hand_off(self._session.session_id):
            return False
        self._outbox.mirror = None  # kept in the store for the gateway its client reaches next
        logger.info("session %s handed to the fleet", self._session.session_id)
        return True

    def unmirror(self) -> None:
        """The session ended: its copy in the state store goes."""
        mirror, self._outbox.mirror = self._outbox.mirror, None
        if mirror is not None:
            mirror.ended()

    def park(self, grace_s: float) -> None:
        """The socket dropped: the session waits, detached, for its client to resume it."""
        assert self._resumes is not None
        self._resumed.clear()
        self._resumes.park(self._host)
        logger.info("session %s detached; resumable for %g s", self._session.session_id, grace_s)

    async def await_return(self, grace_s: float, deadline: float, ended: asyncio.Event) -> bool:
        """Wait up to ``grace_s`` (not past ``deadline``) for a resume; False if none came or the session ended."""
        grace_s = min(grace_s, max(0.0, deadline - asyncio.get_running_loop().time()))
        waits = {asyncio.ensure_future(self._resumed.wait()), asyncio.ensure_future(ended.wait())}
        try:
            await asyncio.wait(waits, timeout=grace_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        if self._resumed.is_set():
            return True
        assert self._resumes is not None
        self._resumes.unpark(self._host)
        if not ended.is_set():
            self._metrics.resume("expired")
        logger.info("session %s was not resumed in time; ending it", self._session.session_id)
        return False
