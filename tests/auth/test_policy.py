"""What each endpoint needs, browser origins, and how a refusal reads."""

from __future__ import annotations

import json

import pytest

from duplex_gateway.auth.policy import Denial, Open, OriginPolicy, requirement
from duplex_gateway.auth.principal import Scope
from duplex_gateway.vocabulary.errors import ErrorCode


@pytest.mark.parametrize(
    ("kind", "path", "query", "needed"),
    [
        ("websocket", "/v1/realtime", {}, Scope.REALTIME),
        ("websocket", "/v1/realtime", {"duplex": "1"}, Scope.DUPLEX),
        ("websocket", "/v1/realtime", {"duplex": "true", "resume": "1"}, Scope.DUPLEX),
        ("websocket", "/v1/realtime", {"resume": "1"}, Scope.REALTIME),
        ("websocket", "/v1/realtime", {"call_id": "CA1", "duplex": "1"}, Scope.OBSERVE),
        ("websocket", "/v1/duplex", {}, Scope.DUPLEX),
        ("websocket", "/telephony/twilio", {}, Open.CARRIER),
        ("websocket", "/telephony", {}, Open.CARRIER),
        ("websocket", "/somewhere/else", {}, Scope.REALTIME),  # a session, whatever its path
        ("http", "/telephony/twilio/voice", {}, Open.CARRIER),
        ("http", "/v1/realtime/client_secrets", {}, Scope.CLIENT_SECRETS),
        ("http", "/v1/realtime/calls/CA1/hangup", {}, Scope.TELEPHONY),
        ("websocket", "/v1/live/sessions", {}, Scope.REALTIME),
        ("http", "/v1/live/sessions", {}, Scope.REALTIME),  # a Live WebRTC offer: a session, as its WebSocket
        ("http", "/v1/live/sessions/sess_1/hangup", {}, Scope.TELEPHONY),
        ("http", "/admin/backends", {}, Scope.ADMIN),
        ("http", "/admin", {}, Scope.ADMIN),
        ("http", "/administrator", {}, Open.PUBLIC),
        ("http", "/v1/auth/check", {}, Scope.REALTIME),
        ("http", "/v1/auth/check", {"scope": "observe"}, Scope.OBSERVE),
        ("http", "/v1/auth/check", {"scope": "nonsense"}, Scope.REALTIME),
        ("http", "/healthz", {}, Open.PUBLIC),
        ("http", "/readyz", {}, Open.PUBLIC),
        ("http", "/", {}, Open.PUBLIC),
        ("http", "/app.js", {}, Open.PUBLIC),
    ],
)
def test_requirement(kind: str, path: str, query: dict[str, str], needed: object) -> None:
    assert requirement(kind, path, query) == needed


def test_extra_http_rules() -> None:
    rules = (("/metrics", Scope.ADMIN),)
    assert requirement("http", "/metrics", {}, rules) is Scope.ADMIN
    assert requirement("http", "/admin/backends", {}, rules) is Open.PUBLIC


def test_any_origin_when_none_is_listed() -> None:
    policy = OriginPolicy()
    assert policy.allows("https://anything.example", "gw:8000") and policy.allows(None, None)


def test_listed_origins() -> None:
    policy = OriginPolicy(["https://app.example.com", "http://localhost:5173", "https://*.example.org"])
    allowed = [
        "https://app.example.com",
        "HTTPS://APP.EXAMPLE.COM",
        "https://app.example.com:443",
        "https://app.example.com/",
        "http://localhost:5173",
        "https://a.example.org",
        "https://a.b.example.org",
    ]
    refused = [
        "http://app.example.com",  # another scheme is another origin
        "https://app.example.com:8443",
        "https://evil.example",
        "http://localhost:5174",
        "https://example.org",
        "https://evilexample.org",
        "http://a.example.org",
        "https://app.example.com.evil.example",
        "null",
        "not a url",
        "ftp://app.example.com",
    ]
    for origin in allowed:
        assert policy.allows(origin, "gw.internal:8000"), origin
    for origin in refused:
        assert not policy.allows(origin, "gw.internal:8000"), origin
    # No Origin: not a browser (or a same-origin GET). The gateway's own origin: its demo page.
    assert policy.allows(None, "gw.internal:8000")
    assert policy.allows("http://gw.internal:8000", "gw.internal:8000")
    assert policy.allows("https://gw.internal", "gw.internal:443")
    assert not policy.allows("http://gw.internal:8001", "gw.internal:8000")


def test_null_origin_only_when_listed() -> None:
    assert OriginPolicy(["null"]).allows("null", "gw")
    assert not OriginPolicy(["https://a.example"]).allows("null", "gw")


def test_denial_bodies_and_headers() -> None:
    denial = Denial(429, ErrorCode.RATE_LIMITED, "slow down", retry_after_s=7)
    body = json.loads(denial.body())
    assert body == {
        "error": {"type": "rate_limit_error", "code": "rate_limited", "message": "slow down", "param": None}
    }
    headers = dict(denial.headers())
    assert headers[b"retry-after"] == b"7" and headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == str(len(denial.body())).encode()
    unauthorized = dict(Denial(401, ErrorCode.UNAUTHORIZED, "no key").headers())
    assert unauthorized[b"www-authenticate"].startswith(b"Bearer")
    plain = Denial(403, ErrorCode.INVALID_SIGNATURE, "invalid signature", plain=True)
    assert plain.body() == b"invalid signature"
    assert dict(plain.headers())[b"content-type"].startswith(b"text/plain")
