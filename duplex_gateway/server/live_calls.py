"""OpenAI's Live API over WebRTC: what ``POST /v1/live/sessions`` takes and what it answers.

The request is JSON, as OpenAI's SDKs send it (``client.live.create``)::

    {"session": {"model": "gpt-live-1", ...}, "transport": {"type": "webrtc", "sdp": "v=0..."}}

``session`` is the Live session's startup configuration, read as the WebSocket's
``session.start`` reads its own (:func:`~duplex_gateway.dialects.live_webrtc.check_webrtc_session`);
the answer is ``201`` with the session's id and the SDP answer::

    {"session": {"id": "sess_..."}, "transport": {"type": "webrtc", "sdp": "v=0..."}}

A refusal is ``{"error": {"type", "code", "message", "param"}}`` with the Live API's codes, the
ones a ``session.start`` over the WebSocket gets for the same mistake. The call itself is served
by :class:`~duplex_gateway.server.webrtc.WebRtcCalls`; this module only reads and writes HTTP.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from duplex_gateway.auth.policy import LIVE_SESSIONS_PATH
from duplex_gateway.dialects.live_errors import (
    INVALID_VALUE,
    LiveProtocolError,
    bad_value,
    check_fields,
    read_object,
    read_str,
    refuse,
    wrong_type,
)
from duplex_gateway.dialects.live_session import LiveSetup
from duplex_gateway.dialects.live_webrtc import check_webrtc_session
from duplex_gateway.server.webrtc import MAX_SDP_BYTES
from duplex_gateway.vocabulary.errors import ErrorCode, error_type_for

__all__ = [
    "LIVE_SESSIONS_PATH",
    "LiveCall",
    "RefusedLiveCall",
    "live_call_answer",
    "read_live_call",
]


@dataclass(frozen=True, slots=True)
class LiveCall:
    """What a ``POST /v1/live/sessions`` asked for: the session to start, and the offer."""

    #: The ``session`` object as sent: the session's first client event carries it.
    session: Mapping[str, object]
    #: The same, validated.
    setup: LiveSetup
    sdp: str


class RefusedLiveCall(Exception):
    """A request the endpoint refuses, with the Live API's code (and the HTTP status)."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.error_type = "invalid_request_error"

    @classmethod
    def from_protocol(cls, exc: LiveProtocolError) -> RefusedLiveCall:
        refused = cls(400, exc.live, exc.message, param=exc.param)
        refused.error_type = error_type_for(exc.code)
        return refused

    def response(self) -> Response:
        error = {"type": self.error_type, "code": self.code, "message": self.message, "param": self.param}
        return JSONResponse({"error": error}, self.status)


async def read_live_call(request: Request, *, max_bytes: int) -> LiveCall:
    """The session and the offer of a ``POST /v1/live/sessions``; raises :class:`RefusedLiveCall`."""
    body = await _body(request, max_bytes)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise RefusedLiveCall(400, "invalid_json", "The request body is not valid JSON.") from None
    try:
        if not isinstance(data, dict):
            raise wrong_type("", "an object", data)
        check_fields(data, ("session", "transport"), "")
        transport = read_object(data, "transport", "", required=True)
        assert transport is not None
        check_fields(transport, ("type", "sdp"), "transport")
        kind = read_str(transport, "type", "transport", required=True)
        if kind != "webrtc":
            raise bad_value("transport.type", kind, ("webrtc",))
        sdp = read_str(transport, "sdp", "transport", required=True)
        assert sdp is not None
        if len(sdp) > MAX_SDP_BYTES or not sdp.lstrip().startswith("v=0"):
            raise refuse(
                INVALID_VALUE,
                "Invalid 'transport.sdp': expected an SDP offer (it starts with v=0) "
                f"of at most {MAX_SDP_BYTES} bytes.",
                param="transport.sdp",
            )
        session = data.get("session")
        setup = check_webrtc_session(session)
    except LiveProtocolError as exc:
        raise RefusedLiveCall.from_protocol(exc) from None
    assert isinstance(session, dict)
    return LiveCall(session=session, setup=setup, sdp=sdp)


async def _body(request: Request, max_bytes: int) -> bytes:
    """The request body, refused (413) past ``max_bytes`` without reading it all."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise _too_large(max_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise RefusedLiveCall(
            400, "invalid_request", "The client went away while sending the body."
        ) from None
    return b"".join(chunks)


def _too_large(max_bytes: int) -> RefusedLiveCall:
    return RefusedLiveCall(
        413, ErrorCode.MESSAGE_TOO_LARGE.value, f"The request body exceeds the {max_bytes}-byte limit."
    )


def live_call_answer(session_id: str, sdp: str) -> Response:
    """``201``: the session's id (hang-ups name it) and the SDP answer, as ``LiveCreateResponse`` has them."""
    body = {"session": {"id": session_id}, "transport": {"type": "webrtc", "sdp": sdp}}
    return JSONResponse(body, 201, headers={"Location": f"{LIVE_SESSIONS_PATH}/{session_id}"})
