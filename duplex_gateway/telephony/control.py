"""A carrier's control plane as plain values: the webhook it calls, the answer, the signed request, the hang-up.

These are what a :class:`~duplex_gateway.telephony.carrier.CarrierSpec` takes and returns, so that
every carrier's answer, signature check and REST hang-up is a pure function a test calls without
a server. The HTTP around them (reading a webhook's body, running a check before a handler,
sending a hang-up) is the adapters' job: :mod:`~duplex_gateway.telephony.webhooks` and
:mod:`~duplex_gateway.telephony.hangup`. This module imports no I/O and no configuration, so the
carriers' modules can be loaded while the configuration itself is being built.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, ConfigDict

__all__ = [
    "NOT_CONFIGURED",
    "XML_DECLARATION",
    "Answer",
    "AnswerHook",
    "CarrierSettings",
    "HangupOutcome",
    "HangupRequest",
    "Need",
    "Refusal",
    "SignatureRule",
    "SignedRequest",
    "WebhookRequest",
    "path_segment",
    "without_extra",
]

#: The first line of an XML answer.
XML_DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>'

#: Query parameters of a webhook URL passed on with the stream: how many, and how long.
_MAX_PASSED = 10
_MAX_VALUE_CHARS = 256
#: Passed on: names that start with a small letter. The carriers' own fields are capitalized
#: (``From``, ``CallSid``, ...) or listed here (the lowercase fields of a GET answer webhook, and
#: ``bodySHA256``, which belongs to a signed URL).
_PASSED_NAME = re.compile(r"^[a-z][A-Za-z0-9_-]{0,63}$")
_NOT_PASSED = frozenset(
    {"bodySHA256", "from", "to", "uuid", "conversation_uuid", "region_url", "endpoint_type", "from_user"}
)


class CarrierSettings(BaseModel):
    """The base of a carrier's settings section (``telephony.<carrier>``): unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(slots=True)
class WebhookRequest:
    """What a webhook brought: the raw body, its fields (form or JSON), and the URL's query."""

    body: bytes
    fields: list[tuple[str, str]] = field(default_factory=list)
    query: list[tuple[str, str]] = field(default_factory=list)
    json_body: bool = False

    def get(self, *names: str) -> str | None:
        """The first non-empty value of any of ``names``, from the body, then the query."""
        for source in (self.fields, self.query):
            for name in names:
                for key, value in source:
                    if key == name and value:
                        return value
        return None

    def passed(self) -> dict[str, str]:
        """The URL's query parameters that go along with the stream (``?profile=sales``)."""
        out: dict[str, str] = {}
        for name, value in self.query:
            if name in _NOT_PASSED or not _PASSED_NAME.match(name) or name in out:
                continue
            if len(out) >= _MAX_PASSED:
                break
            out[name] = value[:_MAX_VALUE_CHARS]
        return out

    def who(self, caller: Sequence[str], callee: Sequence[str]) -> dict[str, str]:
        """``{"from": ..., "to": ...}`` from the first of the fields named ``caller`` and ``callee``."""
        out: dict[str, str] = {}
        if (value := self.get(*caller)) is not None:
            out["from"] = value
        if (value := self.get(*callee)) is not None:
            out["to"] = value
        return out


@dataclass(frozen=True, slots=True)
class AnswerHook:
    """Where a carrier's answer webhook is served: ``/telephony/<carrier>/<path>``, for ``methods``."""

    path: str
    methods: tuple[str, ...] = ("POST",)


@dataclass(frozen=True, slots=True)
class Answer:
    """A webhook's answer: the document that connects the call's audio to the gateway."""

    body: str
    media_type: str


@dataclass(frozen=True, slots=True)
class SignedRequest:
    """A request as a signature check sees it.

    ``urls``: the full URLs the carrier may have signed (query included; the public URL, or the
    request's Host under both schemes). ``headers`` are looked up by lower-case name. ``fields``:
    the form (or JSON) body's fields; ``json_body``: the body was JSON.
    """

    method: str
    urls: Sequence[str]
    headers: Mapping[str, str]
    body: bytes = b""
    fields: Sequence[tuple[str, str]] = ()
    json_body: bool = False

    def header(self, name: str) -> str | None:
        """Header ``name`` (lower case), or None."""
        return self.headers.get(name)


@dataclass(frozen=True, slots=True)
class SignatureRule:
    """One signature a carrier puts on its requests, checked by the auth layer before any handler.

    ``on``: ``"answer"`` (the carrier's answer webhook) or ``"stream"`` (the media stream's
    WebSocket upgrade). ``verify`` says whether a request is signed; ``refusal`` is what the log
    says when it is not.
    """

    on: Literal["answer", "stream"]
    verify: Callable[[SignedRequest], bool]
    refusal: str


@dataclass(frozen=True, slots=True)
class Need:
    """A configured feature that needs modules of the telephony extra: ``what`` names it to the operator."""

    what: str
    modules: tuple[str, ...]


class HangupOutcome(enum.StrEnum):
    """What asking a carrier to end a call came to."""

    HUNG_UP = "hung_up"
    #: The carrier says the call had already ended (the caller hung up first): not an error.
    ALREADY_ENDED = "already_ended"
    #: No credentials for this carrier: nothing was sent.
    NOT_CONFIGURED = "not_configured"
    #: The carrier has no REST hang-up: closing the media socket ends the call.
    UNSUPPORTED = "unsupported"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class HangupRequest:
    """The REST call that ends a call, as the hang-up adapter sends it."""

    method: str
    url: str
    headers: Mapping[str, str]
    auth: tuple[str, str] | None = None
    data: Mapping[str, str] | None = None
    json_body: Any = None


#: Why no hang-up request is made: the outcome, and a detail (never a credential).
Refusal = tuple[HangupOutcome, str | None]


def without_extra(missing: Sequence[str]) -> str:
    """A hang-up's detail when the telephony extra's ``missing`` modules are not installed."""
    return f"needs the 'telephony' extra (no module {', '.join(missing)}): pip install 'duplex-gateway[telephony]'"


#: No credentials for this carrier's hang-up: nothing is sent.
NOT_CONFIGURED: Refusal = (HangupOutcome.NOT_CONFIGURED, None)


def path_segment(value: str) -> str:
    """``value`` quoted as one segment of a REST URL's path."""
    return quote(value, safe=":")
