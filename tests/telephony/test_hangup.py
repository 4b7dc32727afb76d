"""The carriers' REST hang-up, against a carrier API served on loopback."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt
import pytest
import uvicorn
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from duplex_gateway.config import TelephonySettings, load_settings
from duplex_gateway.telephony.carriers.vonage import vonage_jwt
from duplex_gateway.telephony.hangup import HangupOutcome, hang_up

ACCOUNT_SID, TWILIO_TOKEN = "AC0123456789", "twilio-token"
TELNYX_KEY = "KEYtelnyx"
PLIVO_ID, PLIVO_TOKEN = "MAPLIVO01", "plivo-token"
VONAGE_APP = "aaaaaaaa-bbbb-cccc-dddd-0123456789ab"


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class FakeCarrierApi:
    """Twilio's, Telnyx's, Plivo's and Vonage's call endpoints; the call id picks the answer."""

    def __init__(self, vonage_public_pem: bytes) -> None:
        self.seen: list[Seen] = []
        self.vonage_public_pem = vonage_public_pem
        self.app = Starlette(
            routes=[
                Route("/2010-04-01/Accounts/{account}/Calls/{call}.json", self.twilio, methods=["POST"]),
                Route("/v2/calls/{call}/actions/hangup", self.telnyx, methods=["POST"]),
                Route("/v1/Account/{account}/Call/{call}/", self.plivo, methods=["DELETE"]),
                Route("/v1/calls/{call}", self.vonage, methods=["PUT"]),
            ]
        )

    async def _record(self, request: Request) -> str:
        self.seen.append(Seen(request.method, request.url.path, dict(request.headers), await request.body()))
        call = request.path_params["call"]
        if call.endswith("slow"):
            await asyncio.sleep(1)
        return str(call)

    async def twilio(self, request: Request) -> Response:
        call = await self._record(request)
        expected = "Basic " + base64.b64encode(f"{ACCOUNT_SID}:{TWILIO_TOKEN}".encode()).decode()
        if request.headers.get("authorization") != expected:
            return JSONResponse({"code": 20003, "message": "Authenticate"}, status_code=401)
        if call == "CAgone":
            return JSONResponse({"code": 20404, "message": "The requested resource was not found"}, 404)
        if call == "CAmissing":
            return JSONResponse({"code": 20001, "message": "something else"}, 404)
        return JSONResponse({"sid": call, "status": "completed"})

    async def telnyx(self, request: Request) -> Response:
        call = await self._record(request)
        if request.headers.get("authorization") != f"Bearer {TELNYX_KEY}":
            return JSONResponse({"errors": [{"code": "10009", "title": "Authentication failed"}]}, 401)
        if call == "v3:gone":
            return JSONResponse({"errors": [{"code": "90018", "title": "Call has already ended"}]}, 422)
        if call == "v3:invalid":
            return JSONResponse({"errors": [{"code": "90015", "title": "Invalid call"}]}, 422)
        return JSONResponse({"data": {"result": "ok"}})

    async def plivo(self, request: Request) -> Response:
        call = await self._record(request)
        expected = "Basic " + base64.b64encode(f"{PLIVO_ID}:{PLIVO_TOKEN}".encode()).decode()
        if request.headers.get("authorization") != expected:
            return JSONResponse({"error": "authentication failed"}, 401)
        if call == "gone":
            return JSONResponse({"error": "not found"}, 404)
        return Response(status_code=204)

    async def vonage(self, request: Request) -> Response:
        call = await self._record(request)
        auth = request.headers.get("authorization", "")
        try:
            claims = jwt.decode(auth.removeprefix("Bearer "), self.vonage_public_pem, algorithms=["RS256"])
        except jwt.PyJWTError:
            return JSONResponse({"title": "Unauthorized"}, 401)
        if claims.get("application_id") != VONAGE_APP or json.loads(await request.body()) != {
            "action": "hangup"
        }:
            return JSONResponse({"title": "Bad Request"}, 400)
        if call == "gone":
            return JSONResponse({"title": "Not Found"}, 404)
        return Response(status_code=204)


@pytest.fixture(scope="module")
def vonage_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, bytes]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path = tmp_path_factory.mktemp("vonage") / "private.key"
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return path, public


@dataclass
class Served:
    api: FakeCarrierApi
    base_url: str


@pytest.fixture
async def carrier_api(vonage_key: tuple[Path, bytes]) -> AsyncIterator[Served]:
    api = FakeCarrierApi(vonage_key[1])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(api.app, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.01)
    assert server.started
    try:
        yield Served(api, f"http://127.0.0.1:{port}")
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)
        sock.close()


def _settings(base_url: str, vonage_key_path: Path | None = None, /, **more: Any) -> TelephonySettings:
    return load_settings(
        None,
        **{
            "telephony.hangup_timeout_s": 1.0,
            "telephony.twilio.account_sid": ACCOUNT_SID,
            "telephony.twilio.auth_token": TWILIO_TOKEN,
            "telephony.twilio.api_base_url": base_url,
            "telephony.telnyx.api_key": TELNYX_KEY,
            "telephony.telnyx.api_base_url": base_url + "/",
            "telephony.plivo.auth_id": PLIVO_ID,
            "telephony.plivo.auth_token": PLIVO_TOKEN,
            "telephony.plivo.api_base_url": base_url,
            "telephony.vonage.application_id": VONAGE_APP,
            "telephony.vonage.private_key_path": str(vonage_key_path) if vonage_key_path else None,
            "telephony.vonage.api_base_url": base_url,
            **more,
        },
    ).telephony


async def test_twilio_completes_the_call(carrier_api: Served) -> None:
    result = await hang_up("twilio", "CAlive", _settings(carrier_api.base_url))
    assert (result.outcome, result.status, result.ok) == (HangupOutcome.HUNG_UP, 200, True)
    (seen,) = carrier_api.api.seen
    assert (seen.method, seen.path) == ("POST", f"/2010-04-01/Accounts/{ACCOUNT_SID}/Calls/CAlive.json")
    assert seen.headers["content-type"] == "application/x-www-form-urlencoded"
    assert seen.body == b"Status=completed"


async def test_twilio_404_20404_means_already_ended(carrier_api: Served) -> None:
    settings = _settings(carrier_api.base_url)
    gone = await hang_up("twilio", "CAgone", settings)
    assert (gone.outcome, gone.status, gone.ok) == (HangupOutcome.ALREADY_ENDED, 404, True)
    other = await hang_up("twilio", "CAmissing", settings)
    assert (other.outcome, other.status, other.ok) == (HangupOutcome.FAILED, 404, False)
    assert other.detail is not None and "20001" in other.detail
    wrong = await hang_up(
        "twilio", "CAlive", _settings(carrier_api.base_url, **{"telephony.twilio.auth_token": "x"})
    )
    assert (wrong.outcome, wrong.status) == (HangupOutcome.FAILED, 401)


async def test_telnyx_hangup_and_90018(carrier_api: Served) -> None:
    settings = _settings(carrier_api.base_url)
    live = await hang_up("telnyx", "v3:live", settings)
    assert (live.outcome, live.status) == (HangupOutcome.HUNG_UP, 200)
    assert carrier_api.api.seen[0].path == "/v2/calls/v3:live/actions/hangup"
    gone = await hang_up("telnyx", "v3:gone", settings)
    assert (gone.outcome, gone.status, gone.ok) == (HangupOutcome.ALREADY_ENDED, 422, True)
    invalid = await hang_up("telnyx", "v3:invalid", settings)
    assert (invalid.outcome, invalid.status) == (HangupOutcome.FAILED, 422)


async def test_plivo_delete_204_and_404(carrier_api: Served) -> None:
    settings = _settings(carrier_api.base_url)
    live = await hang_up("plivo", "live-uuid", settings)
    assert (live.outcome, live.status) == (HangupOutcome.HUNG_UP, 204)
    assert (carrier_api.api.seen[0].method, carrier_api.api.seen[0].path) == (
        "DELETE",
        f"/v1/Account/{PLIVO_ID}/Call/live-uuid/",
    )
    gone = await hang_up("plivo", "gone", settings)
    assert (gone.outcome, gone.status, gone.ok) == (HangupOutcome.ALREADY_ENDED, 404, True)


async def test_vonage_put_hangup_with_a_minted_jwt(
    carrier_api: Served, vonage_key: tuple[Path, bytes]
) -> None:
    settings = _settings(carrier_api.base_url, vonage_key[0])
    live = await hang_up("vonage", "live-uuid", settings)
    assert (live.outcome, live.status) == (HangupOutcome.HUNG_UP, 204)
    seen = carrier_api.api.seen[0]
    assert (seen.method, seen.path, json.loads(seen.body)) == (
        "PUT",
        "/v1/calls/live-uuid",
        {"action": "hangup"},
    )
    gone = await hang_up("vonage", "gone", settings)
    assert (gone.outcome, gone.status) == (HangupOutcome.ALREADY_ENDED, 404)
    # A JWT given as is is sent as is.
    token = vonage_jwt(VONAGE_APP, vonage_key[0].read_bytes())
    given = _settings(carrier_api.base_url, None, **{"telephony.vonage.jwt": token})
    assert (await hang_up("vonage", "live-uuid", given)).outcome is HangupOutcome.HUNG_UP
    assert carrier_api.api.seen[-1].headers["authorization"] == f"Bearer {token}"


async def test_a_slow_carrier_times_out_and_a_dead_one_fails(carrier_api: Served) -> None:
    settings = _settings(carrier_api.base_url, **{"telephony.hangup_timeout_s": 0.3})
    slow = await hang_up("twilio", "CAslow", settings)
    assert (slow.outcome, slow.status) == (HangupOutcome.FAILED, None)
    assert slow.detail == "no answer within 0.3 s"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    dead = await hang_up("plivo", "live-uuid", _settings(f"http://127.0.0.1:{closed_port}"))
    assert (dead.outcome, dead.status, dead.ok) == (HangupOutcome.FAILED, None, False)
    assert dead.detail


async def test_nothing_is_sent_without_credentials_or_an_api(carrier_api: Served) -> None:
    bare = load_settings(None).telephony
    for carrier in ("twilio", "telnyx", "plivo", "vonage"):
        assert (await hang_up(carrier, "id-1", bare)).outcome is HangupOutcome.NOT_CONFIGURED
    settings = _settings(carrier_api.base_url)
    for carrier in ("exotel", "asterisk", "nobody"):
        result = await hang_up(carrier, "id-1", settings)
        assert (result.outcome, result.ok) == (HangupOutcome.UNSUPPORTED, False)
    assert (await hang_up("twilio", "", settings)).outcome is HangupOutcome.FAILED
    missing_key = _settings(carrier_api.base_url, Path("/nonexistent/private.key"))
    failed = await hang_up("vonage", "live-uuid", missing_key)
    assert failed.outcome is HangupOutcome.FAILED and failed.detail and "JWT" in failed.detail
    assert carrier_api.api.seen == []
