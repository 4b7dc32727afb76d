"""Vonage Voice API WebSocket (the NCCO ``connect`` action with a ``websocket`` endpoint).

Audio is binary frames of raw PCM16 little-endian at the rate of the NCCO's
``content-type`` (``audio/l16;rate=8000|16000|24000``), 20 ms each, both ways. Text
frames are JSON: the first is ``websocket:connected``, carrying the content type and
the NCCO's ``headers`` flattened in, which is the call's start. Vonage has no
marks of its own: a ``notify`` action comes back as ``websocket:notify`` with the
same payload once the audio queued before it has played, which is a mark. A
``clear`` action drops the queued audio (and the pending notifies) and is
acknowledged with ``websocket:cleared``. There is no stop message: the call ends
when the socket closes.

The control plane: the answer webhook (``GET|POST /telephony/vonage/answer``) answers an NCCO
``connect`` to the gateway's WebSocket at 16 kHz, the call's uuid and who called whom in its
``headers``. A call the gateway ends is hung up over REST with a JWT, given as
``telephony.vonage.jwt`` or minted from the application's private key.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.control import (
    NOT_CONFIGURED,
    Answer,
    AnswerHook,
    CarrierSettings,
    HangupOutcome,
    HangupRequest,
    Need,
    Refusal,
    WebhookRequest,
    path_segment,
    without_extra,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["FRAME_MS", "SPEC", "VONAGE_RATES", "VonageCarrier", "VonageSettings", "ncco", "vonage_jwt"]

#: The rates an NCCO's ``content-type`` may name.
VONAGE_RATES = (8_000, 16_000, 24_000)
#: Vonage sends and expects 20 ms audio frames.
FRAME_MS = 20
#: The rate when ``websocket:connected`` names no content type (Vonage's WebSocket default).
_DEFAULT_RATE = 16_000
#: Keys of ``websocket:connected`` that are Vonage's own, not the NCCO's headers.
_OWN_KEYS = frozenset({"event", "content-type"})
#: Header names an NCCO commonly passes the call's ids and numbers in (from the answer webhook).
_CALL_ID_KEYS = ("uuid", "call_uuid", "call_id", "conversation_uuid")
_CALLER_KEYS = ("from", "caller", "From", "caller_id")
_CALLEE_KEYS = ("to", "callee", "To")
#: How long a JWT minted for a hang-up is valid.
_JWT_TTL_S = 900
#: The keys of a DTMF keypad.
_KEYS = frozenset("0123456789*#ABCDabcd")


class VonageCarrier:
    """One Vonage Voice API WebSocket."""

    name: ClassVar[str] = "vonage"
    has_marks = True

    def __init__(self) -> None:
        self.format: AudioFormat | None = None
        #: A ``websocket:connected`` came whose audio the gateway cannot take (reported once, then quiet).
        self._refused = False

    @property
    def framing(self) -> call.Framing:
        # 100 ms pieces, each followed by one notify, sent as five 20 ms frames: whole frames only,
        # so a reply's short tail is padded to a full frame with silence.
        frame = self.format.byte_count(FRAME_MS) if self.format is not None else 2
        return call.Framing(chunk_ms=5 * FRAME_MS, multiple=frame)

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """Vonage's first message: a text frame whose event is ``websocket:connected``."""
        message = call.peek_json(frame)
        return message is not None and message.get("event") == "websocket:connected"

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        if isinstance(frame, bytes):
            if self.format is None:
                if self._refused:
                    return []  # its start was refused: one error said so, not one per 20 ms frame
                raise ProtocolError(ErrorCode.INVALID_EVENT, "Vonage sent audio before websocket:connected")
            return [call.CallAudio(frame)] if frame else []
        message = call.json_message(frame, "Vonage")
        kind = message.get("event")
        if kind == "websocket:connected":
            return [] if self.format is not None else [self._start(message)]
        if kind == "websocket:dtmf":
            return [call.Dtmf(digit) for digit in _digits(message)]
        if kind == "websocket:notify":
            payload = message.get("payload")
            name = call.text_field(payload, "mark") if isinstance(payload, dict) else None
            return [call.MarkPlayed(name)] if name else []  # someone else's notify carries no mark
        if kind == "websocket:cleared":
            return [call.CarrierCleared()]
        # Vonage adds events over time (and other products share this socket's vocabulary): none
        # of them is needed to carry the call, so an unknown one is no reason to fail it.
        return []

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        try:
            rate = _rate(message.get("content-type"))
        except ProtocolError:
            self._refused = True
            raise
        self.format = AudioFormat(encoding=Encoding.PCM16, rate=rate)
        parameters = {str(key): _text(value) for key, value in message.items() if key not in _OWN_KEYS}
        return call.CallStart(
            carrier=self.name,
            call_id=_first(parameters, _CALL_ID_KEYS),
            caller=_first(parameters, _CALLER_KEYS),
            callee=_first(parameters, _CALLEE_KEYS),
            parameters=parameters,
            input_format=self.format,
            output_format=self.format,
        )

    def media(self, audio: bytes) -> Sequence[Frame]:
        if self.format is None or not audio:
            return []
        step = self.format.byte_count(FRAME_MS)
        frames = [audio[offset : offset + step] for offset in range(0, len(audio), step)]
        # Vonage plays whole 20 ms frames; a short last one is padded with silence.
        frames[-1] = frames[-1] + b"\x00" * (step - len(frames[-1]))
        return frames

    def mark(self, name: str) -> Frame | None:
        return call.dump({"action": "notify", "payload": {"mark": name}})

    def clear(self) -> Frame | None:
        return call.dump({"action": "clear"})

    def hangup(self) -> Frame | None:
        return None  # closing the socket ends the connect leg


def _rate(content_type: object) -> int:
    """The rate of ``audio/l16;rate=N``; a ``ProtocolError`` for any other audio."""
    if content_type is None:
        return _DEFAULT_RATE
    if not isinstance(content_type, str):
        raise call.bad_message("Vonage's content-type is not a string")
    kind, *params = (part.strip().lower() for part in content_type.split(";"))
    if kind != "audio/l16":
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"Vonage content-type {content_type[:64]!r} is not audio/l16"
        )
    rate_text = next(
        (value for key, _, value in (p.partition("=") for p in params) if key.strip() == "rate"), None
    )
    if rate_text is None:
        return _DEFAULT_RATE
    rate = int(rate_text) if rate_text.strip().isdigit() else 0
    if rate not in VONAGE_RATES:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Vonage rate {rate_text[:16]!r} is not 8000, 16000 or 24000"
        )
    return rate


def _digits(message: dict[str, Any]) -> list[str]:
    """The keys a ``websocket:dtmf`` reports: ``digit`` at the top, or in a nested ``dtmf`` object."""
    nested = message.get("dtmf")
    digits = call.text_field(message, "digit", "digits") or (
        call.text_field(nested, "digit", "digits") if isinstance(nested, dict) else None
    )
    # Only keys a keypad has: whatever else a mangled event holds is no key press.
    return [digit for digit in (digits or "")[:32] if digit in _KEYS]


def _first(parameters: Mapping[str, str], keys: Sequence[str]) -> str | None:
    return next((parameters[key] for key in keys if parameters.get(key)), None)


def _text(value: object) -> str:
    """A header's value as text (an NCCO header may be any JSON value)."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


# -- the control plane ----------------------------------------------------------------------


class VonageSettings(CarrierSettings):
    """Vonage: hang-up needs a JWT, given as is or minted from the application's private key."""

    application_id: str | None = None
    private_key_path: str | None = None
    jwt: str | None = None
    api_base_url: str = Field("https://api.nexmo.com", pattern=r"^https?://\S+$")


def ncco(url: str, headers: Mapping[str, str]) -> list[dict[str, Any]]:
    """Vonage's NCCO: connect the call to the gateway's WebSocket, 16 kHz linear PCM."""
    endpoint = {
        "type": "websocket",
        "uri": url,
        "content-type": "audio/l16;rate=16000",
        "headers": dict(headers),
    }
    return [{"action": "connect", "endpoint": [endpoint]}]


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
        "exp": issued + _JWT_TTL_S,
        "jti": uuid.uuid4().hex,
    }
    signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return f"{signing_input}.{_b64url(signature)}"


class VonageSpec(call.CarrierSpec[VonageSettings]):
    """Vonage: the Voice API WebSocket, the NCCO answer, the Voice API's hang-up."""

    name = "vonage"
    title = "Vonage"
    wire_class = VonageCarrier
    settings_model = VonageSettings
    answer_hook = AnswerHook("answer", ("GET", "POST"))

    def answer(self, request: WebhookRequest, stream_url: str) -> Answer:
        headers = request.who(("from", "From"), ("to", "To"))
        if (call_uuid := request.get("uuid")) is not None:
            headers["uuid"] = call_uuid  # the call's id, for the REST hang-up
        headers.update(request.passed())
        # Compact JSON, as Starlette's JSONResponse writes it.
        body = json.dumps(
            ncco(stream_url, headers), ensure_ascii=False, allow_nan=False, separators=(",", ":")
        )
        return Answer(body, "application/json")

    def needs(self, settings: VonageSettings) -> Sequence[Need]:
        needs = []
        if settings.application_id and settings.private_key_path and not settings.jwt:
            needs.append(Need("telephony.vonage.private_key_path (Vonage's JWT)", ("cryptography",)))
        return needs

    def hangup_request(self, call_id: str, settings: VonageSettings) -> HangupRequest | Refusal:
        # PUT {base}/v1/calls/{uuid} {"action":"hangup"}, Bearer JWT.
        token = settings.jwt
        if not token:
            if not (settings.application_id and settings.private_key_path):
                return NOT_CONFIGURED
            try:
                # The key is read at each hang-up, so a rotated key file is picked up.
                token = vonage_jwt(settings.application_id, Path(settings.private_key_path).read_bytes())
            except ImportError:
                return HangupOutcome.FAILED, without_extra(("cryptography",))
            except (OSError, ValueError, TypeError) as exc:
                return HangupOutcome.FAILED, f"cannot mint the Vonage JWT: {type(exc).__name__}"
        return HangupRequest(
            "PUT",
            f"{settings.api_base_url.rstrip('/')}/v1/calls/{path_segment(call_id)}",
            {"Accept": "application/json", "Authorization": f"Bearer {token}"},
            json_body={"action": "hangup"},
        )

    def already_ended(self, status: int, codes: frozenset[str]) -> bool:
        return status == 404


SPEC = VonageSpec()
