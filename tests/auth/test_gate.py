"""The decision for one request: credentials, scopes, engines, origins, carriers, rate and caps."""

from __future__ import annotations

from typing import Any

from starlette.requests import HTTPConnection

from duplex_gateway.auth.gate import Gate, SignatureCheck
from duplex_gateway.auth.keys import ApiKey, KeyStore, hash_key
from duplex_gateway.auth.limits import RateLimiter, SessionCaps, SessionHold
from duplex_gateway.auth.policy import Denial, OriginPolicy
from duplex_gateway.auth.principal import ALL_SCOPES, Principal, PrincipalKind, Scope
from duplex_gateway.auth.tokens import TokenSigner

NOW = 1_800_000_000.0
SECRET = b"t" * 32


def _key(name: str, secret: str, scopes: set[Scope] | frozenset[Scope] = ALL_SCOPES, **kw: Any) -> ApiKey:
    return ApiKey(name=name, digest=bytes.fromhex(hash_key(secret)[7:]), scopes=frozenset(scopes), **kw)


KEYS = KeyStore(
    [
        _key("all", "sk-all"),
        _key("web", "sk-web", {Scope.REALTIME, Scope.CLIENT_SECRETS, Scope.ADMIN}, max_sessions=2),
        _key("gpu", "sk-gpu", engines=frozenset({"remote"})),
    ]
)


def _gate(keys: KeyStore = KEYS, **kw: Any) -> Gate:
    return Gate(keys=keys, signer=TokenSigner(SECRET), engine="echo", **kw)


def _conn(
    path: str = "/v1/realtime",
    *,
    kind: str = "websocket",
    headers: dict[str, str] | None = None,
    query: str = "",
    client: str = "10.0.0.1",
    method: str = "GET",
) -> HTTPConnection:
    scope: dict[str, Any] = {
        "type": kind,
        "path": path,
        "root_path": "",
        "query_string": query.encode(),
        "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
        "client": (client, 50000),
        "scheme": "ws" if kind == "websocket" else "http",
        "server": ("gw", 8000),
    }
    if kind == "http":
        scope["method"] = method
    return HTTPConnection(scope)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _denied(result: Principal | Denial, status: int, reason: str) -> Denial:
    assert isinstance(result, Denial), result
    assert (result.status, result.reason) == (status, reason), result
    return result


def _principal(result: Principal | Denial) -> Principal:
    assert isinstance(result, Principal), result
    return result


def test_keys_scopes_and_engines() -> None:
    gate = _gate()
    assert _principal(gate.decide(_conn(headers=_bearer("sk-all")), now=NOW)).name == "all"
    web = _principal(
        gate.decide(
            _conn(headers={"Sec-WebSocket-Protocol": "realtime, openai-insecure-api-key.sk-web"}), now=NOW
        )
    )
    assert web.kind is PrincipalKind.KEY and web.max_sessions == 2
    denial = _denied(gate.decide(_conn(), now=NOW), 401, "missing_key")
    assert "Bearer" in denial.message
    denial = _denied(gate.decide(_conn(headers=_bearer("sk-wrong")), now=NOW), 401, "invalid_key")
    assert "sk-wrong" not in denial.message
    _denied(gate.decide(_conn("/v1/duplex", headers=_bearer("sk-web")), now=NOW), 403, "scope")
    _denied(gate.decide(_conn(query="call_id=CA1", headers=_bearer("sk-web")), now=NOW), 403, "scope")
    _denied(gate.decide(_conn(headers=_bearer("sk-gpu")), now=NOW), 403, "engine")
    # A wrong key next to a right one: the right one counts.
    assert _principal(gate.decide(_conn(headers={**_bearer("sk-wrong"), "X-API-Key": "sk-all"}), now=NOW))
    assert _principal(gate.decide(_conn(query="api_key=sk-all"), now=NOW)).name == "all"


def test_http_endpoints() -> None:
    gate = _gate()
    assert gate.decide(_conn("/healthz", kind="http"), now=NOW) == gate.decide(
        _conn("/", kind="http"), now=NOW
    )
    assert _principal(gate.decide(_conn("/healthz", kind="http"), now=NOW)).kind is PrincipalKind.ANONYMOUS
    _denied(gate.decide(_conn("/admin/backends", kind="http"), now=NOW), 401, "missing_key")
    assert _principal(
        gate.decide(_conn("/admin/backends", kind="http", headers={"X-API-Key": "sk-web"}), now=NOW)
    )
    hangup = _conn("/v1/realtime/calls/CA1/hangup", kind="http", method="POST", headers=_bearer("sk-web"))
    _denied(gate.decide(hangup, now=NOW), 403, "scope")
    # Metrics are an operator's: an admin key, like /admin.
    _denied(gate.decide(_conn("/metrics", kind="http"), now=NOW), 401, "missing_key")
    assert _principal(gate.decide(_conn("/metrics", kind="http", headers={"X-API-Key": "sk-web"}), now=NOW))


def test_no_keys_no_authentication() -> None:
    gate = _gate(KeyStore())
    for conn in (
        _conn(),
        _conn(headers=_bearer("anything")),
        _conn("/admin/x", kind="http"),
        _conn(headers=_bearer("ek_garbage.x")),
    ):
        assert _principal(gate.decide(conn, now=NOW)).kind is PrincipalKind.ANONYMOUS
    # A client secret minted while authentication is off still brings its session.
    token, _ = gate.signer.mint(
        key_name="anonymous", scopes=[Scope.REALTIME], now=NOW, ttl_s=60, session={"instructions": "hi"}
    )
    secret = _principal(gate.decide(_conn(headers=_bearer(token)), now=NOW))
    assert secret.kind is PrincipalKind.ANONYMOUS and secret.session == {"instructions": "hi"}
    assert secret.scopes == ALL_SCOPES


def test_client_secrets() -> None:
    gate = _gate()
    token, claims = gate.signer.mint(
        key_name="web", scopes=[Scope.REALTIME, Scope.ADMIN], now=NOW, ttl_s=60, session={"voice": "alloy"}
    )
    via_protocol = _conn(headers={"Sec-WebSocket-Protocol": f"realtime, openai-insecure-api-key.{token}"})
    secret = _principal(gate.decide(via_protocol, now=NOW + 1))
    assert secret.kind is PrincipalKind.CLIENT_SECRET and secret.name == "web"
    # Its key's cap, and never more than a browser needs: admin is dropped.
    assert (
        secret.scopes == {Scope.REALTIME}
        and secret.max_sessions == 2
        and secret.expires_at == claims.expires_at
    )
    assert secret.session == {"voice": "alloy"} and secret.is_key
    _denied(gate.decide(_conn("/admin/backends", kind="http", headers=_bearer(token)), now=NOW), 403, "scope")
    mint = _conn("/v1/realtime/client_secrets", kind="http", method="POST", headers=_bearer(token))
    assert "cannot mint" in _denied(gate.decide(mint, now=NOW), 403, "scope").message
    _denied(gate.decide(via_protocol, now=NOW + 60), 401, "expired_secret")
    # Another gateway's secret, or the key gone from the configuration: not valid.
    other, _ = TokenSigner(b"o" * 32).mint(key_name="web", scopes=[Scope.REALTIME], now=NOW, ttl_s=60)
    _denied(gate.decide(_conn(headers=_bearer(other)), now=NOW), 401, "invalid_key")
    _denied(_gate(KeyStore([_key("all", "sk-all")])).decide(via_protocol, now=NOW), 401, "invalid_key")
    # A secret of a key scoped to another engine.
    gpu, _ = gate.signer.mint(key_name="gpu", scopes=[Scope.REALTIME], now=NOW, ttl_s=60)
    _denied(gate.decide(_conn(headers=_bearer(gpu)), now=NOW), 403, "engine")


def test_origins_are_checked_first() -> None:
    gate = _gate(origins=OriginPolicy(["https://app.example.com"]))
    good = {"Origin": "https://app.example.com", "Host": "gw:8000", **_bearer("sk-all")}
    assert _principal(gate.decide(_conn(headers=good), now=NOW))
    bad = {**good, "Origin": "https://evil.example"}
    _denied(gate.decide(_conn(headers=bad), now=NOW), 403, "origin")
    _denied(gate.decide(_conn("/healthz", kind="http", headers=bad), now=NOW), 403, "origin")
    own = {"Origin": "http://gw:8000", "Host": "gw:8000", **_bearer("sk-all")}
    assert _principal(gate.decide(_conn(headers=own), now=NOW))


def test_rate_per_address_before_credentials() -> None:
    gate = _gate(rate=RateLimiter(2))
    assert _principal(gate.decide(_conn(headers=_bearer("sk-all")), now=NOW))
    _denied(gate.decide(_conn(headers=_bearer("bad")), now=NOW), 401, "invalid_key")  # counted too
    # The check endpoint peeks without taking.
    probe = _conn("/v1/auth/check", kind="http", headers=_bearer("sk-all"))
    denial = _denied(gate.decide(probe, now=NOW), 429, "rate")
    assert denial.retry_after_s == 30 and "2 a minute" in denial.message
    _denied(gate.decide(_conn(headers=_bearer("sk-all")), now=NOW + 1), 429, "rate")
    assert _principal(gate.decide(_conn(headers=_bearer("sk-all"), client="10.0.0.2"), now=NOW))
    # Other HTTP requests and carrier streams are not counted.
    assert _principal(gate.decide(_conn("/healthz", kind="http"), now=NOW))
    assert _principal(gate.decide(_conn("/telephony/telnyx"), now=NOW))
    assert _principal(gate.decide(_conn(headers=_bearer("sk-all")), now=NOW + 31))


def test_carriers_by_signature() -> None:
    seen: list[bytes] = []

    def verify(conn: HTTPConnection, body: bytes) -> bool:
        seen.append(body)
        return conn.headers.get("x-signature") == "good"

    checks = [
        SignatureCheck(
            carrier="acme",
            path="/telephony/acme/voice",
            methods=frozenset({"POST"}),
            verify=verify,
            max_body_bytes=1024,
        ),
        SignatureCheck(
            carrier="acme", path="/telephony/acme", methods=frozenset({"WEBSOCKET"}), verify=verify
        ),
    ]
    gate = _gate(checks=checks)
    webhook = _conn("/telephony/acme/voice", kind="http", method="POST", headers={"X-Signature": "good"})
    assert gate.signature_check(webhook) is checks[0]
    carrier = _principal(gate.decide(webhook, now=NOW, body=b"From=1"))
    assert carrier.kind is PrincipalKind.CARRIER and carrier.name == "carrier:acme" and seen == [b"From=1"]
    refused = _denied(
        gate.decide(_conn("/telephony/acme/voice", kind="http", method="POST"), now=NOW), 403, "signature"
    )
    assert refused.plain and refused.body() == b"invalid signature"
    stream = _denied(gate.decide(_conn("/telephony/acme"), now=NOW), 403, "signature")
    assert not stream.plain  # a refused handshake gets the JSON error
    assert _principal(gate.decide(_conn("/telephony/acme", headers={"X-Signature": "good"}), now=NOW))
    # A method the check does not cover goes on to the router (405); no check, no signature asked.
    assert gate.signature_check(_conn("/telephony/acme/voice", kind="http")) is None
    unsigned = _principal(gate.decide(_conn("/telephony/other"), now=NOW))
    assert unsigned.kind is PrincipalKind.CARRIER and unsigned.name == "carrier:other"
    # A carrier is not asked for our keys, and what it sends in Authorization is not read.
    assert _principal(gate.decide(_conn("/telephony/vonage", headers=_bearer("a-vonage-jwt")), now=NOW))
    assert _principal(gate.decide(_conn("/telephony"), now=NOW)).name == "carrier:detect"


def test_caps() -> None:
    gate = _gate(caps=SessionCaps(per_ip=2))
    web = _principal(gate.decide(_conn(headers=_bearer("sk-web")), now=NOW))
    holds = [gate.admit(_conn(client=f"10.0.0.{i}"), web) for i in range(2)]
    assert all(isinstance(h, SessionHold) for h in holds)
    denial = gate.admit(_conn(client="10.0.0.9"), web)
    assert isinstance(denial, Denial) and (denial.status, denial.reason) == (503, "key_cap")
    assert denial.retry_after_s and "'web'" in denial.message
    assert gate.would_admit(_conn(), web) is not None
    everything = _principal(gate.decide(_conn(headers=_bearer("sk-all")), now=NOW))
    assert isinstance(gate.admit(_conn(client="10.0.0.0"), everything), SessionHold)
    denial = gate.admit(_conn(client="10.0.0.0"), everything)
    assert isinstance(denial, Denial) and denial.reason == "ip_cap"
    # Carriers' media servers share an address across calls: not capped by it.
    carrier = _principal(gate.decide(_conn("/telephony/telnyx"), now=NOW))
    assert all(isinstance(gate.admit(_conn(client="10.0.0.0"), carrier), SessionHold) for _ in range(5))
    for hold in holds:
        assert isinstance(hold, SessionHold)
        hold.release()
    assert gate.would_admit(_conn(client="10.0.0.5"), web) is None


def test_root_path_is_not_part_of_the_route() -> None:
    conn = HTTPConnection(
        {
            "type": "http",
            "method": "GET",
            "path": "/gw/admin/backends",
            "root_path": "/gw",
            "query_string": b"",
            "headers": [],
            "client": ("1.1.1.1", 1),
        }
    )
    _denied(_gate().decide(conn, now=NOW), 401, "missing_key")
