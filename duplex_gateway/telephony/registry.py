"""The carriers the gateway speaks, by the name in their path, and telling them apart by their first messages."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

from duplex_gateway.errors import ErrorCode, ProtocolError
from duplex_gateway.telephony import carrier as call
from duplex_gateway.transport import Frame

__all__ = ["CARRIERS", "DetectingCarrier", "carrier_class", "carrier_for"]

#: Carrier classes by path name (``/telephony/<name>``), in the order ``/telephony`` tries them.
#: Each has a static ``recognizes(frame) -> bool`` that tells its start (or greeting) apart.
CARRIERS: dict[str, str] = {
    "twilio": "duplex_gateway.telephony.carriers.twilio:TwilioCarrier",
    "telnyx": "duplex_gateway.telephony.carriers.telnyx:TelnyxCarrier",
    "plivo": "duplex_gateway.telephony.carriers.plivo:PlivoCarrier",
    "exotel": "duplex_gateway.telephony.carriers.exotel:ExotelCarrier",
    "vonage": "duplex_gateway.telephony.carriers.vonage:VonageCarrier",
    "asterisk": "duplex_gateway.telephony.carriers.asterisk:AsteriskCarrier",
}
#: Messages held while the carrier is not known yet (its greeting comes before its start).
_MAX_HELD = 8


def carrier_class(name: str) -> Any:
    """The class of carrier ``name`` (None: no such carrier)."""
    spec = CARRIERS.get(name)
    if spec is None:
        return None
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


def carrier_for(name: str) -> call.Carrier | None:
    """A new translator for one call of carrier ``name`` (None: no such carrier)."""
    cls = carrier_class(name)
    return cls() if cls is not None else None


class DetectingCarrier:
    """``/telephony``: the carrier is whichever recognizes the call's first messages.

    Greetings (``connected``) are held until a message one carrier recognizes as its
    start arrives; then every held message goes to that carrier, in order.
    """

    name: ClassVar[str] = "auto"

    def __init__(self, *, signed_only: frozenset[str] = frozenset()) -> None:
        """``signed_only``: carriers whose streams must come on their own, signature-checked path."""
        self.detected: call.Carrier | None = None
        self._signed_only = signed_only
        self._held: list[Frame] = []

    @property
    def framing(self) -> call.Framing:
        return self._known.framing

    @property
    def has_marks(self) -> bool:
        return self._known.has_marks

    @property
    def _known(self) -> call.Carrier:
        if self.detected is None:
            raise RuntimeError("the carrier is not known yet")
        return self.detected

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        if self.detected is not None:
            return self.detected.parse(frame)
        carrier = self._recognize(frame)
        if carrier is None and isinstance(frame, bytes):
            # Audio before any carrier said who it is: nothing can play it (no carrier starts so).
            raise ProtocolError(ErrorCode.INVALID_EVENT, "audio came before the call's start message")
        if carrier is None:
            if len(self._held) >= _MAX_HELD:
                raise ProtocolError(ErrorCode.INVALID_EVENT, "the call's messages match no known carrier")
            self._held.append(frame)
            return []
        if carrier.name in self._signed_only:
            # Its signature covers the upgrade of /telephony/<name>, which this path cannot check.
            raise ProtocolError(
                ErrorCode.UNAUTHORIZED, f"{carrier.name} streams must use /telephony/{carrier.name} (signed)"
            )
        self.detected = carrier
        events: list[call.CallEvent] = []
        for held in [*self._held, frame]:
            events.extend(carrier.parse(held))
        self._held.clear()
        return events

    @staticmethod
    def _recognize(frame: Frame) -> call.Carrier | None:
        for name in CARRIERS:
            cls = carrier_class(name)
            if cls.recognizes(frame):
                return cls()  # type: ignore[no-any-return]
        return None

    def media(self, audio: bytes) -> Sequence[Frame]:
        return self._known.media(audio)

    def mark(self, name: str) -> Frame | None:
        return self._known.mark(name)

    def clear(self) -> Frame | None:
        return self._known.clear()

    def hangup(self) -> Frame | None:
        return self.detected.hangup() if self.detected is not None else None
