"""A resume for a session this gateway does not hold: taken over from the fleet's copy of it.

The gateway that served the session died (or was restarted) and the client's reconnect
reached this one. From the state store (:mod:`duplex_gateway.state.takeover`) it gets the
session's lease, its configuration and the events its client missed, builds the session
with them, and opens its engine session; the resume then goes on as on the session's own
gateway (``session.resumed``, the missed events, the numbering unbroken). The engine side
starts anew: ``echo`` simply goes on; engines that keep a conversation do not have it here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from duplex_gateway.dialects.realtime_session import parse_session_patch
from duplex_gateway.host.admission import SessionRegistry
from duplex_gateway.host.connection import Connection
from duplex_gateway.server.fleet import Fleet
from duplex_gateway.session.settings import Handshake
from duplex_gateway.state.takeover import Refusal, TakeoverRefused, claim
from duplex_gateway.vocabulary.commands import SessionResume
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Socket
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = ["Adoption"]

logger = logging.getLogger(__name__)

#: Past its lease, how much longer a resume waits for a dead gateway's claim to lapse.
_LEASE_MARGIN_MS = 1_000

_CODES = {
    Refusal.UNKNOWN: ErrorCode.INVALID_RESUME_TOKEN,
    Refusal.HELD: ErrorCode.INVALID_RESUME_TOKEN,
    Refusal.UNAVAILABLE: ErrorCode.INVALID_RESUME_TOKEN,
    Refusal.GAP: ErrorCode.RESUME_GAP,
}

#: Builds a session's connection: socket, session id, handshake, configuration.
Build = Callable[[Socket, str, Handshake, SessionConfig], Connection]


class Adoption:
    """Takes sessions over from the fleet's state store (``ResumeRegistry.adopt``)."""

    def __init__(
        self, fleet: Fleet, defaults: SessionConfig, build: Build, registry: SessionRegistry
    ) -> None:
        self._fleet = fleet
        self._registry = registry
        self._defaults = defaults
        self._build = build

    async def __call__(self, command: SessionResume, socket: Socket) -> Connection:
        """The session ``command`` names, now this gateway's; raises ``ProtocolError`` when it cannot be."""
        fleet = self._fleet
        if self._registry.draining:
            # Before the store is touched: a lease taken here would hold the session from the gateway
            # the client tries next. The client tries again (the code is not one it gives up on).
            raise ProtocolError(
                ErrorCode.SERVER_SHUTTING_DOWN, "this gateway is shutting down; resume on another"
            )
        try:
            claimed = await claim(
                fleet.store,
                command.session_id,
                command.resume_token,
                command.last_received_server_event_seq,
                owner=fleet.owner,
                lease_ms=fleet.lease_ms,
                wait_ms=fleet.lease_ms + _LEASE_MARGIN_MS,
            )
        except TakeoverRefused as exc:
            param = "last_received_server_event_seq" if exc.refusal is Refusal.GAP else None
            raise ProtocolError(
                _CODES[exc.refusal], f"{exc.message}; open a new session", param=param
            ) from exc
        record = claimed.record
        config = self._configuration(record.session_id, record.config)
        try:
            handshake = Handshake(record.handshake)
        except ValueError:
            raise ProtocolError(
                ErrorCode.INVALID_RESUME_TOKEN,
                f"session {record.session_id} cannot be resumed on this gateway",
            ) from None
        connection = self._build(socket, record.session_id, handshake, config)
        entries = [(entry.seq, entry.frame) for entry in claimed.replay.entries]
        if not await connection.carry_on(entries, claimed.head, record.config):
            raise ProtocolError(
                ErrorCode.SESSION_LIMIT,
                f"session {record.session_id} cannot be taken over here now (no room, or the engine refused it)",
            )
        logger.info(
            "session %s taken over from gateway %s after event %d",
            record.session_id,
            record.owner,
            command.last_received_server_event_seq,
        )
        return connection

    def _configuration(self, session_id: str, frame: str) -> SessionConfig:
        """The configuration the session's client was last told, from that event's frame."""
        try:
            session = json.loads(frame)["session"]
            return self._defaults.apply(parse_session_patch(session))
        except (ValueError, KeyError, TypeError, ProtocolError) as exc:
            logger.warning("session %s: its stored configuration cannot be read: %s", session_id, exc)
            raise ProtocolError(
                ErrorCode.INVALID_RESUME_TOKEN,
                f"session {session_id} cannot be resumed on this gateway; open a new session",
            ) from exc
