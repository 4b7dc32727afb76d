"""Ending a call from the gateway's side: the adapter that sends a carrier's REST hang-up.

When the caller hangs up, the carrier ends the stream and there is nothing to do. When the
gateway ends a call (the session closed, the engine failed, a shutdown), closing the media
socket does not always end it: a call with more of its answer after the stream goes on. With
the carrier's credentials configured, :func:`hang_up` asks the carrier's REST API to end the
call. What to send, and which error answers mean "already ended", is the carrier's
(:meth:`~duplex_gateway.telephony.carrier.CarrierSpec.hangup_request`, pure); sending it is
this module's. A carrier without such an API ends its calls when the socket closes (or
in-band). :func:`hang_up` never raises; the :class:`HangupResult` says what happened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from duplex_gateway.config import GatewaySettings, TelephonySettings
from duplex_gateway.telephony.control import HangupOutcome
from duplex_gateway.telephony.registry import spec

if TYPE_CHECKING:
    # Imported only by a configured hang-up.
    import httpx2

__all__ = ["HangupOutcome", "HangupResult", "hang_up"]

#: Characters of an error answer kept in a result's detail.
_DETAIL_CHARS = 300


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


def _codes(body: Any) -> frozenset[str]:
    """Error codes in a carrier's JSON answer: its ``code``, or each of ``errors[].code``."""
    codes: set[str] = set()
    if isinstance(body, dict):
        if "code" in body:
            codes.add(str(body["code"]))
        errors = body.get("errors")
        if isinstance(errors, list):
            codes.update(str(e["code"]) for e in errors if isinstance(e, dict) and "code" in e)
    return frozenset(codes)


async def hang_up(
    carrier_name: str,
    call_id: str,
    settings: TelephonySettings | GatewaySettings,
    *,
    client: httpx2.AsyncClient | None = None,
) -> HangupResult:
    """End the call ``call_id`` through carrier ``carrier_name``'s REST API.

    ``call_id`` is the carrier's id of the call (its ``CallStart.call_id``). Waits at most
    ``telephony.hangup_timeout_s``.
    """
    telephony = settings.telephony if isinstance(settings, GatewaySettings) else settings

    def result(outcome: HangupOutcome, status: int | None = None, detail: str | None = None) -> HangupResult:
        return HangupResult(
            carrier=carrier_name, call_id=call_id, outcome=outcome, status=status, detail=detail
        )

    if not call_id:
        return result(HangupOutcome.FAILED, detail="no call id")
    carrier = spec(carrier_name)
    if carrier is None:
        return result(HangupOutcome.UNSUPPORTED)
    request = carrier.hangup_request(call_id, carrier.settings_of(telephony))
    if isinstance(request, tuple):
        return result(request[0], detail=request[1])
    import httpx2

    timeout = telephony.hangup_timeout_s
    owned = client is None
    http = client if client is not None else httpx2.AsyncClient(timeout=httpx2.Timeout(timeout))
    try:
        response = await http.request(
            request.method,
            request.url,
            headers=dict(request.headers),
            auth=request.auth,
            data=dict(request.data) if request.data is not None else None,
            json=request.json_body,
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
    status = response.status_code
    if 200 <= status < 300:
        outcome = HangupOutcome.HUNG_UP
    elif carrier.already_ended(status, _codes(body)):
        outcome = HangupOutcome.ALREADY_ENDED
    else:
        outcome = HangupOutcome.FAILED
    detail = None
    if outcome is not HangupOutcome.HUNG_UP and content:
        detail = content.decode("utf-8", errors="replace")[:_DETAIL_CHARS]
    return result(outcome, response.status_code, detail)
