"""Every way into a REAL gateway, and every way it refuses, on every endpoint: no bypass.

One gateway with keys of every scope, client secrets, an Origin allowlist and every
carrier's signature configured (engine ``remote`` in front of an echo backend, so the
admin endpoints exist too). Each row is a way to present a credential (or none, or a bad
one); each column an endpoint, in each of its dialects. A cell is the outcome a real
client gets: ``in`` (the upgrade, or the HTTP answer of the handler itself) or the status
of the refusal. The test computes what each cell must be from the documented rules,
prints the matrix, and fails on any bypass (in where it must be refused) or wrong refusal.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from websockets.exceptions import InvalidStatus

from duplex_gateway.auth.principal import Scope
from duplex_gateway.auth.tokens import TokenSigner
from duplex_gateway.telephony.carriers.plivo import plivo_v3_signature
from duplex_gateway.telephony.carriers.twilio import twilio_signature
from tests.e2e.helpers import Gateway, GatewayFactory, recv_until, ws_connect
from tests.reliability.clients import record

pytestmark = pytest.mark.e2e

SECRET = "matrix-token-secret-0123456789abcdef"
PUBLIC_URL = "https://gw.example.com"
TWILIO_TOKEN = "twilio-auth-token"
PLIVO_TOKEN = "plivo-auth-token"
TELNYX_KEY = Ed25519PrivateKey.generate()
ORIGIN = "https://app.example.com"
#: Keys by name: the key itself and its scopes.
KEYS: dict[str, tuple[str, frozenset[Scope]]] = {
    "all": ("sk-all", frozenset(Scope)),
    "realtime": ("sk-rt", frozenset({Scope.REALTIME})),
    "duplex": ("sk-dup", frozenset({Scope.DUPLEX})),
    "observe": ("sk-obs", frozenset({Scope.OBSERVE})),
    "telephony": ("sk-tel", frozenset({Scope.TELEPHONY})),
    "admin": ("sk-adm", frozenset({Scope.ADMIN})),
    "minter": ("sk-mint", frozenset({Scope.CLIENT_SECRETS, Scope.REALTIME})),
}
#: What a client secret may do at most (and never mint another).
SECRET_SCOPES = frozenset({Scope.REALTIME, Scope.DUPLEX, Scope.OBSERVE})


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    backend = module_gateway_factory.start({"server": {"web_demo": False}}, name="matrix-backend")
    telnyx_public = base64.b64encode(
        TELNYX_KEY.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    ).decode()
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {
                "name": "remote",
                "remote": {
                    "backends": [{"url": backend.ws_url, "max_sessions": 64}],
                    "health_path": "/readyz",
                },
            },
            "auth": {
                "keys": [
                    {"name": name, "key": key, "scopes": sorted(s.value for s in scopes)}
                    for name, (key, scopes) in KEYS.items()
                ],
                "token_secret": SECRET,
                "allowed_origins": [ORIGIN],
            },
            "telephony": {
                "public_url": PUBLIC_URL,
                "twilio": {"auth_token": TWILIO_TOKEN},
                "plivo": {"auth_token": PLIVO_TOKEN},
                "telnyx": {"public_key": telnyx_public},
            },
        },
        name="matrix",
    )


# -- credentials ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Way:
    """A way of presenting a secret: where it goes in the request."""

    name: str
    websocket: bool = True
    http: bool = True


WAYS = {
    "bearer": Way("Authorization: Bearer"),
    "x-api-key": Way("X-API-Key", websocket=False),
    "subprotocol": Way("subprotocol openai-insecure-api-key.KEY", http=False),
    "subprotocol-b64": Way("subprotocol openai-insecure-api-key.b64.KEY", http=False),
    "query": Way("?api_key=KEY"),
}


@dataclass(frozen=True)
class Credential:
    """One row: a secret (or none), where it goes, and the scopes it should grant (None: refused)."""

    label: str
    secret: str | None
    way: str
    scopes: frozenset[Scope] | None
    origin: str | None = None
    is_secret: bool = False


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _mint(gw: Gateway, key: str) -> str:
    request = urllib.request.Request(
        gw.base_url + "/v1/realtime/client_secrets",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["value"])


def credentials(gw: Gateway) -> list[Credential]:
    rows = [
        Credential(f"key {name} by {way}", key, way, scopes)
        for name, (key, scopes) in KEYS.items()
        for way in WAYS
    ]
    rows.extend(
        Credential(f"client secret by {way}", _mint(gw, "sk-all"), way, SECRET_SCOPES, is_secret=True)
        for way in ("bearer", "subprotocol")
    )
    signer = TokenSigner(SECRET.encode())
    expired, _ = signer.mint(key_name="all", scopes=SECRET_SCOPES, now=time.time() - 3600, ttl_s=600)
    genuine = _mint(gw, "sk-all")
    tampered = genuine[:5] + ("A" if genuine[5] != "A" else "B") + genuine[6:]
    foreign, _ = TokenSigner(b"another-gateway-secret-0123456789").mint(
        key_name="all",
        scopes=SECRET_SCOPES,
        now=time.time(),
        ttl_s=600,
    )
    rows += [
        Credential("no credential", None, "bearer", None),
        Credential("wrong key by bearer", "sk-wrong", "bearer", None),
        Credential("wrong key by subprotocol", "sk-wrong", "subprotocol", None),
        Credential("wrong key by query", "sk-wrong", "query", None),
        Credential("expired secret", expired, "bearer", None, is_secret=True),
        Credential("tampered secret", tampered, "subprotocol", None, is_secret=True),
        Credential("secret of another gateway", foreign, "bearer", None, is_secret=True),
        Credential("key all, allowed Origin", "sk-all", "bearer", frozenset(Scope), origin=ORIGIN),
        Credential("key all, other Origin", "sk-all", "bearer", None, origin="https://evil.example"),
    ]
    return rows


def _headers(cred: Credential) -> tuple[dict[str, str], list[str], str]:
    """Headers, subprotocols and query string that carry ``cred``."""
    headers: dict[str, str] = {}
    protocols: list[str] = []
    query = ""
    if cred.origin is not None:
        headers["Origin"] = cred.origin
    if cred.secret is None:
        return headers, protocols, query
    if cred.way == "bearer":
        headers["Authorization"] = f"Bearer {cred.secret}"
    elif cred.way == "x-api-key":
        headers["X-API-Key"] = cred.secret
    elif cred.way == "subprotocol":
        protocols = ["realtime", f"openai-insecure-api-key.{cred.secret}"]
    elif cred.way == "subprotocol-b64":
        protocols = ["realtime", f"openai-insecure-api-key.b64.{_b64(cred.secret)}"]
    elif cred.way == "query":
        query = "api_key=" + urllib.parse.quote(cred.secret)
    return headers, protocols, query


# -- endpoints --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One column: a request and the scope it needs (None: a carrier's, no key asked)."""

    label: str
    websocket: bool
    path: str
    scope: Scope | None
    method: str = "GET"
    body: bytes = b""
    extra_headers: Callable[[bytes], dict[str, str]] | None = None


def endpoints(live_session: str) -> list[Endpoint]:
    return [
        Endpoint("WS /v1/realtime", True, "/v1/realtime", Scope.REALTIME),
        Endpoint("WS /v1/realtime beta", True, "/v1/realtime?beta=1", Scope.REALTIME),
        Endpoint("WS /v1/realtime transcription", True, "/v1/realtime?intent=transcription", Scope.REALTIME),
        Endpoint("WS /v1/realtime?resume=1", True, "/v1/realtime?resume=1", Scope.REALTIME),
        Endpoint("WS /v1/realtime?duplex=1", True, "/v1/realtime?duplex=1", Scope.DUPLEX),
        Endpoint("WS /v1/duplex", True, "/v1/duplex", Scope.DUPLEX),
        Endpoint("WS /v1/realtime?call_id=", True, f"/v1/realtime?call_id={live_session}", Scope.OBSERVE),
        Endpoint(
            "POST client_secrets", False, "/v1/realtime/client_secrets", Scope.CLIENT_SECRETS, "POST", b"{}"
        ),
        Endpoint(
            "POST calls/*/hangup", False, "/v1/realtime/calls/no_such_call/hangup", Scope.TELEPHONY, "POST"
        ),
        Endpoint("GET /admin/backends", False, "/admin/backends", Scope.ADMIN),
        Endpoint("GET /metrics", False, "/metrics", Scope.ADMIN),
        Endpoint("GET /v1/auth/check", False, "/v1/auth/check?scope=realtime", Scope.REALTIME),
    ]


def _post_form(fields: dict[str, str]) -> bytes:
    return urllib.parse.urlencode(fields).encode()


TWILIO_FORM = {"CallSid": "CA1", "From": "+15550100", "To": "+15550199"}
PLIVO_FORM = {"CallUUID": "u1", "From": "14155550100", "To": "14155550199"}


def carrier_cases() -> list[tuple[str, Endpoint, dict[str, str], bool]]:
    """Carrier endpoints with their signatures: (label, endpoint, headers, expected in)."""
    stream = Endpoint("WS /telephony/twilio", True, "/telephony/twilio", None)
    voice = Endpoint(
        "POST /telephony/twilio/voice",
        False,
        "/telephony/twilio/voice",
        None,
        "POST",
        _post_form(TWILIO_FORM),
    )
    plivo = Endpoint(
        "POST /telephony/plivo/answer", False, "/telephony/plivo/answer", None, "POST", _post_form(PLIVO_FORM)
    )
    texml = Endpoint(
        "POST /telephony/telnyx/texml", False, "/telephony/telnyx/texml", None, "POST", b'{"data": {}}'
    )
    now = str(int(time.time()))
    telnyx_good = base64.b64encode(TELNYX_KEY.sign(now.encode() + b"|" + texml.body)).decode()
    stale = str(int(time.time()) - 3600)
    telnyx_stale = base64.b64encode(TELNYX_KEY.sign(stale.encode() + b"|" + texml.body)).decode()
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    return [
        ("no signature", stream, {}, False),
        ("wrong signature", stream, {"X-Twilio-Signature": "AAAA"}, False),
        (
            "signature of another token",
            stream,
            {"X-Twilio-Signature": twilio_signature("other", "wss://gw.example.com/telephony/twilio")},
            False,
        ),
        (
            "Twilio signature",
            stream,
            {"X-Twilio-Signature": twilio_signature(TWILIO_TOKEN, "wss://gw.example.com/telephony/twilio")},
            True,
        ),
        ("no signature", voice, form, False),
        ("wrong signature", voice, {**form, "X-Twilio-Signature": "AAAA"}, False),
        (
            "Twilio signature",
            voice,
            {
                **form,
                "X-Twilio-Signature": twilio_signature(
                    TWILIO_TOKEN, PUBLIC_URL + "/telephony/twilio/voice", TWILIO_FORM
                ),
            },
            True,
        ),
        ("no signature", plivo, form, False),
        (
            "wrong signature",
            plivo,
            {**form, "X-Plivo-Signature-V3": "AAAA", "X-Plivo-Signature-V3-Nonce": "n1"},
            False,
        ),
        (
            "Plivo signature",
            plivo,
            {
                **form,
                "X-Plivo-Signature-V3-Nonce": "n1",
                "X-Plivo-Signature-V3": plivo_v3_signature(
                    PLIVO_TOKEN, PUBLIC_URL + "/telephony/plivo/answer", "n1", PLIVO_FORM
                ),
            },
            True,
        ),
        ("no signature", texml, {"Content-Type": "application/json"}, False),
        (
            "stale signature",
            texml,
            {
                "Content-Type": "application/json",
                "telnyx-timestamp": stale,
                "telnyx-signature-ed25519": telnyx_stale,
            },
            False,
        ),
        (
            "wrong signature",
            texml,
            {
                "Content-Type": "application/json",
                "telnyx-timestamp": now,
                "telnyx-signature-ed25519": base64.b64encode(bytes(64)).decode(),
            },
            False,
        ),
        (
            "Telnyx signature",
            texml,
            {
                "Content-Type": "application/json",
                "telnyx-timestamp": now,
                "telnyx-signature-ed25519": telnyx_good,
            },
            True,
        ),
        (
            "Twilio signature, other Origin",
            stream,
            {
                "Origin": "https://evil.example",
                "X-Twilio-Signature": twilio_signature(TWILIO_TOKEN, "wss://gw.example.com/telephony/twilio"),
            },
            False,
        ),
    ]


# -- trying ----------------------------------------------------------------------------------------


async def attempt(
    gw: Gateway, endpoint: Endpoint, headers: dict[str, str], protocols: list[str], query: str
) -> str:
    """``in``, or the refusal's HTTP status."""
    path = endpoint.path
    if query:
        path += ("&" if "?" in path else "?") + query
    if endpoint.websocket:
        origin = headers.pop("Origin", None)
        try:
            async with ws_connect(
                gw,
                path,
                additional_headers=headers,
                subprotocols=protocols or None,
                origin=origin,  # type: ignore[arg-type]
                compression=None,
            ):
                return "in"
        except InvalidStatus as exc:
            return str(exc.response.status_code)
    return await asyncio.to_thread(_http, gw, endpoint, path, headers)


def _http(gw: Gateway, endpoint: Endpoint, path: str, headers: dict[str, str]) -> str:
    request = urllib.request.Request(
        gw.base_url + path, data=endpoint.body or None, method=endpoint.method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        body = exc.read()
        # The handler answered (e.g. hangup of a call that does not exist): past the auth layer.
        if exc.code == 404 and b"not_found" in body:
            return "in"
        return str(exc.code)
    return "in" if status == 200 else str(status)


def expected(cred: Credential, endpoint: Endpoint) -> bool:
    if cred.scopes is None or endpoint.scope is None:
        return False
    if cred.is_secret and endpoint.scope is Scope.CLIENT_SECRETS:
        return False  # a client secret never mints another
    return endpoint.scope in cred.scopes


async def test_every_way_in_and_every_refusal_on_every_endpoint(gateway: Gateway) -> None:
    async with ws_connect(
        gateway, additional_headers={"Authorization": "Bearer sk-all"}, compression=None
    ) as live:
        created, _ = await recv_until(live, "session.created")
        cols = endpoints(created["session"]["id"])
        rows = credentials(gateway)
        matrix: list[tuple[str, list[str]]] = []
        bypasses: list[str] = []
        wrong_refusals: list[str] = []
        cells = 0
        for cred in rows:
            way = WAYS[cred.way]
            line = []
            for endpoint in cols:
                if (endpoint.websocket and not way.websocket) or (not endpoint.websocket and not way.http):
                    line.append("·")
                    continue
                headers, protocols, query = _headers(cred)
                outcome = await attempt(gateway, endpoint, headers, protocols, query)
                cells += 1
                want = expected(cred, endpoint)
                line.append("in" if outcome == "in" else outcome)
                if outcome == "in" and not want:
                    bypasses.append(f"{cred.label} -> {endpoint.label}")
                elif outcome != "in" and want:
                    wrong_refusals.append(f"{cred.label} -> {endpoint.label}: {outcome}")
            matrix.append((cred.label, line))
        carrier_lines = []
        for label, endpoint, headers, want in carrier_cases():
            outcome = await attempt(gateway, endpoint, dict(headers), [], "")
            cells += 1
            carrier_lines.append(f"{endpoint.label:32} {label:34} {outcome}")
            if outcome == "in" and not want:
                bypasses.append(f"{label} -> {endpoint.label}")
            elif outcome != "in" and want:
                wrong_refusals.append(f"{label} -> {endpoint.label}: {outcome}")
    width = max(len(label) for label, _ in matrix)
    heads = [c.label.replace("WS ", "").replace("GET ", "").replace("POST ", "") for c in cols]
    table = [" " * width + " | " + " | ".join(f"{h[:14]:14}" for h in heads)]
    table += [f"{label:{width}} | " + " | ".join(f"{cell:14}" for cell in line) for label, line in matrix]
    print("\n" + "\n".join(table) + "\n\n" + "\n".join(carrier_lines))
    record(
        "auth_matrix",
        cells=cells,
        bypasses=len(bypasses),
        wrong_refusals=len(wrong_refusals),
        rows=len(rows),
        endpoints=[c.label for c in cols],
        carrier_cases=len(carrier_lines),
        bypass_list=bypasses,
        wrong_refusal_list=wrong_refusals,
        table=table,
        carriers=carrier_lines,
    )
    assert not bypasses, bypasses
    assert not wrong_refusals, wrong_refusals
