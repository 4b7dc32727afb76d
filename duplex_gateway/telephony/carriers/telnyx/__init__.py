"""Telnyx: media streaming in RTP mode (:mod:`.media`, the pure wire) and its control plane.

The TeXML webhook (``POST /telephony/telnyx/texml``) answers ``<Connect><Stream
bidirectionalMode="rtp">``; with ``telephony.telnyx.public_key`` set, ``telnyx-signature-ed25519``
is checked on it (a base64 Ed25519 signature of ``<telnyx-timestamp>|<raw body>``, the timestamp
within a tolerance of the local clock). With ``telephony.telnyx.api_key`` set, a call the gateway
ends is hung up over REST.
"""

from __future__ import annotations

import base64
import binascii
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import TYPE_CHECKING

from pydantic import Field

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.carriers.telnyx.media import (
    L16_RATES,
    REORDER_WINDOW,
    MediaReorder,
    TelnyxCarrier,
)
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

if TYPE_CHECKING:
    # cryptography comes with the telephony extra; only Telnyx's Ed25519 signatures use it.
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

__all__ = [
    "L16_RATES",
    "REORDER_WINDOW",
    "SPEC",
    "MediaReorder",
    "TelnyxCarrier",
    "TelnyxSettings",
    "telnyx_public_key",
    "texml",
    "validate_telnyx",
]


class TelnyxSettings(CarrierSettings):
    """Telnyx: the API key hangs calls up; the public key (base64 Ed25519) checks webhook signatures."""

    api_key: str | None = None
    #: Base64 of the 32-byte key, as the portal shows it, or PEM.
    public_key: str | None = Field(
        None,
        pattern=r"^\s*([A-Za-z0-9+/]{43}="
        r"|-----BEGIN PUBLIC KEY-----[A-Za-z0-9+/=\s]+-----END PUBLIC KEY-----)\s*$",
    )
    #: How far a signed webhook's ``telnyx-timestamp`` may be from the gateway's clock.
    signature_tolerance_s: float = Field(300.0, gt=0)
    api_base_url: str = Field("https://api.telnyx.com", pattern=r"^https?://\S+$")


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
    return XML_DECLARATION + ET.tostring(root, encoding="unicode")


def telnyx_public_key(key: str) -> Ed25519PublicKey:
    """The Ed25519 public key the Telnyx portal shows (base64 of 32 bytes, or PEM).

    ``ValueError`` if ``key`` is not one; ``ImportError`` without the telephony extra.
    """
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    text = key.strip()
    if text.startswith("-----BEGIN"):
        loaded = load_pem_public_key(text.encode())
        if not isinstance(loaded, Ed25519PublicKey):
            raise ValueError("the Telnyx public key is not an Ed25519 key")
        return loaded
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error:
        raise ValueError("the Telnyx public key is not base64") from None
    if len(raw) != 32:
        raise ValueError(f"the Telnyx public key must be 32 bytes, not {len(raw)}")
    return Ed25519PublicKey.from_public_bytes(raw)


def validate_telnyx(
    public_key: Ed25519PublicKey | str,
    payload: bytes,
    signature: str | None,
    timestamp: str | None,
    *,
    tolerance_s: float = 300.0,
    now: float | None = None,
) -> bool:
    """Whether ``signature`` signs ``timestamp|payload``, ``timestamp`` within ``tolerance_s`` of now."""
    if not signature or not timestamp:
        return False
    try:
        stamp = int(timestamp.strip())
        raw_signature = base64.b64decode(signature.strip(), validate=True)
        key = telnyx_public_key(public_key) if isinstance(public_key, str) else public_key
    except ValueError:  # binascii.Error is a ValueError
        return False
    from cryptography.exceptions import InvalidSignature

    clock = time.time() if now is None else now
    if abs(clock - stamp) > tolerance_s:
        return False
    try:
        key.verify(raw_signature, timestamp.strip().encode() + b"|" + payload)
    except InvalidSignature:
        return False
    return True


class TelnyxSpec(call.CarrierSpec[TelnyxSettings]):
    """Telnyx: media streaming in RTP mode, the TeXML webhook, Ed25519 signatures, Call Control."""

    name = "telnyx"
    title = "Telnyx"
    wire_class = TelnyxCarrier
    settings_model = TelnyxSettings
    answer_hook = AnswerHook("texml", ("POST",))

    def answer(self, request: WebhookRequest, stream_url: str) -> Answer:
        return Answer(texml(stream_url), "text/xml")

    def signatures(self, settings: TelnyxSettings) -> Sequence[SignatureRule]:
        if not settings.public_key:
            return ()
        try:
            key = telnyx_public_key(settings.public_key)
        except ValueError as exc:
            raise ValueError(f"telephony.telnyx.public_key: {exc}") from None
        tolerance_s = settings.signature_tolerance_s

        def webhook(request: SignedRequest) -> bool:
            signature = request.header("telnyx-signature-ed25519")
            timestamp = request.header("telnyx-timestamp")
            return validate_telnyx(key, request.body, signature, timestamp, tolerance_s=tolerance_s)

        refusal = "telnyx-signature-ed25519 does not verify, or the timestamp is stale"
        return (SignatureRule("answer", webhook, refusal),)

    def needs(self, settings: TelnyxSettings) -> Sequence[Need]:
        needs = []
        if settings.public_key:
            needs.append(Need("telephony.telnyx.public_key (Telnyx signatures)", ("cryptography",)))
        return needs

    def hangup_request(self, call_id: str, settings: TelnyxSettings) -> HangupRequest | Refusal:
        # POST {base}/v2/calls/{call_control_id}/actions/hangup, Bearer.
        if not settings.api_key:
            return NOT_CONFIGURED
        return HangupRequest(
            "POST",
            f"{settings.api_base_url.rstrip('/')}/v2/calls/{path_segment(call_id)}/actions/hangup",
            {"Accept": "application/json", "Authorization": f"Bearer {settings.api_key}"},
            json_body={},
        )

    def already_ended(self, status: int, codes: frozenset[str]) -> bool:
        return status == 422 and "90018" in codes


SPEC = TelnyxSpec()
