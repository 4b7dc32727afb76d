"""Error codes and WebSocket close codes: the gateway's whole failure vocabulary.

Every problem a client can cause is named here once. A :class:`ProtocolError`
raised anywhere in the sans-I/O core becomes one ``error`` event; which of them
also close the socket, and with which code, the host's one failure table says
(``duplex_gateway.host.closing``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["OPENAI_MESSAGES", "CloseCode", "ErrorCode", "ProtocolError", "error_type_for", "openai_message"]


class ErrorCode(enum.StrEnum):
    """The ``error.code`` values the gateway sends."""

    INVALID_JSON = "invalid_json"
    INVALID_EVENT = "invalid_event"
    UNKNOWN_EVENT = "unknown_event"
    MISSING_FIELD = "missing_field"
    INVALID_VALUE = "invalid_value"
    INVALID_BASE64 = "invalid_base64"
    INVALID_AUDIO_LENGTH = "invalid_audio_length"
    UNSUPPORTED_AUDIO_FORMAT = "unsupported_audio_format"
    UNSUPPORTED_SAMPLE_RATE = "unsupported_sample_rate"
    UNSUPPORTED_TURN_DETECTION = "unsupported_turn_detection"
    UNSUPPORTED_BY_ENGINE = "unsupported_by_engine"
    # The Live API's own (OpenAI documents the first two; the gateway names the others).
    UNKNOWN_PARAMETER = "unknown_parameter"
    FUNCTION_CALL_OUTPUTS_REQUIRED = "function_call_outputs_required"
    SESSION_ALREADY_STARTED = "session_already_started"
    DELEGATION_MODE_MISMATCH = "delegation_mode_mismatch"
    BINARY_NOT_SUPPORTED = "binary_not_supported"
    SESSION_NOT_CONFIGURED = "session_not_configured"
    INVALID_RESUME_TOKEN = "invalid_resume_token"
    RESUME_GAP = "resume_gap"
    INPUT_AUDIO_BUFFER_EMPTY = "input_audio_buffer_commit_empty"
    RESPONSE_ALREADY_ACTIVE = "conversation_already_has_active_response"
    RESPONSE_NOT_ACTIVE = "response_cancel_not_active"
    ITEM_NOT_FOUND = "item_not_found"
    ITEM_RETRIEVE_INVALID_ITEM_ID = "item_retrieve_invalid_item_id"
    ITEM_DELETE_INVALID_ITEM_ID = "item_delete_invalid_item_id"
    ITEM_TRUNCATE_INVALID_ITEM_ID = "item_truncate_invalid_item_id"
    AUDIO_END_OUT_OF_RANGE = "invalid_audio_end_ms"
    MESSAGE_TOO_LARGE = "message_too_large"
    INPUT_RATE_EXCEEDED = "input_rate_exceeded"
    SESSION_LIMIT = "session_limit"
    SERVER_SHUTTING_DOWN = "server_shutting_down"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    ORIGIN_NOT_ALLOWED = "origin_not_allowed"
    INVALID_SIGNATURE = "invalid_signature"
    RATE_LIMITED = "rate_limited"
    IDLE_TIMEOUT = "idle_timeout"
    SESSION_EXPIRED = "session_expired"
    SLOW_CONSUMER = "slow_consumer"
    ENGINE_ERROR = "engine_error"
    ENGINE_UNAVAILABLE = "engine_unavailable"
    INTERNAL_ERROR = "internal_error"


#: The errors OpenAI's Realtime server defines that the gateway sends too: OpenAI's code and the
#: start of OpenAI's message. Clients match on that text (LiveKit's plugin drops a cancel that raced
#: the server's own only when the message starts "Cancellation failed"; others look for "Conversation
#: already has an active response" or "Error committing input audio buffer"; Pipecat fails a pending
#: ``conversation.item.retrieve`` only on ``item_retrieve_invalid_item_id``), so every message the
#: gateway sends with one of these codes begins with it (:func:`openai_message`).
OPENAI_MESSAGES: Mapping[ErrorCode, str] = MappingProxyType(
    {
        ErrorCode.INPUT_AUDIO_BUFFER_EMPTY: "Error committing input audio buffer: buffer too small.",
        ErrorCode.RESPONSE_ALREADY_ACTIVE: "Conversation already has an active response in progress:",
        ErrorCode.RESPONSE_NOT_ACTIVE: "Cancellation failed: no active response found",
        ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID: "Error retrieving item:",
        ErrorCode.ITEM_DELETE_INVALID_ITEM_ID: "Error deleting item:",
        ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID: "Error truncating item:",
        ErrorCode.SESSION_EXPIRED: "Your session hit the maximum duration",
    }
)


def openai_message(code: ErrorCode, detail: str = "") -> str:
    """The message for ``code``: OpenAI's words (see :data:`OPENAI_MESSAGES`), then ``detail``."""
    head = OPENAI_MESSAGES[code]
    return f"{head} {detail}" if detail else head


_SERVER_SIDE = {
    ErrorCode.ENGINE_ERROR,
    ErrorCode.ENGINE_UNAVAILABLE,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.SERVER_SHUTTING_DOWN,
}
_RATE_LIMIT = {
    ErrorCode.INPUT_RATE_EXCEEDED,
    ErrorCode.SESSION_LIMIT,
    ErrorCode.SLOW_CONSUMER,
    ErrorCode.RATE_LIMITED,
}


def error_type_for(code: ErrorCode) -> str:
    """The OpenAI Realtime ``error.type`` bucket a code belongs to."""
    if code in _SERVER_SIDE:
        return "server_error"
    if code in _RATE_LIMIT:
        return "rate_limit_error"
    return "invalid_request_error"


class CloseCode(enum.IntEnum):
    """WebSocket close codes the gateway uses (documented in README)."""

    NORMAL = 1000  # session.close from the client, or the client went away
    GOING_AWAY = 1001  # the gateway is shutting down
    POLICY_VIOLATION = (
        1008  # a carrier stream or observer refused after the upgrade (keys are refused before it)
    )
    MESSAGE_TOO_BIG = 1009  # a frame above the hard size limit
    INTERNAL_ERROR = 1011  # an unexpected fault; details are withheld
    SERVICE_RESTART = 1012  # the gateway is restarting and another of its fleet has the session: resume it
    TRY_AGAIN_LATER = 1013  # max_sessions reached, the engine is not ready, or the gateway is draining
    IDLE_TIMEOUT = 4000  # no client message for idle_timeout_s
    MAX_DURATION = 4001  # the session reached max_session_s
    SLOW_CONSUMER = 4002  # the client did not read its events in time
    ENGINE_FAILED = 4003  # the engine ended the session


class ProtocolError(Exception):
    """Something the client sent that the gateway cannot act on."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        event_id: str | None = None,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.event_id = event_id
        self.param = param

    def with_event_id(self, event_id: str | None) -> ProtocolError:
        """The same error, attributed to the client event that caused it."""
        if event_id is None or self.event_id is not None:
            return self
        return ProtocolError(self.code, self.message, event_id=event_id, param=self.param)
