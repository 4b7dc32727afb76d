"""Twilio Media Streams, bidirectional (``<Connect><Stream>``).

JSON text frames; audio is base64 μ-law at 8 kHz both ways. Twilio echoes a mark
once the audio sent before it has played, and on ``clear`` echoes every pending
mark at once (the playout's clear epoch tells those apart). ``sequenceNumber``,
``chunk`` and ``timestamp`` are strings.

The control plane: the voice webhook (``POST /telephony/twilio/voice``) answers TwiML
``<Connect><Stream>`` with who called whom as ``<Parameter>``s; with ``telephony.twilio.auth_token``
set, ``X-Twilio-Signature`` is checked on it and on the stream's upgrade; with the account SID
too, a call the gateway ends is completed over REST.

``X-Twilio-Signature``: base64 HMAC-SHA1, keyed with the auth token, over the full URL Twilio
requested followed by every POST parameter's name and value, sorted by name (a repeated name:
its distinct values, sorted). A JSON body is not among the parameters: Twilio puts
``bodySHA256=<hex SHA-256 of the body>`` in the URL, signs the URL alone, and the body must
hash to that value. Twilio's own signing is not consistent about the default port, so the URL
is tried with and without it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qs, urlsplit

from pydantic import Field

from duplex_gateway.dialects import wire_codec
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.control import (
    NOT_CONFIGURED,
    XML_DECLARATION,
    Answer,
    AnswerHook,
    CarrierSettings,
    HangupRequest,
    Need,
    Refusal,
    SignatureRule,
    SignedRequest,
    WebhookRequest,
    path_segment,
)
from duplex_gateway.telephony.signatures import Params, equal, multi, url_port_variants
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "MULAW_8K",
    "SPEC",
    "TwilioCarrier",
    "TwilioSettings",
    "twilio_body_hash",
    "twilio_signature",
    "twiml",
    "validate_twilio",
]

MULAW_8K = AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)


class TwilioCarrier:
    """One Twilio media stream."""

    name: ClassVar[str] = "twilio"
    framing = call.Framing(chunk_ms=40)
    has_marks = True

    def __init__(self) -> None:
        self.stream_sid: str | None = None

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A Twilio start: ``start.streamSid`` and ``start.callSid``."""
        message = call.peek_json(frame)
        start = message.get("start") if message else None
        return isinstance(start, dict) and "streamSid" in start and "callSid" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Twilio")
        kind = message.get("event")
        if kind == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise call.bad_message("a Twilio media message has no 'media' object")
            track = media.get("track", "inbound")
            if track not in ("inbound", "inbound_track"):
                return []  # only the caller's side is the caller
            return [call.CallAudio(call.media_payload(media, "Twilio"))]
        if kind == "start":
            return [self._start(message)]
        if kind == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            return [call.MarkPlayed(name)] if isinstance(name, str) and name else []
        if kind == "dtmf":
            dtmf = message.get("dtmf")
            digit = dtmf.get("digit") if isinstance(dtmf, dict) else None
            return [call.Dtmf(digit)] if isinstance(digit, str) and digit else []
        if kind == "stop":
            return [call.CallEnded("stop")]
        if kind == "connected":
            return []
        raise call.bad_message(f"unknown Twilio event {str(kind)[:64]!r}")

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("a Twilio start message has no 'start' object")
        self.stream_sid = call.text_field(start, "streamSid") or call.text_field(message, "streamSid")
        if self.stream_sid is None:
            raise call.bad_message("a Twilio start message names no streamSid")
        fmt = start.get("mediaFormat")
        if isinstance(fmt, dict) and fmt.get("encoding") not in (None, "audio/x-mulaw"):
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                f"Twilio media format {fmt.get('encoding')!r} is not audio/x-mulaw",
            )
        params = start.get("customParameters")
        parameters = {str(k): str(v) for k, v in params.items()} if isinstance(params, dict) else {}
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "callSid"),
            stream_id=self.stream_sid,
            # Twilio passes the numbers only as the TwiML's <Parameter>s (the gateway's webhook adds them).
            caller=parameters.get("from") or parameters.get("From"),
            callee=parameters.get("to") or parameters.get("To"),
            parameters=parameters,
            input_format=MULAW_8K,
            output_format=MULAW_8K,
        )

    def media(self, audio: bytes) -> Sequence[Frame]:
        payload = wire_codec.b64encode(audio)
        return [call.dump({"event": "media", "streamSid": self.stream_sid, "media": {"payload": payload}})]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "mark", "streamSid": self.stream_sid, "mark": {"name": name}})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clear", "streamSid": self.stream_sid})

    def hangup(self) -> Frame | None:
        return None  # closing the stream ends a <Connect><Stream> call


# -- the control plane ----------------------------------------------------------------------


class TwilioSettings(CarrierSettings):
    """Twilio credentials: the auth token checks ``X-Twilio-Signature``; both hang calls up over REST."""

    account_sid: str | None = None
    auth_token: str | None = None
    api_base_url: str = Field("https://api.twilio.com", pattern=r"^https?://\S+$")


def twilio_signature(auth_token: str, url: str, params: Params | None = None) -> str:
    """The ``X-Twilio-Signature`` Twilio sends for a request to ``url`` with POST ``params``."""
    message = url
    values = multi(params)
    for name in sorted(values):
        for value in sorted(set(values[name])):
            message += name + value
    digest = hmac.new(auth_token.encode(), message.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def twilio_body_hash(body: bytes | str) -> str:
    """The ``bodySHA256`` Twilio puts in the URL of a request with a JSON body."""
    return hashlib.sha256(body.encode() if isinstance(body, str) else body).hexdigest()


def validate_twilio(
    auth_token: str,
    url: str,
    params: Params | None,
    signature: str | None,
    *,
    body: bytes | str | None = None,
) -> bool:
    """Whether ``signature`` is Twilio's for ``url`` and ``params``.

    If the URL carries ``bodySHA256``, the parameters are not signed and ``body`` (the raw
    request body) must hash to that value.
    """
    if not signature or not auth_token:
        return False
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    body_ok = True
    if "bodySHA256" in query:
        body_ok = body is not None and equal(twilio_body_hash(body), query["bodySHA256"][0])
        params = None
    matches = [
        equal(twilio_signature(auth_token, candidate, params), signature.strip())
        for candidate in url_port_variants(url)
    ]
    return body_ok and any(matches)


def twiml(url: str, parameters: Mapping[str, str]) -> str:
    """``<Response><Connect><Stream url=...><Parameter .../>...</Stream></Connect></Response>``."""
    root = ET.Element("Response")
    stream = ET.SubElement(ET.SubElement(root, "Connect"), "Stream", {"url": url})
    for name, value in parameters.items():
        ET.SubElement(stream, "Parameter", {"name": name, "value": value})
    return XML_DECLARATION + ET.tostring(root, encoding="unicode")


class TwilioSpec(call.CarrierSpec[TwilioSettings]):
    """Twilio: Media Streams, the TwiML voice webhook, ``X-Twilio-Signature``, the Calls API."""

    name = "twilio"
    title = "Twilio"
    wire_class = TwilioCarrier
    settings_model = TwilioSettings
    answer_hook = AnswerHook("voice", ("POST",))

    def answer(self, request: WebhookRequest, stream_url: str) -> Answer:
        parameters = {**request.who(("From", "from"), ("To", "to")), **request.passed()}
        return Answer(twiml(stream_url, parameters), "text/xml")

    def signatures(self, settings: TwilioSettings) -> Sequence[SignatureRule]:
        token = settings.auth_token
        if not token:
            return ()

        def webhook(request: SignedRequest) -> bool:
            signature = request.header("x-twilio-signature")
            params = None if request.json_body else request.fields
            return any(
                validate_twilio(token, url, params, signature, body=request.body) for url in request.urls
            )

        def stream(request: SignedRequest) -> bool:
            # The upgrade is signed over the wss:// URL written into the TwiML (no parameters).
            signature = request.header("x-twilio-signature")
            return any(validate_twilio(token, url, None, signature) for url in request.urls)

        return (
            SignatureRule("answer", webhook, "X-Twilio-Signature does not match"),
            SignatureRule("stream", stream, "X-Twilio-Signature does not match"),
        )

    def needs(self, settings: TwilioSettings) -> Sequence[Need]:
        return ()  # its REST hang-up needs only the core

    def hangup_request(self, call_id: str, settings: TwilioSettings) -> HangupRequest | Refusal:
        # POST {base}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json Status=completed, Basic auth.
        sid, token = settings.account_sid, settings.auth_token
        if not (sid and token):
            return NOT_CONFIGURED
        base = settings.api_base_url.rstrip("/")
        return HangupRequest(
            "POST",
            f"{base}/2010-04-01/Accounts/{path_segment(sid)}/Calls/{path_segment(call_id)}.json",
            {"Accept": "application/json"},
            auth=(sid, token),
            data={"Status": "completed"},
        )

    def already_ended(self, status: int, codes: frozenset[str]) -> bool:
        return status == 404 and "20404" in codes


SPEC = TwilioSpec()
