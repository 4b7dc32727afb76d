"""Ending a call from the gateway's side: the carriers' REST hang-up.

When the caller hangs up, the carrier ends the stream and there is nothing to do. When the
gateway ends a call (the session closed, the engine failed, a shutdown), closing the media
socket does not always end it: a Twilio call with TwiML after ``<Connect><Stream>`` goes on,
and so may Telnyx, Plivo and Vonage calls. With the carrier's credentials configured,
:func:`hang_up` asks the carrier's REST API to end the call:

=========  ===================================================================  ==================
carrier    request                                                              already ended
=========  ===================================================================  ==================
twilio     ``POST {base}/2010-04-01/Accounts/{AccountSid}/Calls/{CallSid}.json``  404, code 20404
           ``Status=completed``, HTTP Basic (account SID, auth token)
telnyx     ``POST {base}/v2/calls/{call_control_id}/actions/hangup``, Bearer      422, code 90018
plivo      ``DELETE {base}/v1/Account/{auth_id}/Call/{call_uuid}/``, Basic → 204  404
vonage     ``PUT {base}/v1/calls/{uuid}`` ``{"action":"hangup"}``, Bearer JWT      404
=========  ===================================================================  ==================

Exotel and Asterisk have no such API here: closing the socket (or Asterisk's in-band
``HANGUP``) ends their calls. :func:`hang_up` never raises; the :class:`HangupResult`
says what happened.
"""

from __future__ import annotations

import base64
import enum
import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from duplex_gateway.config import GatewaySettings, TelephonySettings
from duplex_gateway.extras import missing_modules, require

if TYPE_CHECKING:
    # httpx2 and cryptography come with the telephony extra; only a configured hang-up uses them.
    import httpx2

__all__ = ["HangupOutcome", "HangupResult", "hang_up", "require_extras", "vonage_jwt"]

#: How long a JWT minted for a Vonage hang-up is valid.
_VONAGE_JWT_TTL_S = 900
#: Characters of an error answer kept in a result's detail.
_DETAIL_CHARS = 300


class HangupOutcome(enum.StrEnum):
    HUNG_UP = "hung_up"
    #: The carrier says the call had already ended (the caller hung up first): not an error.
    ALREADY_ENDED = "already_ended"
    #: No credentials for this carrier: nothing was sent.
    NOT_CONFIGURED = "not_configured"
    #: The carrier has no REST hang-up: closing the media socket ends the call.
    UNSUPPORTED = "unsupported"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class HangupResult:
    carrier: str
    call_id: str
    outcome: HangupOutcome
    #: The carrier's HTTP status (None: no answer).
    status: int | None = None
    #: Why it failed, or the carrier's error answer (truncated); never a credential.
    detail: str | None = None

    @property
    def ok(self) -> bool:
        """The call is over: hung up now, or it had already ended."""
        return self.outcome in (HangupOutcome.HUNG_UP, HangupOutcome.ALREADY_ENDED)


@dataclass(frozen=True, slots=True)
class _Call:
    method: str
    url: str
    headers: Mapping[str, str]
    auth: tuple[str, str] | None = None
    data: Mapping[str, str] | None = None
    json_body: Any = None


def _segment(value: str) -> str:
    return quote(value, safe=":")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def vonage_jwt(application_id: str, private_key_pem: bytes, *, now: float | None = None) -> str:
    """A Vonage application JWT (RS256: ``application_id``, ``iat``, ``exp``, ``jti``)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import padding, rsa

    key = serialization.load_pem_private_key(private_key_pem, password=None)
    if not isinstance(key, rsa.RSAPrivateKey):
        raise TypeError("the Vonage private key is not an RSA key")
    issued = int(time.time() if now is None else now)
    header = {"alg": "RS256", "typ": "JWT"}
    claims = {
        "application_id": application_id,
        "iat": issued,
        "exp": issued + _VONAGE_JWT_TTL_S,
        "jti": uuid.uuid4().hex,
    }
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


def require_extras(settings: TelephonySettings) -> None:
    """:class:`~duplex_gateway.extras.MissingExtra` if a configured hang-up cannot run for want of the telephony extra.

    Checked at start: a hang-up runs when the gateway ends a call, too late to learn its extra is missing.
    """
    tw, tx, pl, vo = settings.twilio, settings.telnyx, settings.plivo, settings.vonage
    configured = {
        "twilio": bool(tw.account_sid and tw.auth_token),
        "telnyx": bool(tx.api_key),
        "plivo": bool(pl.auth_id and pl.auth_token),
        "vonage": bool(vo.jwt or (vo.application_id and vo.private_key_path)),
    }
    for carrier, on in configured.items():
        if on:
            require("telephony", f"telephony.{carrier}'s REST hang-up", ("httpx2",))
    if vo.application_id and vo.private_key_path and not vo.jwt:
        require("telephony", "telephony.vonage.private_key_path (Vonage's JWT)", ("cryptography",))


def _without_extra(missing: tuple[str, ...]) -> str:
    return f"needs the 'telephony' extra (no module {', '.join(missing)}): pip install 'duplex-gateway[telephony]'"


_Refusal = tuple[HangupOutcome, str | None]
_NOT_CONFIGURED: _Refusal = (HangupOutcome.NOT_CONFIGURED, None)


def _request(carrier: str, call_id: str, settings: TelephonySettings) -> _Call | _Refusal:
    """The REST call that hangs ``call_id`` up, or why none is made."""
    call = _segment(call_id)
    if carrier == "twilio":
        tw = settings.twilio
        if not (tw.account_sid and tw.auth_token):
            return _NOT_CONFIGURED
        return _Call(
            "POST",
            f"{tw.api_base_url.rstrip('/')}/2010-04-01/Accounts/{_segment(tw.account_sid)}/Calls/{call}.json",
            {"Accept": "application/json"},
            auth=(tw.account_sid, tw.auth_token),
            data={"Status": "completed"},
        )
    if carrier == "telnyx":
        tx = settings.telnyx
        if not tx.api_key:
            return _NOT_CONFIGURED
        return _Call(
            "POST",
            f"{tx.api_base_url.rstrip('/')}/v2/calls/{call}/actions/hangup",
            {"Accept": "application/json", "Authorization": f"Bearer {tx.api_key}"},
            json_body={},
        )
    if carrier == "plivo":
        pl = settings.plivo
        if not (pl.auth_id and pl.auth_token):
            return _NOT_CONFIGURED
        return _Call(
            "DELETE",
            f"{pl.api_base_url.rstrip('/')}/v1/Account/{_segment(pl.auth_id)}/Call/{call}/",
            {"Accept": "application/json"},
            auth=(pl.auth_id, pl.auth_token),
        )
    if carrier == "vonage":
        vo = settings.vonage
        token = vo.jwt
        if not token:
            if not (vo.application_id and vo.private_key_path):
                return _NOT_CONFIGURED
            if missing := missing_modules("telephony", ("cryptography",)):
                return HangupOutcome.FAILED, _without_extra(missing)
            try:
                token = vonage_jwt(vo.application_id, Path(vo.private_key_path).read_bytes())
            except (OSError, ValueError, TypeError) as exc:
                return HangupOutcome.FAILED, f"cannot mint the Vonage JWT: {type(exc).__name__}"
        return _Call(
            "PUT",
            f"{vo.api_base_url.rstrip('/')}/v1/calls/{call}",
            {"Accept": "application/json", "Authorization": f"Bearer {token}"},
            json_body={"action": "hangup"},
        )
    return HangupOutcome.UNSUPPORTED, None


def _codes(body: Any) -> set[str]:
    """Error codes in a carrier's JSON answer: Twilio ``code``, Telnyx ``errors[].code``."""
    codes: set[str] = set()
    if isinstance(body, dict):
        if "code" in body:
            codes.add(str(body["code"]))
        errors = body.get("errors")
        if isinstance(errors, list):
            codes.update(str(e["code"]) for e in errors if isinstance(e, dict) and "code" in e)
    return codes


def _outcome(carrier: str, status: int, body: Any) -> HangupOutcome:
    if 200 <= status < 300:
        return HangupOutcome.HUNG_UP
    codes = _codes(body)
    if carrier == "twilio" and status == 404 and "20404" in codes:
        return HangupOutcome.ALREADY_ENDED
    if carrier == "telnyx" and status == 422 and "90018" in codes:
        return HangupOutcome.ALREADY_ENDED
    if carrier in ("plivo", "vonage") and status == 404:
        return HangupOutcome.ALREADY_ENDED
    return HangupOutcome.FAILED


async def hang_up(
    carrier_name: str,
    call_id: str,
    settings: TelephonySettings | GatewaySettings,
    *,
    client: httpx2.AsyncClient | None = None,
) -> HangupResult:
    """End the call ``call_id`` through carrier ``carrier_name``'s REST API.

    ``call_id`` is the carrier's id of the call: Twilio's CallSid, Telnyx's call_control_id,
    Plivo's call UUID, Vonage's call uuid. Waits at most ``telephony.hangup_timeout_s``.
    """
    telephony = settings.telephony if isinstance(settings, GatewaySettings) else settings

    def result(outcome: HangupOutcome, status: int | None = None, detail: str | None = None) -> HangupResult:
        return HangupResult(
            carrier=carrier_name, call_id=call_id, outcome=outcome, status=status, detail=detail
        )

    if not call_id:
        return result(HangupOutcome.FAILED, detail="no call id")
    spec = _request(carrier_name, call_id, telephony)
    if isinstance(spec, tuple):
        return result(spec[0], detail=spec[1])
    if client is None and (missing := missing_modules("telephony", ("httpx2",))):
        return result(HangupOutcome.FAILED, detail=_without_extra(missing))
    import httpx2

    timeout = telephony.hangup_timeout_s
    owned = client is None
    http = client if client is not None else httpx2.AsyncClient(timeout=httpx2.Timeout(timeout))
    try:
        response = await http.request(
            spec.method,
            spec.url,
            headers=dict(spec.headers),
            auth=spec.auth,
            data=dict(spec.data) if spec.data is not None else None,
            json=spec.json_body,
            timeout=httpx2.Timeout(timeout),
        )
        content = await response.aread()
    except httpx2.TimeoutException:
        return result(HangupOutcome.FAILED, detail=f"no answer within {timeout:g} s")
    except httpx2.HTTPError as exc:
        return result(HangupOutcome.FAILED, detail=f"{type(exc).__name__}: {exc}"[:_DETAIL_CHARS])
    finally:
        if owned:
            await http.aclose()
    try:
        body = json.loads(content) if content else None
    except ValueError:
        body = None
    outcome = _outcome(carrier_name, response.status_code, body)
    detail = None
    if outcome is not HangupOutcome.HUNG_UP and content:
        detail = content.decode("utf-8", errors="replace")[:_DETAIL_CHARS]
    return result(outcome, response.status_code, detail)
