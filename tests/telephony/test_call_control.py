"""Ending a call from the gateway's side: the API hang-up, the stream closed, the carrier's REST hang-up."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator

import httpx2
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from duplex_gateway.telephony.carriers.twilio import twilio_signature
from tests.e2e.helpers import Gateway, GatewayFactory, ws_connect
from tests.telephony.phone import Phone
from tests.telephony.twilio_wire import ACCOUNT_SID, CALL_SID, TwilioWire

pytestmark = pytest.mark.e2e

TOKEN = "twilio-test-token"


class TwilioApi:
    """Twilio's Calls endpoint on loopback: records each hang-up; one call id is already over."""

    def __init__(self) -> None:
        self.hangups: list[tuple[str, bytes]] = []
        self.app = Starlette(
            routes=[Route("/2010-04-01/Accounts/{account}/Calls/{call}.json", self.calls, methods=["POST"])]
        )

    async def calls(self, request: Request) -> Response:
        call = request.path_params["call"]
        self.hangups.append((call, await request.body()))
        if call == "CA_already_over":
            return JSONResponse({"code": 20404, "message": "not found"}, 404)
        return JSONResponse({"sid": call, "status": "completed"})


@pytest.fixture(scope="module")
def twilio_api() -> Iterator[tuple[TwilioApi, str]]:
    """The fake API on its own thread and loop: the gateway process calls it over loopback."""
    api = TwilioApi()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(api.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    try:
        yield api, f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(5)
        sock.close()


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory, twilio_api: tuple[TwilioApi, str]) -> Gateway:
    _, base_url = twilio_api
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "echo", "echo": {"pace": 1.0}},
            "auth": {"api_keys": ["sk-ops"]},
            "telephony": {
                "twilio": {"account_sid": ACCOUNT_SID, "auth_token": TOKEN, "api_base_url": base_url},
            },
        },
        name="call-control",
    )


def _signed(gateway: Gateway) -> dict[str, str]:
    # Twilio signs the upgrade over the wss URL its TwiML named (no parameters).
    url = f"wss://127.0.0.1:{gateway.port}/telephony/twilio"
    return {"X-Twilio-Signature": twilio_signature(TOKEN, url)}


async def _hang_up(gateway: Gateway, call_id: str, key: str = "sk-ops") -> httpx2.Response:
    async with httpx2.AsyncClient() as client:
        return await client.post(
            f"http://127.0.0.1:{gateway.port}/v1/realtime/calls/{call_id}/hangup",
            headers={"Authorization": f"Bearer {key}"},
        )


async def test_the_api_ends_a_call_and_the_carrier_hangs_it_up(
    gateway: Gateway, twilio_api: tuple[TwilioApi, str]
) -> None:
    api, _ = twilio_api
    async with (
        ws_connect(gateway, "/telephony/twilio", additional_headers=_signed(gateway)) as ws,
        Phone(ws, TwilioWire()),
    ):
        await gateway.wait_sessions(1)
        assert (await _hang_up(gateway, CALL_SID, key="wrong")).status_code == 401
        assert (await _hang_up(gateway, "CA_not_live")).status_code == 404
        assert (await _hang_up(gateway, CALL_SID)).status_code == 200
        # The stream is closed by the gateway (a <Connect><Stream> call ends with it) ...
        async with asyncio.timeout(5):
            await ws.wait_closed()
        assert ws.close_code == 1000
    await gateway.wait_sessions(0)
    # ... and the carrier is asked to end the call, in case TwiML follows the stream.
    async with asyncio.timeout(5):
        while not api.hangups:
            await asyncio.sleep(0.02)
    assert api.hangups == [(CALL_SID, b"Status=completed")]


async def test_a_caller_who_hangs_up_is_not_hung_up_on(
    gateway: Gateway, twilio_api: tuple[TwilioApi, str]
) -> None:
    api, _ = twilio_api
    before = len(api.hangups)
    async with (
        ws_connect(gateway, "/telephony/twilio", additional_headers=_signed(gateway)) as ws,
        Phone(ws, TwilioWire()) as phone,
    ):
        await gateway.wait_sessions(1)
        await phone.hang_up()  # Twilio's "stop"
        await gateway.wait_sessions(0)
    await asyncio.sleep(0.3)
    assert len(api.hangups) == before


async def test_an_unsigned_stream_opens_no_session(gateway: Gateway) -> None:
    with pytest.raises(Exception) as info:
        async with ws_connect(gateway, "/telephony/twilio"):
            pass
    assert "403" in str(info.value)
    assert gateway.readyz()["engine_sessions"] == 0


async def test_a_twilio_stream_on_the_recognizing_path_is_refused_when_signatures_are_on(
    gateway: Gateway,
) -> None:
    # /telephony cannot check Twilio's signature before reading the stream: signed Twilio must use its own path.
    async with ws_connect(gateway, "/telephony") as ws:
        for frame in TwilioWire().greeting():
            await ws.send(frame)
        async with asyncio.timeout(5):
            await ws.wait_closed()
        assert ws.close_code == 1008
    assert gateway.readyz()["engine_sessions"] == 0
