"""The carriers' answer webhooks and signature checks, served for every carrier in the table.

Point a number's voice URL at a carrier's answer webhook (``/telephony/<carrier>/<path>``,
as its :class:`~duplex_gateway.telephony.carrier.CarrierSpec` declares) and the call's audio
streams to ``/telephony/<carrier>`` on the same gateway. Each carrier writes its own answer
(TwiML, TeXML, XML, an NCCO, ...) from the webhook's fields; this module reads the request,
bounds its body and hands the answer back.

Who called whom goes along with the stream, and so do the query parameters added to the
webhook URL whose names start with a small letter, such as ``?profile=sales`` (a
``telephony.profiles`` key). The stream URLs come from ``telephony.public_url`` (``https://``
→ ``wss://``), else from the request's Host and scheme.

The signatures are checked by the gateway's auth layer (:mod:`duplex_gateway.auth`), before a
handler runs: :func:`signature_checks` hands it one check per signed endpoint a carrier's
settings turn on, its media stream's upgrade among them. A request whose signature does not
check out gets 403 and nothing else happens.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl

from starlette.requests import HTTPConnection, Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from duplex_gateway.auth.gate import SignatureCheck
from duplex_gateway.config import ConfigError, GatewaySettings, TelephonySettings
from duplex_gateway.extras import require
from duplex_gateway.telephony.carrier import CarrierSpec
from duplex_gateway.telephony.control import SignatureRule, SignedRequest, WebhookRequest
from duplex_gateway.telephony.registry import specs

__all__ = [
    "MAX_WEBHOOK_BODY_BYTES",
    "WebhookRequest",
    "public_base_urls",
    "signature_checks",
    "stream_url",
    "webhook_routes",
]

logger = logging.getLogger(__name__)

#: Carriers' webhook bodies are a few hundred bytes of form fields; anything far larger is refused.
MAX_WEBHOOK_BODY_BYTES = 64 << 10

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


def _settings(settings: GatewaySettings | TelephonySettings) -> TelephonySettings:
    return settings.telephony if isinstance(settings, GatewaySettings) else settings


def _answering(carrier: CarrierSpec[Any], settings: TelephonySettings) -> Handler:
    async def answer(request: Request, webhook: WebhookRequest) -> Response:
        answer = carrier.answer(webhook, stream_url(request, settings, carrier.name))
        return Response(answer.body, media_type=answer.media_type)

    return _guarded(answer)


def webhook_routes(settings: GatewaySettings | TelephonySettings) -> list[Route]:
    """The carriers' answer webhooks, ``/telephony/<carrier>/<path>``."""
    telephony = _settings(settings)
    return [
        Route(
            f"/telephony/{carrier.name}/{carrier.answer_hook.path}",
            _answering(carrier, telephony),
            methods=list(carrier.answer_hook.methods),
        )
        for carrier in specs()
        if carrier.answer_hook is not None
    ]


def _rules(carrier: CarrierSpec[Any], settings: TelephonySettings) -> list[SignatureRule]:
    """The signature rules ``settings`` turn on for ``carrier``; ``ConfigError`` if a key is unusable."""
    section = carrier.settings_of(settings)
    for need in carrier.needs(section):  # a key cannot even be read without its extra
        require("telephony", need.what, need.modules)
    try:
        return list(carrier.signatures(section))
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _signed(
    conn: HTTPConnection, body: bytes, settings: TelephonySettings, *, websocket: bool
) -> SignedRequest:
    webhook = _parse(conn, body)
    return SignedRequest(
        method="GET" if websocket else conn.scope.get("method", "GET"),
        urls=_request_urls(conn, settings, websocket=websocket),
        headers=conn.headers,
        body=body,
        fields=webhook.fields,
        json_body=webhook.json_body,
    )


def _check(carrier: CarrierSpec[Any], rule: SignatureRule, settings: TelephonySettings) -> SignatureCheck:
    websocket = rule.on == "stream"
    what = "media stream" if websocket else "webhook"

    def verify(conn: HTTPConnection, body: bytes) -> bool:
        if rule.verify(_signed(conn, body, settings, websocket=websocket)):
            return True
        logger.warning("refused a %s %s: %s", carrier.title, what, rule.refusal)
        return False

    if websocket:
        return SignatureCheck(
            carrier=carrier.name,
            path=f"/telephony/{carrier.name}",
            methods=frozenset({"WEBSOCKET"}),
            verify=verify,
        )
    assert carrier.answer_hook is not None, f"{carrier.name} signs an answer webhook it does not have"
    return SignatureCheck(
        carrier=carrier.name,
        path=f"/telephony/{carrier.name}/{carrier.answer_hook.path}",
        methods=frozenset(carrier.answer_hook.methods),
        verify=verify,
        max_body_bytes=MAX_WEBHOOK_BODY_BYTES,
    )


def signature_checks(settings: GatewaySettings | TelephonySettings) -> list[SignatureCheck]:
    """The carriers' signature checks the auth layer runs, for the carriers whose keys are configured.

    ``ConfigError`` if a configured key is unusable.
    """
    telephony = _settings(settings)
    return [_check(carrier, rule, telephony) for carrier in specs() for rule in _rules(carrier, telephony)]
