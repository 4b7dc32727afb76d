"""Plivo audio streams, bidirectional (``<Stream bidirectional="true">``).

JSON text frames in camelCase; ``sequenceNumber`` is a number. Audio is base64 in the
``<Stream contentType>`` of the call, both ways: ``audio/x-l16`` at 8 or 16 kHz (the
default, 8 kHz) or ``audio/x-mulaw`` at 8 kHz. Reply audio goes out as ``playAudio``;
a ``checkpoint`` is the mark, answered by ``playedStream`` only once the audio before
it has played. ``clearAudio`` drops the audio Plivo holds and is answered by
``clearedAudio``; the checkpoints it dropped are never answered. Plivo sends no
``stop``: the socket just closes, and the gateway ends the session on disconnect.

The control plane: the answer webhook (``GET|POST /telephony/plivo/answer``) answers Plivo XML
``<Stream bidirectional="true" keepCallAlive="true">`` with who called whom as ``extraHeaders``;
with ``telephony.plivo.auth_token`` set, ``X-Plivo-Signature-V3`` is checked on it (base64
HMAC-SHA256, keyed with the auth token, over the URL with its query sorted and the POST
parameters appended, a dot and ``X-Plivo-Signature-V3-Nonce``; the header may hold several
signatures, comma-separated). With the auth id too, a call the gateway ends is deleted over REST.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

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
from duplex_gateway.telephony.signatures import Params, equal, multi
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "L16_RATES",
    "SPEC",
    "PlivoCarrier",
    "PlivoSettings",
    "extra_headers",
    "plivo_extra_headers",
    "plivo_v3_signature",
    "plivo_xml",
    "validate_plivo_v3",
]

#: ``extraHeaders`` in the answer: letters and digits only, 512 bytes at most.
_EXTRA_HEADER_BYTES = 512
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")

#: Rates Plivo streams ``audio/x-l16`` at; μ-law is 8 kHz only.
L16_RATES = (8_000, 16_000)
_L16 = "audio/x-l16"
_MULAW = "audio/x-mulaw"


class PlivoCarrier:
    """One Plivo audio stream."""

    name: ClassVar[str] = "plivo"
    framing = call.Framing(chunk_ms=40)
    has_marks = True

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self.format: AudioFormat | None = None

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A Plivo start: ``start.streamId`` and ``start.callId``."""
        message = call.peek_json(frame)
        start = message.get("start") if message else None
        return isinstance(start, dict) and "streamId" in start and "callId" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Plivo")
        kind = message.get("event")
        if kind == "media":
            media = message.get("media")
            if not isinstance(media, dict):
                raise call.bad_message("a Plivo media message has no 'media' object")
            if media.get("track", "inbound") not in ("inbound", "inbound_track"):
                return []  # only the caller's side is the caller
            return [call.CallAudio(self._payload(media))]
        if kind == "start":
            return [self._start(message)]
        if kind == "playedStream":
            return [call.MarkPlayed(_text(message, "name", "playedStream"))]
        if kind == "clearedAudio":
            return [call.CarrierCleared()]
        if kind == "dtmf":
            dtmf = message.get("dtmf")
            return [call.Dtmf(_text(dtmf if isinstance(dtmf, dict) else {}, "digit", "dtmf"))]
        if kind == "stop":
            return [call.CallEnded("stop")]  # not documented, but a stream that says so has ended
        raise call.bad_message(f"unknown Plivo event {str(kind)[:64]!r}")

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("a Plivo start message has no 'start' object")
        self.stream_id = call.text_field(start, "streamId") or call.text_field(message, "streamId")
        if self.stream_id is None:
            raise call.bad_message("a Plivo start message names no streamId")
        # A format the gateway cannot take raises UNSUPPORTED_*: the call dialect ends such a call.
        self.format = _format(start.get("mediaFormat") or {})
        raw = message.get("extra_headers", start.get("extra_headers"))
        if isinstance(raw, dict):
            parameters = {str(k): str(v) for k, v in raw.items() if v is not None}
        else:
            parameters = extra_headers(raw) if isinstance(raw, str) else {}
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "callId"),
            stream_id=self.stream_id,
            # Plivo passes the numbers only as the <Stream>'s extraHeaders (the gateway's webhook adds them).
            caller=_first(parameters, "from", "From", "caller"),
            callee=_first(parameters, "to", "To", "callee"),
            parameters=parameters,
            input_format=self.format,
            output_format=self.format,
        )

    def _payload(self, media: dict[str, Any]) -> bytes:
        audio = call.media_payload(media, "Plivo")
        if self.format is not None and len(audio) % self.format.encoding.bytes_per_sample:
            raise call.bad_message(f"a Plivo media payload of {len(audio)} bytes is not whole samples")
        return audio

    def media(self, audio: bytes) -> Sequence[Frame]:
        fmt = self.format or AudioFormat(encoding=Encoding.PCM16, rate=8_000)
        return [
            call.dump(
                {
                    "event": "playAudio",
                    "streamId": self.stream_id,
                    "media": {
                        "contentType": _MULAW if fmt.encoding is Encoding.G711_ULAW else _L16,
                        "sampleRate": fmt.rate,
                        "payload": wire_codec.b64encode(audio),
                    },
                }
            )
        ]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "checkpoint", "streamId": self.stream_id, "name": name})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clearAudio", "streamId": self.stream_id})

    def hangup(self) -> Frame | None:
        return (
            None  # closing the stream ends it (with keepCallAlive, the answer XML goes on or the call ends)
        )


def extra_headers(raw: str) -> dict[str, str]:
    """``extra_headers`` as parameters: ``"k=v;k2=v2"`` (what ``<Stream extraHeaders>`` carries).

    Plivo's examples separate the pairs with ``;`` on the socket and ``,`` in the XML
    attribute; both are taken (keys and values are letters and digits only, so neither
    can be part of one)."""
    text = raw.strip()
    if text.startswith("{"):
        # Some Plivo deployments write an (often empty) JSON object instead.
        try:
            data = json.loads(text)
        except ValueError:
            return {}
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    parameters: dict[str, str] = {}
    for pair in re.split("[;,]", text):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            parameters[key.strip()] = value.strip()
    return parameters


def _format(fmt: Any) -> AudioFormat:
    if not isinstance(fmt, dict):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "a Plivo start's mediaFormat is not an object"
        )
    # L16 byte order: little-endian, taken and sent as the session's PCM16 unchanged. Plivo
    # documents audio/x-l16 as raw 16-bit linear PCM, not as an RTP L16 payload (which would
    # be big-endian, as Telnyx's is), and public Plivo integrations pass it through as
    # little-endian PCM16 both ways. A live call with the wrong order sounds like loud noise.
    raw = call.text_field(fmt, "encoding") or _L16
    mime, _, rest = raw.partition(";")
    encoding = mime.strip().lower()
    rate = _rate(fmt.get("sampleRate"), rest)
    if encoding == _MULAW:
        if rate not in (None, 8_000):
            raise ProtocolError(ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Plivo {_MULAW} at {rate} Hz: 8000 only")
        return AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)
    if encoding == _L16:
        rate = rate or 8_000
        if rate not in L16_RATES:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Plivo {_L16} at {rate} Hz: 8000 or 16000 only"
            )
        return AudioFormat(encoding=Encoding.PCM16, rate=rate)
    raise ProtocolError(
        ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
        f"Plivo encoding {raw[:48]!r} is not {_L16} or {_MULAW} (the <Stream contentType>)",
    )


def _rate(value: Any, params: str) -> int | None:
    """``mediaFormat.sampleRate``, else a ``;rate=`` in the encoding; None when neither says."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if value is not None:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"a Plivo sampleRate is not a number: {str(value)[:32]!r}"
        )
    for part in params.split(";"):
        key, _, text = part.partition("=")
        if key.strip().lower() == "rate" and text.strip().isdigit():
            return int(text)
    return None


def _text(obj: Mapping[str, Any], key: str, kind: str) -> str:
    value = call.text_field(obj, key)  # a digit written as a number is still the digit
    if value is None:
        raise call.bad_message(f"a Plivo {kind} message has no {key}")
    return value


def _first(parameters: Mapping[str, str], *keys: str) -> str | None:
    for key in keys:
        if parameters.get(key):
            return parameters[key]
    return None


# -- the control plane ----------------------------------------------------------------------


class PlivoSettings(CarrierSettings):
    """Plivo: the auth token checks ``X-Plivo-Signature-V3``; auth id and token hang calls up."""

    auth_id: str | None = None
    auth_token: str | None = None
    api_base_url: str = Field("https://api.plivo.com", pattern=r"^https?://\S+$")


def _signed_url(url: str, params: Params | None, method: str) -> str:
    parts = urlsplit(url)
    base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
    query = multi(parse_qsl(parts.query, keep_blank_values=True))
    posted = multi(params)
    if method.upper() == "GET":
        for name, values in posted.items():  # a GET's parameters are its query
            query.setdefault(name, []).extend(values)
        posted = {}
    sorted_query = "&".join(f"{name}={value}" for name in sorted(query) for value in sorted(query[name]))
    if sorted_query or posted:
        base += "?" + sorted_query
    if sorted_query and posted:
        base += "."
    return base + "".join(name + value for name in sorted(posted) for value in sorted(posted[name]))


def plivo_v3_signature(
    auth_token: str, url: str, nonce: str, params: Params | None = None, method: str = "POST"
) -> str:
    """The ``X-Plivo-Signature-V3`` Plivo sends for a ``method`` request to ``url`` with ``params``."""
    message = f"{_signed_url(url, params, method)}.{nonce}"
    digest = hmac.new(auth_token.encode(), message.encode(), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def validate_plivo_v3(
    auth_token: str,
    url: str,
    nonce: str | None,
    signatures: str | None,
    params: Params | None = None,
    method: str = "POST",
) -> bool:
    """Whether any of the comma-separated ``signatures`` is Plivo's for this request."""
    if not signatures or nonce is None or not auth_token:
        return False
    expected = plivo_v3_signature(auth_token, url, nonce, params, method)
    matches = [equal(expected, given.strip()) for given in signatures.split(",")]
    return any(matches)


def plivo_extra_headers(headers: Mapping[str, str]) -> str:
    """``name=value,...`` of letters and digits only (Plivo's rule), at most 512 bytes."""
    pairs: list[str] = []
    size = 0
    for name, value in headers.items():
        pair = f"{_NOT_ALNUM.sub('', name)}={_NOT_ALNUM.sub('', value)}"
        if pair.startswith("="):
            continue
        added = len(pair) + (1 if pairs else 0)
        if size + added > _EXTRA_HEADER_BYTES:
            break
        pairs.append(pair)
        size += added
    return ",".join(pairs)


def plivo_xml(url: str, headers: Mapping[str, str]) -> str:
    """Plivo's ``<Stream bidirectional="true" keepCallAlive="true" ...>wss://...</Stream>``."""
    root = ET.Element("Response")
    attributes = {
        "bidirectional": "true",
        "keepCallAlive": "true",
        "contentType": "audio/x-mulaw;rate=8000",
    }
    extra = plivo_extra_headers(headers)
    if extra:
        attributes["extraHeaders"] = extra
    stream = ET.SubElement(root, "Stream", attributes)
    stream.text = url
    return XML_DECLARATION + ET.tostring(root, encoding="unicode")


class PlivoSpec(call.CarrierSpec[PlivoSettings]):
    """Plivo: audio streams, the answer XML, ``X-Plivo-Signature-V3``, the Call API."""

    name = "plivo"
    title = "Plivo"
    wire_class = PlivoCarrier
    settings_model = PlivoSettings
    answer_hook = AnswerHook("answer", ("GET", "POST"))

    def answer(self, request: WebhookRequest, stream_url: str) -> Answer:
        headers = {**request.who(("From", "from"), ("To", "to")), **request.passed()}
        return Answer(plivo_xml(stream_url, headers), "text/xml")

    def signatures(self, settings: PlivoSettings) -> Sequence[SignatureRule]:
        token = settings.auth_token
        if not token:
            return ()

        def webhook(request: SignedRequest) -> bool:
            nonce = request.header("x-plivo-signature-v3-nonce")
            signatures = request.header("x-plivo-signature-v3")
            params = request.fields if request.method == "POST" else None
            return any(
                validate_plivo_v3(token, url, nonce, signatures, params, request.method)
                for url in request.urls
            )

        return (SignatureRule("answer", webhook, "X-Plivo-Signature-V3 does not match"),)

    def needs(self, settings: PlivoSettings) -> Sequence[Need]:
        return ()  # its REST hang-up needs only the core

    def hangup_request(self, call_id: str, settings: PlivoSettings) -> HangupRequest | Refusal:
        # DELETE {base}/v1/Account/{auth_id}/Call/{call_uuid}/, Basic auth; 204 when done.
        auth_id, token = settings.auth_id, settings.auth_token
        if not (auth_id and token):
            return NOT_CONFIGURED
        return HangupRequest(
            "DELETE",
            f"{settings.api_base_url.rstrip('/')}/v1/Account/{path_segment(auth_id)}/Call/{path_segment(call_id)}/",
            {"Accept": "application/json"},
            auth=(auth_id, token),
        )

    def already_ended(self, status: int, codes: frozenset[str]) -> bool:
        return status == 404


SPEC = PlivoSpec()
