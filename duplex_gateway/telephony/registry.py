"""The carriers' table: each carrier's module by the name in its path, and telling them apart by their first messages.

A carrier is one module under :mod:`duplex_gateway.telephony.carriers` whose ``SPEC`` is its
:class:`~duplex_gateway.telephony.carrier.CarrierSpec`; adding a carrier is adding its module
here. The configuration takes each carrier's settings section from this table, the webhook
routes and the hang-up their carrier from it: no other module names a carrier.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any, ClassVar

from duplex_gateway.extras import require
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.control import CarrierSettings
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "CARRIERS",
    "DetectingCarrier",
    "carrier_for",
    "carrier_settings",
    "require_extras",
    "signed_streams",
    "spec",
    "specs",
    "subprotocols",
]

#: Carrier modules by path name (``/telephony/<name>``), in the order ``/telephony`` tries them.
CARRIERS: dict[str, str] = {
    "twilio": "duplex_gateway.telephony.carriers.twilio",
    "telnyx": "duplex_gateway.telephony.carriers.telnyx",
    "plivo": "duplex_gateway.telephony.carriers.plivo",
    "exotel": "duplex_gateway.telephony.carriers.exotel",
    "vonage": "duplex_gateway.telephony.carriers.vonage",
    "asterisk": "duplex_gateway.telephony.carriers.asterisk",
}
#: Messages held while the carrier is not known yet (its greeting comes before its start).
_MAX_HELD = 8


def spec(name: str) -> call.CarrierSpec[Any] | None:
    """Carrier ``name`` (None: no such carrier)."""
    module = CARRIERS.get(name)
    if module is None:
        return None
    found: call.CarrierSpec[Any] = importlib.import_module(module).SPEC
    return found


def specs() -> list[call.CarrierSpec[Any]]:
    """Every carrier, in the table's order."""
    return [found for name in CARRIERS if (found := spec(name)) is not None]


def carrier_for(name: str) -> call.Carrier | None:
    """A new translator for one call of carrier ``name`` (None: no such carrier)."""
    found = spec(name)
    return found.wire() if found is not None else None


def carrier_settings() -> dict[str, type[CarrierSettings]]:
    """Each carrier's settings section (``telephony.<name>``), for the carriers that have one."""
    return {found.name: found.settings_model for found in specs() if found.settings_model is not None}


def subprotocols() -> frozenset[str]:
    """The WebSocket subprotocols some carrier's media stream asks for."""
    return frozenset().union(*(found.subprotocols for found in specs()))


def signed_streams(telephony: object) -> frozenset[str]:
    """The carriers whose media streams ``telephony`` has signed: they must come on their own path."""
    return frozenset(
        found.name
        for found in specs()
        if any(rule.on == "stream" for rule in found.signatures(found.settings_of(telephony)))
    )


def require_extras(telephony: object) -> None:
    """:class:`~duplex_gateway.extras.MissingExtra` if a configured carrier feature lacks the telephony extra.

    Checked at start: a hang-up runs when the gateway ends a call, too late to learn its extra is missing.
    """
    for found in specs():
        for need in found.needs(found.settings_of(telephony)):
            require("telephony", need.what, need.modules)


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
        for found in specs():
            if found.recognizes(frame):
                return found.wire()
        return None

    def media(self, audio: bytes) -> Sequence[Frame]:
        return self._known.media(audio)

    def mark(self, name: str) -> Frame | None:
        return self._known.mark(name)

    def clear(self) -> Frame | None:
        return self._known.clear()

    def hangup(self) -> Frame | None:
        return self.detected.hangup() if self.detected is not None else None
