"""Every failure the gateway answers on a WebSocket, with its error event and its close code: one table.

As python-websockets' ``protocol.py`` turns each way a connection can go wrong into
one close code in one place, :data:`FAILURES` gives each :class:`Failure` the
``error`` event it is told (its code; the message, which names the particulars, is
the caller's) and the code the socket is closed with, or none when the session goes
on. The connection, the HTTP routes, the auth layer and the observers look their
codes up here; none chooses one of its own. The table also holds the two ordinary
ways the host lets a socket go (:attr:`Failure.DISCONNECTED`,
:attr:`Failure.OBSERVER_DONE`), so no close code is chosen anywhere else in the host.

Not here: the ends the session decides for itself (``session.close`` 1000, the
gateway's shutdown 1001, an engine that ended the session 4003). They are outputs
of the pure session (``CloseSession``), and ``Session.expire`` names the error event
of the expiry rows (idle, maximum duration, resume timeout) from the close code it is
handed; ``tests/host/test_closing.py`` holds the two to the same answer. Nor 1009:
a frame above ``limits.hard_max_message_bytes`` is closed by the WebSocket server
before the gateway sees it.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from duplex_gateway.engine import port
from duplex_gateway.vocabulary.errors import CloseCode, ErrorCode, ProtocolError

__all__ = [
    "ENGINE_OPEN_FAILURES",
    "FAILURES",
    "Close",
    "Failure",
    "Verdict",
    "close_code",
    "close_for",
    "engine_call_failure",
    "engine_open_failure",
    "protocol_failure",
    "update_refusal",
]


class Failure(enum.Enum):
    """What went wrong, in the words of whoever it happened to."""

    # Turned away at the door, before a session is served.
    KEY_REFUSED = "key_refused"  # the auth gate refused a WebSocket handshake it could not answer over HTTP
    NO_SUCH_CALL = "no_such_call"  # an observer named no live call or session
    NO_SUCH_CARRIER = "no_such_carrier"  # /telephony/<name> names no carrier
    TOO_MANY_OBSERVERS = "too_many_observers"
    GATEWAY_FULL = "gateway_full"  # limits.max_sessions reached
    GATEWAY_DRAINING = "gateway_draining"  # the gateway is shutting down
    ENGINE_FULL = "engine_full"  # the engine has no room for another session
    ENGINE_UNAVAILABLE = "engine_unavailable"  # the engine could not open a session (down, or no answer)
    # The client.
    BAD_MESSAGE = "bad_message"  # a ProtocolError: its own code, and the session goes on
    UNAUTHORIZED = "unauthorized"  # a ProtocolError ``unauthorized``: nothing more is heard from it
    IDLE = "idle"  # no message for limits.idle_timeout_s
    MAX_DURATION = "max_duration"  # the session reached limits.max_session_s
    SLOW_CONSUMER = "slow_consumer"  # it did not read its events; nothing more can reach it
    RESUME_TIMEOUT = "resume_timeout"  # a detached session whose client did not come back in time
    REPLACED = "replaced"  # a session.resume took the session over from this socket
    MOVED = "moved"  # draining, the gateway handed the session to its fleet: the client resumes it elsewhere
    # The engine, on a call or on its event stream; the session goes on.
    ENGINE_REFUSED_CALL = "engine_refused_call"
    ENGINE_CALL_FAILED = "engine_call_failed"
    ENGINE_UPDATE_UNANSWERED = "engine_update_unanswered"  # a session.update still unanswered at the bound
    # The gateway itself.
    INTERNAL = "internal"  # a bug: it costs this session only, and its details are withheld
    # The ordinary ends of a socket the host closes.
    DISCONNECTED = "disconnected"  # the session is over and nothing else was decided (the client left)
    OBSERVER_DONE = "observer_done"  # an observer's client left, or the call it watched is over


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the client is told about a failure, and how its socket is closed."""

    #: The ``error`` event's code (None: no event; for BAD_MESSAGE, the ProtocolError's own code).
    error: ErrorCode | None
    #: The WebSocket close code (None: the session goes on).
    close: CloseCode | None
    #: The close reason (None: the caller names it, as the refused key's code or the observer's end).
    reason: str | None


#: Every failure's verdict. The codes are CloseCode's, documented in docs/protocol.md ("Close codes").
FAILURES: Mapping[Failure, Verdict] = MappingProxyType(
    {
        Failure.KEY_REFUSED: Verdict(None, CloseCode.POLICY_VIOLATION, None),
        Failure.NO_SUCH_CALL: Verdict(None, CloseCode.POLICY_VIOLATION, "no live call with that id"),
        Failure.NO_SUCH_CARRIER: Verdict(None, CloseCode.POLICY_VIOLATION, None),
        Failure.TOO_MANY_OBSERVERS: Verdict(None, CloseCode.TRY_AGAIN_LATER, "too many observers"),
        Failure.GATEWAY_FULL: Verdict(ErrorCode.SESSION_LIMIT, CloseCode.TRY_AGAIN_LATER, "session_limit"),
        Failure.GATEWAY_DRAINING: Verdict(
            ErrorCode.SERVER_SHUTTING_DOWN, CloseCode.TRY_AGAIN_LATER, "server_shutting_down"
        ),
        Failure.ENGINE_FULL: Verdict(ErrorCode.SESSION_LIMIT, CloseCode.TRY_AGAIN_LATER, "session_limit"),
        Failure.ENGINE_UNAVAILABLE: Verdict(
            ErrorCode.ENGINE_UNAVAILABLE, CloseCode.TRY_AGAIN_LATER, "engine_unavailable"
        ),
        Failure.BAD_MESSAGE: Verdict(None, None, None),
        Failure.UNAUTHORIZED: Verdict(ErrorCode.UNAUTHORIZED, CloseCode.POLICY_VIOLATION, "unauthorized"),
        Failure.IDLE: Verdict(ErrorCode.IDLE_TIMEOUT, CloseCode.IDLE_TIMEOUT, "idle_timeout"),
        Failure.MAX_DURATION: Verdict(ErrorCode.SESSION_EXPIRED, CloseCode.MAX_DURATION, "max_duration"),
        Failure.SLOW_CONSUMER: Verdict(None, CloseCode.SLOW_CONSUMER, "slow consumer"),
        # Journaled for a client that is not there; Session.expire names it internal_error.
        Failure.RESUME_TIMEOUT: Verdict(ErrorCode.INTERNAL_ERROR, CloseCode.NORMAL, "resume_timeout"),
        Failure.REPLACED: Verdict(None, CloseCode.NORMAL, "session_replaced"),
        Failure.MOVED: Verdict(None, CloseCode.SERVICE_RESTART, "session_moved"),
        Failure.ENGINE_REFUSED_CALL: Verdict(ErrorCode.ENGINE_ERROR, None, None),
        Failure.ENGINE_CALL_FAILED: Verdict(ErrorCode.ENGINE_ERROR, None, None),
        Failure.ENGINE_UPDATE_UNANSWERED: Verdict(ErrorCode.ENGINE_ERROR, None, None),
        Failure.INTERNAL: Verdict(None, CloseCode.INTERNAL_ERROR, "internal error"),
        Failure.DISCONNECTED: Verdict(None, CloseCode.NORMAL, "disconnected"),
        Failure.OBSERVER_DONE: Verdict(None, CloseCode.NORMAL, None),
    }
)


@dataclass(frozen=True, slots=True)
class Close:
    """Close the socket with ``code`` once everything sent before has gone out."""

    code: CloseCode
    reason: str


def close_code(failure: Failure) -> int:
    """The WebSocket close code ``failure`` ends a socket with (for one it does not end: a bug)."""
    code = FAILURES[failure].close
    if code is None:
        raise ValueError(f"{failure} does not close the socket")
    return int(code)


def close_for(failure: Failure, reason: str | None = None) -> Close:
    """The close ``failure`` ends a socket with; ``reason`` names what the table leaves to the caller."""
    verdict = FAILURES[failure]
    reason = reason if reason is not None else verdict.reason
    if verdict.close is None or reason is None:
        raise ValueError(f"{failure} does not close the socket, or needs a reason")
    return Close(verdict.close, reason)


#: What an engine's ``open_session`` may raise that is not a bug, and the failure each is (first match).
ENGINE_OPEN_FAILURES: Mapping[type[Exception], Failure] = MappingProxyType(
    {
        port.EngineSessionLimit: Failure.ENGINE_FULL,
        port.EngineUnavailable: Failure.ENGINE_UNAVAILABLE,
        TimeoutError: Failure.ENGINE_UNAVAILABLE,  # no answer in limits.engine_timeout_s
    }
)

_OPEN_MESSAGES = {
    Failure.ENGINE_FULL: "the engine has no room for another session",
    Failure.ENGINE_UNAVAILABLE: "the engine is not available",
}


def engine_open_failure(exc: BaseException) -> tuple[Failure, str] | None:
    """The failure an engine's ``open_session`` raised, and its message (None: not one the table knows)."""
    for kind, failure in ENGINE_OPEN_FAILURES.items():
        if isinstance(exc, kind):
            return failure, str(exc) or _OPEN_MESSAGES[failure]
    return None


def engine_call_failure(exc: BaseException) -> tuple[Failure, str]:
    """A failed engine call (other than ``session.update``'s), and the message the client is told."""
    if isinstance(exc, port.EngineRefused):
        # The engine turned this one call down (e.g. a kind of input it does not take).
        return Failure.ENGINE_REFUSED_CALL, f"the engine refused it: {exc}"
    return Failure.ENGINE_CALL_FAILED, f"the engine failed: {type(exc).__name__}"


def update_refusal(exc: BaseException, timeout_s: float) -> tuple[str, str]:
    """The code and message a failed ``session.update`` call is refused with (the session tells the client)."""
    if isinstance(exc, port.EngineRefused):
        return exc.code, exc.message
    if isinstance(exc, TimeoutError):
        return ErrorCode.ENGINE_ERROR.value, f"no answer in {timeout_s:g} s"
    return ErrorCode.ENGINE_ERROR.value, f"the engine failed: {type(exc).__name__}"


def protocol_failure(exc: ProtocolError) -> Failure:
    """What a client's ProtocolError costs: that message, or (``unauthorized``) the connection."""
    return Failure.UNAUTHORIZED if exc.code is ErrorCode.UNAUTHORIZED else Failure.BAD_MESSAGE
