"""The webhooks a carrier calls when a call comes in, answered by the gateway itself.

Point a number's voice URL at one of these and the call's audio streams to
``/telephony/<carrier>`` on the same gateway:

* ``POST /telephony/twilio/voice`` → TwiML ``<Connect><Stream>`` (``X-Twilio-Signature`` checked
  when ``telephony.twilio.auth_token`` is set);
* ``POST /telephony/telnyx/texml`` → TeXML ``<Connect><Stream bidirectionalMode="rtp">``
  (Ed25519 ``telnyx-signature-ed25519`` checked when ``telephony.telnyx.public_key`` is set);
* ``GET|POST /telephony/plivo/answer`` → Plivo XML ``<Stream bidirectional="true">``
  (``X-Plivo-Signature-V3`` checked when ``telephony.plivo.auth_token`` is set);
* ``GET|POST /telephony/vonage/answer`` → an NCCO ``connect`` to a ``websocket`` endpoint.

Who called whom goes along with the stream (Twilio ``<Parameter>``, Plivo ``extraHeaders``,
Vonage ``headers``), and so do the query parameters added to the webhook URL whose names
start with a small letter, such as ``?profile=sales`` (a ``telephony.profiles`` key). The stream
URLs come from ``telephony.public_url`` (``https://`` → ``wss://``), else from the request's Host
and scheme.

The signatures are checked by the gateway's auth layer (:mod:`duplex_gateway.auth`), before a
handler runs: :func:`signature_checks` hands it one check per signed endpoint, the Twilio media
stream's upgrade (:func:`stream_upgrade_allowed`) among them. A request whose signature does not
check out gets 403 and nothing else happens.
"""

from __future__ import annotations

import json
import logging
import re
import xml.etree.ElementTree as ET
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from duplex_gateway.auth.gate import SignatureCheck
from duplex_gateway.config import ConfigError, GatewaySettings, TelephonySettings
from duplex_gateway.extras import require
from duplex_gateway.telephony.signatures import (
    telnyx_public_key,
    validate_plivo_v3,
    validate_telnyx,
    validate_twilio,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "MAX_WEBHOOK_BODY_BYTES",
    "WebhookRequest",
    "public_base_urls",
    "signature_checks",
    "stream_upgrade_allowed",
    "stream_url",
    "webhook_routes",
]

logger = logging.getLogger(__name__)

#: Carriers' webhook bodies are a few hundred bytes of form fields; anything far larger is refused.
MAX_WEBHOOK_BODY_BYTES = 64 << 10
#: Query parameters of a webhook URL passed on with the stream: how many, and how long.
_MAX_PASSED = 10
_MAX_VALUE_CHARS = 256
#: Passed on: names that start with a small letter. The carriers' own fields are capitalized
#: (Twilio, Telnyx, Plivo: ``From``, ``CallSid``, ...) or listed here (Vonage's GET answer, and
#: Twilio's ``bodySHA256``, which belongs to the signed URL).
_PASSED_NAME = re.compile(r"^[a-z][A-Za-z0-9_-]{0,63}$")
_NOT_PASSED = frozenset(
    {"bodySHA256", "from", "to", "uuid", "conversation_uuid", "region_url", "endpoint_type", "from_user"}
)
#: Plivo's ``extraHeaders``: letters and digits only, 512 bytes at most.
_PLIVO_HEADER_BYTES = 512
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")

_XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>'


# -- URLs ------------------------------------------------------------------------------------


def public_base_urls(conn: HTTPConnection, settings: TelephonySettings) -> list[str]:
    """The ``http(s)://host[/prefix]`` the carrier may have called, most likely first.

    ``telephony.public_url`` when set; else the request's Host with its scheme, then with
    the other one (a proxy in front may have ended TLS; the signature still has to match).
    """
    if settings.public_url:
        return [settings.public_url.rstrip("/")]
    scheme = "https" if conn.url.scheme in ("https", "wss") else "http"
    other = "http" if scheme == "https" else "https"
    host = conn.headers.get("host") or conn.url.netloc
    return [f"{scheme}://{host}", f"{other}://{host}"]


def _ws(base: str) -> str:
    if base.startswith("https://"):
        return "wss://" + base[len("https://") :]
    if base.startswith("http://"):
        return "ws://" + base[len("http://") :]
    return base


def stream_url(conn: HTTPConnection, settings: TelephonySettings, carrier: str) -> str:
    """``ws(s)://PUBLIC/telephony/<carrier>``: where the carrier is told to stream the call."""
    return f"{_ws(public_base_urls(conn, settings)[0])}/telephony/{carrier}"


def _request_urls(conn: HTTPConnection, settings: TelephonySettings, *, websocket: bool = False) -> list[str]:
    """The full URLs (query included) the carrier may have signed for this request."""
    query = conn.scope.get("query_string", b"").decode("latin-1")
    urls = []
    for base in public_base_urls(conn, settings):
        url = f"{_ws(base) if websocket else base}{conn.url.path}"
        urls.append(f"{url}?{query}" if query else url)
        if query and websocket:
            urls.append(url)  # a stream URL has no query; try it bare too
    return urls


# -- the request -------------------------------------------------------------------------------


@dataclass(slots=True)
class WebhookRequest:
    """What a webhook brought: the raw body, its fields (form or JSON), and the URL's query."""

    body: bytes
    fields: list[tuple[str, str]] = field(default_factory=list)
    query: list[tuple[str, str]] = field(default_factory=list)
    json_body: bool = False

    def get(self, *names: str) -> str | None:
        """The first non-empty value of any of ``names``, from the body, then the query."""
        for source in (self.fields, self.query):
            for name in names:
                for key, value in source:
                    if key == name and value:
                        return value
        return None

    def passed(self) -> dict[str, str]:
        """The URL's query parameters that go along with the stream (``?profile=sales``)."""
        out: dict[str, str] = {}
        for name, value in self.query:
            if name in _NOT_PASSED or not _PASSED_NAME.match(name) or name in out:
                continue
            if len(out) >= _MAX_PASSED:
                break
            out[name] = value[:_MAX_VALUE_CHARS]
        return out


class _TooLarge(Exception):
    pass


async def _read(request: Request) -> WebhookRequest:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_WEBHOOK_BODY_BYTES:
        raise _TooLarge
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_WEBHOOK_BODY_BYTES:
            raise _TooLarge
        chunks.append(chunk)
    return _parse(request, b"".join(chunks))


def _parse(conn: HTTPConnection, body: bytes) -> WebhookRequest:
    query = parse_qsl(conn.scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    content_type = conn.headers.get("content-type", "").split(";")[0].strip().lower()
    fields: list[tuple[str, str]] = []
    is_json = content_type == "application/json" or content_type.endswith("+json")
    if is_json:
        try:
            data = json.loads(body) if body else {}
        except ValueError:
            data = {}
        if isinstance(data, dict):
            fields = [(str(k), text) for k, v in data.items() if (text := _text(v)) is not None]
    elif body and content_type in ("application/x-www-form-urlencoded", ""):
        fields = parse_qsl(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return WebhookRequest(body=body, fields=fields, query=query, json_body=is_json)


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return str(value)
    return None


# -- the answers -------------------------------------------------------------------------------


def twiml(url: str, parameters: Mapping[str, str]) -> str:
    """``<Response><Connect><Stream url=...><Parameter .../>...</Stream></Connect></Response>``."""
    root = ET.Element("Response")
    stream = ET.SubElement(ET.SubElement(root, "Connect"), "Stream", {"url": url})
    for name, value in parameters.items():
        ET.SubElement(stream, "Parameter", {"name": name, "value": value})
    return _XML_DECLARATION + ET.tostring(root, encoding="unicode")


def texml(url: str) -> str:
    """Telnyx TeXML: ``<Connect><Stream>`` with the bidirectional RTP mode the gateway talks."""
    root = ET.Element("Response")
    ET.SubElement(
        ET.SubElement(root, "Connect"),
        "Stream",
        {
            "url": url,
            # The caller's audio in the codec of the replies: else Telnyx streams the call's own
            # codec (PCMA on an A-law call) while it expects PCMU back.
            "codec": "PCMU",
            "bidirectionalMode": "rtp",
            "bidirectionalCodec": "PCMU",
            "bidirectionalSamplingRate": "8000",
        },
    )
    return _XML_DECLARATION + ET.tostring(root, encoding="unicode")


def plivo_extra_headers(headers: Mapping[str, str]) -> str:
    """``name=value,...`` of letters and digits only (Plivo's rule), at most 512 bytes."""
    pairs: list[str] = []
    size = 0
    for name, value in headers.items():
        pair = f"{_NOT_ALNUM.sub('', name)}={_NOT_ALNUM.sub('', value)}"
        if pair.startswith("="):
            continue
        added = len(pair) + (1 if pairs else 0)
        if size + added > _PLIVO_HEADER_BYTES:
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
    return _XML_DECLARATION + ET.tostring(root, encoding="unicode")


def ncco(url: str, headers: Mapping[str, str]) -> list[dict[str, Any]]:
    """Vonage's NCCO: connect the call to the gateway's WebSocket, 16 kHz linear PCM."""
    endpoint = {
        "type": "websocket",
        "uri": url,
        "content-type": "audio/l16;rate=16000",
        "headers": dict(headers),
    }
    return [{"action": "connect", "endpoint": [endpoint]}]


def _who(request: WebhookRequest, caller: Iterable[str], callee: Iterable[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    if (value := request.get(*caller)) is not None:
        out["from"] = value
    if (value := request.get(*callee)) is not None:
        out["to"] = value
    return out


def _refused(carrier: str, what: str) -> bool:
    logger.warning("refused a %s webhook: %s", carrier, what)
    return False


# -- the routes --------------------------------------------------------------------------------


Handler = Callable[[Request], Awaitable[Response]]


def _guarded(handler: Callable[[Request, WebhookRequest], Awaitable[Response]]) -> Handler:
    async def endpoint(request: Request) -> Response:
        try:
            webhook = await _read(request)
        except _TooLarge:
            return PlainTextResponse("request body too large", status_code=413)
        return await handler(request, webhook)

    return endpoint


class _Webhooks:
    def __init__(self, settings: TelephonySettings) -> None:
        self.settings = settings
        self.telnyx_key: Ed25519PublicKey | None = None
        if settings.telnyx.public_key:
            require("telephony", "telephony.telnyx.public_key (Telnyx signatures)", ("cryptography",))
            try:
                self.telnyx_key = telnyx_public_key(settings.telnyx.public_key)
            except ValueError as exc:
                raise ConfigError(f"telephony.telnyx.public_key: {exc}") from None

    # -- signatures (run by the auth layer before the handlers) ----------------------------------

    def twilio_signed(self, conn: HTTPConnection, body: bytes) -> bool:
        token = self.settings.twilio.auth_token or ""
        webhook = _parse(conn, body)
        signature = conn.headers.get("x-twilio-signature")
        params = None if webhook.json_body else webhook.fields
        urls = _request_urls(conn, self.settings)
        if any(validate_twilio(token, url, params, signature, body=body) for url in urls):
            return True
        return _refused("Twilio", "X-Twilio-Signature does not match")

    def telnyx_signed(self, conn: HTTPConnection, body: bytes) -> bool:
        assert self.telnyx_key is not None
        if validate_telnyx(
            self.telnyx_key,
            body,
            conn.headers.get("telnyx-signature-ed25519"),
            conn.headers.get("telnyx-timestamp"),
            tolerance_s=self.settings.telnyx.signature_tolerance_s,
        ):
            return True
        return _refused("Telnyx", "telnyx-signature-ed25519 does not verify, or the timestamp is stale")

    def plivo_signed(self, conn: HTTPConnection, body: bytes) -> bool:
        token = self.settings.plivo.auth_token or ""
        method = conn.scope.get("method", "GET")
        nonce = conn.headers.get("x-plivo-signature-v3-nonce")
        signatures = conn.headers.get("x-plivo-signature-v3")
        params = _parse(conn, body).fields if method == "POST" else None
        if any(
            validate_plivo_v3(token, url, nonce, signatures, params, method)
            for url in _request_urls(conn, self.settings)
        ):
            return True
        return _refused("Plivo", "X-Plivo-Signature-V3 does not match")

    def twilio_stream_signed(self, conn: HTTPConnection, body: bytes) -> bool:
        return stream_upgrade_allowed(conn, "twilio", self.settings)

    # -- the answers -------------------------------------------------------------------------------

    async def twilio_voice(self, request: Request, webhook: WebhookRequest) -> Response:
        parameters = {**_who(webhook, ("From", "from"), ("To", "to")), **webhook.passed()}
        answer = twiml(stream_url(request, self.settings, "twilio"), parameters)
        return Response(answer, media_type="text/xml")

    async def telnyx_texml(self, request: Request, webhook: WebhookRequest) -> Response:
        return Response(texml(stream_url(request, self.settings, "telnyx")), media_type="text/xml")

    async def plivo_answer(self, request: Request, webhook: WebhookRequest) -> Response:
        headers = {**_who(webhook, ("From", "from"), ("To", "to")), **webhook.passed()}
        answer = plivo_xml(stream_url(request, self.settings, "plivo"), headers)
        return Response(answer, media_type="text/xml")

    async def vonage_answer(self, request: Request, webhook: WebhookRequest) -> Response:
        headers = _who(webhook, ("from", "From"), ("to", "To"))
        if (uuid := webhook.get("uuid")) is not None:
            headers["uuid"] = uuid  # the call's id, for the REST hang-up
        headers.update(webhook.passed())
        return JSONResponse(ncco(stream_url(request, self.settings, "vonage"), headers))


def webhook_routes(settings: GatewaySettings | TelephonySettings) -> list[Route]:
    """The carriers' answer webhooks; ``ConfigError`` if a configured key is unusable."""
    telephony = settings.telephony if isinstance(settings, GatewaySettings) else settings
    hooks = _Webhooks(telephony)
    return [
        Route("/telephony/twilio/voice", _guarded(hooks.twilio_voice), methods=["POST"]),
        Route("/telephony/telnyx/texml", _guarded(hooks.telnyx_texml), methods=["POST"]),
        Route("/telephony/plivo/answer", _guarded(hooks.plivo_answer), methods=["GET", "POST"]),
        Route("/telephony/vonage/answer", _guarded(hooks.vonage_answer), methods=["GET", "POST"]),
    ]


def signature_checks(settings: GatewaySettings | TelephonySettings) -> list[SignatureCheck]:
    """The carriers' signature checks the auth layer runs, for the carriers whose keys are configured.

    ``ConfigError`` if a configured key is unusable.
    """
    telephony = settings.telephony if isinstance(settings, GatewaySettings) else settings
    hooks = _Webhooks(telephony)
    checks: list[SignatureCheck] = []
    body = MAX_WEBHOOK_BODY_BYTES
    post, get_post, upgrade = frozenset({"POST"}), frozenset({"GET", "POST"}), frozenset({"WEBSOCKET"})
    if telephony.twilio.auth_token:
        checks.append(SignatureCheck(
            carrier="twilio", path="/telephony/twilio/voice", methods=post, verify=hooks.twilio_signed,
            max_body_bytes=body,
        ))
        checks.append(SignatureCheck(
            carrier="twilio", path="/telephony/twilio", methods=upgrade, verify=hooks.twilio_stream_signed,
        ))
    if hooks.telnyx_key is not None:
        checks.append(SignatureCheck(
            carrier="telnyx", path="/telephony/telnyx/texml", methods=post, verify=hooks.telnyx_signed,
            max_body_bytes=body,
        ))
    if telephony.plivo.auth_token:
        checks.append(SignatureCheck(
            carrier="plivo", path="/telephony/plivo/answer", methods=get_post, verify=hooks.plivo_signed,
            max_body_bytes=body,
        ))
    return checks


# -- the media stream's upgrade ----------------------------------------------------------------


def stream_upgrade_allowed(conn: HTTPConnection, carrier: str | None, settings: TelephonySettings) -> bool:
    """Whether a media stream's WebSocket upgrade may be accepted.

    Twilio signs the upgrade of ``/telephony/twilio`` with ``X-Twilio-Signature`` over the
    ``wss://`` URL written into the TwiML (no parameters); with ``telephony.twilio.auth_token``
    set, an upgrade without a matching signature is refused. Other carriers: always allowed.
    """
    if carrier != "twilio" or not settings.twilio.auth_token:
        return True
    token = settings.twilio.auth_token
    signature = conn.headers.get("x-twilio-signature")
    urls = _request_urls(conn, settings, websocket=True)
    if any(validate_twilio(token, url, None, signature) for url in urls):
        return True
    logger.warning("refused a Twilio media stream: X-Twilio-Signature does not match")
    return False
