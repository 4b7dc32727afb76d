"""Every parser of untrusted input, fed arbitrary and mutated input: only coded errors come out.

The parsers are the gateway's attack surface: the Realtime client event parser, each
carrier's message parser (and the call dialect and carrier detection around them), the
AudioSocket framing, and the credentials a request presents (keys, subprotocols, client
secrets). For each, any input either parses or raises the one documented exception,
:class:`~duplex_gateway.vocabulary.errors.ProtocolError` (``TokenError`` for client secrets), always
with a code from :class:`~duplex_gateway.vocabulary.errors.ErrorCode`; nothing else escapes.

Inputs are arbitrary JSON, text and bytes, and, more to the point, real messages of each
protocol (the wire helpers of the telephony tests) with parts of them replaced, removed
or retyped, fed as a call's sequence of messages so the parsers' state is exercised too.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from starlette.requests import HTTPConnection

from duplex_gateway.auth.credentials import offered_subprotocols, presented
from duplex_gateway.auth.gate import Gate
from duplex_gateway.auth.keys import ApiKey, KeyStore, hash_key
from duplex_gateway.auth.policy import Denial
from duplex_gateway.auth.principal import Principal, Scope
from duplex_gateway.auth.tokens import TokenError, TokenSigner
from duplex_gateway.dialects.realtime import CLIENT_EVENT_TYPES, RealtimeDialect, parse_client_event
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.audiosocket import (
    KIND_AUDIO,
    KIND_DTMF,
    KIND_HANGUP,
    KIND_UUID,
    AudioSocketCarrier,
    TlvReader,
    decode_frame,
    encode_frame,
)
from duplex_gateway.telephony.dialect import CallDialect
from duplex_gateway.telephony.registry import CARRIERS, DetectingCarrier, carrier_for
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Frame
from tests.properties.settings import examples
from tests.telephony.asterisk_wire import AsteriskWire
from tests.telephony.exotel_wire import ExotelWire
from tests.telephony.plivo_wire import PlivoWire
from tests.telephony.telnyx_wire import TelnyxWire
from tests.telephony.twilio_wire import TwilioWire
from tests.telephony.vonage_wire import VonageWire

# -- arbitrary and mutated JSON ------------------------------------------------------------------

_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.sampled_from(["", "0", "-1", "1e400", "A" * 64, "audio/x-mulaw", "PCMU", "L16", "ulaw", "slin16"]),
    # base64 of 1, 3 and 5 bytes: audio that is not whole samples of a 16-bit format
    st.sampled_from(["AA==", "AAEC", "AAECAwQ="]),
)
json_values = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=20,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place inside a JSON value (dict keys and list indices), the root included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*prefix, index))
    return found


def _replace(value: Any, path: tuple[Any, ...], new: Any, delete: bool) -> Any:
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, dict):
        copy = dict(value)
        if delete and not rest:
            copy.pop(head, None)
        else:
            copy[head] = _replace(value[head], rest, new, delete)
        return copy
    copy_list = list(value)
    if delete and not rest:
        del copy_list[head]
    else:
        copy_list[head] = _replace(value[head], rest, new, delete)
    return copy_list


@st.composite
def mutated(draw: st.DrawFn, seed: Any) -> Any:
    """``seed`` with a few of its parts replaced by other JSON, removed, or retyped."""
    value = seed
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(value)
        path = draw(st.sampled_from(paths))
        delete = bool(path) and draw(st.booleans())
        value = _replace(value, path, None if delete else draw(json_values), delete)
    return value


@st.composite
def frames_like(draw: st.DrawFn, seeds: Sequence[Frame]) -> Frame:
    """One message: a real one, a mutated real one, or arbitrary JSON, text or bytes."""
    seed = draw(st.sampled_from(seeds))
    kind = draw(st.sampled_from(["seed", "mutated", "mutated", "mutated", "json", "text", "bytes", "cut"]))
    if kind == "seed":
        return seed
    if kind == "mutated" and isinstance(seed, str):
        try:
            parsed = json.loads(seed)
        except ValueError:  # a plain-text control message: mutate its words
            words = seed.split(" ")
            index = draw(st.integers(0, len(words) - 1))
            words[index] = draw(st.text(max_size=12))
            return " ".join(words)
        return json.dumps(draw(mutated(parsed)))
    if kind == "mutated":
        return draw(st.binary(max_size=len(seed) + 8))
    if kind == "json":
        return json.dumps(draw(json_values))
    if kind == "text":
        return draw(st.text(max_size=80))
    if kind == "bytes":
        return draw(st.binary(max_size=400))
    return seed[: draw(st.integers(0, max(0, len(seed) - 1)))]


def _coded(exc: ProtocolError) -> None:
    assert isinstance(exc.code, ErrorCode), exc.code
    assert isinstance(exc.message, str) and exc.message


# -- the Realtime client event parser ---------------------------------------------------------

#: One valid example of every client event type, to mutate.
REALTIME_SEEDS: list[dict[str, Any]] = [
    {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "instructions": "Be brief.",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                    "transcription": {"model": "whisper-1"},
                },
                "output": {"format": {"type": "audio/pcmu"}, "voice": "alloy"},
            },
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": "auto",
            "extra_body": {"auto_response": True},
            "include": ["turn.latency"],
        },
    },
    {
        "type": "session.update",
        "session": {
            "input_audio_format": "g711_ulaw",
            "sample_rate_hz": 16000,
            "turn_detection": None,
            "modalities": ["text", "audio"],
        },
    },
    {
        "type": "input_audio_buffer.append",
        "audio": base64.b64encode(bytes(960)).decode(),
        "event_id": "e1",
        "format": "pcm16",
        "sample_rate_hz": 16000,
        "is_speech": True,
        "hints": {"rms": 0.1},
    },
    {"type": "input_audio_buffer.commit", "response_create": False, "final": True, "is_speech": False},
    {"type": "input.commit"},
    {"type": "input_audio_buffer.clear"},
    {"type": "input.cancel"},
    {"type": "input.text.append", "text": "hello"},
    {"type": "push_text", "text": "hi"},
    {"type": "turn.signal", "event": "barge_in", "payload": {}},
    {"type": "signal_turn", "event": "session.update", "payload": {"session": {"voice": "ash"}}},
    {
        "type": "response.create",
        "response": {
            "instructions": "Shout.",
            "output_modalities": ["text"],
            "conversation": "none",
            "metadata": {"k": "v"},
            "input": [{"type": "item_reference", "id": "item_1"}],
            "max_output_tokens": "inf",
            "tool_choice": {"type": "function", "name": "f"},
            "audio": {"output": {"voice": "ash"}},
        },
    },
    {"type": "response.cancel", "response_id": "resp_1"},
    {
        "type": "conversation.item.create",
        "previous_item_id": "root",
        "item": {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    },
    {
        "type": "conversation.item.create",
        "item": {"type": "function_call_output", "call_id": "c", "output": "{}"},
    },
    {"type": "conversation.item.truncate", "item_id": "item_1", "content_index": 0, "audio_end_ms": 1500},
    {"type": "conversation.item.delete", "item_id": "item_1"},
    {"type": "conversation.item.retrieve", "item_id": "item_1"},
    {"type": "output_audio_buffer.clear"},
    {"type": "barge_in"},
    {"type": "playback.ack", "response_id": "resp_1", "item_id": "item_1", "played_ms": 300},
    {"type": "session.heartbeat"},
    {"type": "session.close", "reason": "bye"},
    {"type": "session.event_ack", "server_event_seq": 7},
    {
        "type": "session.resume",
        "session_id": "sess_1",
        "resume_token": "tok",
        "last_received_server_event_seq": 3,
    },
]


def test_the_realtime_seeds_cover_every_client_event_type() -> None:
    covered = {seed["type"] for seed in REALTIME_SEEDS}
    aliases = {"input_text.append", "audio.playback_ack", "close", "close_session"}
    assert CLIENT_EVENT_TYPES - aliases <= covered, CLIENT_EVENT_TYPES - aliases - covered
    for seed in REALTIME_SEEDS:
        assert isinstance(parse_client_event(json.dumps(seed), max_bytes=1 << 20), Command), seed


def _realtime_parses(frame: Frame, dialect: RealtimeDialect) -> None:
    try:
        commands = dialect.parse(frame)
    except ProtocolError as exc:
        _coded(exc)
        if isinstance(frame, bytes):
            assert exc.code is ErrorCode.BINARY_NOT_SUPPORTED
    else:
        assert isinstance(frame, str)
        assert len(commands) == 1 and isinstance(commands[0], Command)


@examples(300)
@given(st.lists(frames_like([json.dumps(s) for s in REALTIME_SEEDS]), min_size=1, max_size=6), st.booleans())
def test_realtime_client_events(frames: list[Frame], beta: bool) -> None:
    dialect = RealtimeDialect(session_id="sess_p", beta=beta, duplex=not beta, max_message_bytes=4096)
    for frame in frames:
        _realtime_parses(frame, dialect)


@examples(200)
@given(
    st.dictionaries(st.text(max_size=10), json_values, max_size=6),
    st.sampled_from(sorted(CLIENT_EVENT_TYPES)),
)
def test_realtime_arbitrary_objects_of_every_type(fields: dict[str, Any], kind: str) -> None:
    _realtime_parses(
        json.dumps({**fields, "type": kind}),
        RealtimeDialect(
            session_id="s",
            beta=False,
            duplex=True,
            max_message_bytes=4096,
        ),
    )


@examples(200)
@given(st.one_of(st.binary(max_size=300), st.text(max_size=300)))
def test_realtime_arbitrary_bytes_and_text(frame: Frame) -> None:
    try:
        parse_client_event(frame, max_bytes=256)
    except ProtocolError as exc:
        _coded(exc)


# -- the carriers ------------------------------------------------------------------------------


def _carrier_seeds(name: str) -> list[Frame]:
    """A call's real messages, for carrier ``name``: greeting, audio, marks, keys, errors, stop."""
    wires: list[Any] = {
        "twilio": [TwilioWire({"profile": "sales"})],
        "telnyx": [TelnyxWire(), TelnyxWire("L16", 16_000), TelnyxWire("PCMA")],
        "plivo": [PlivoWire(), PlivoWire("l16", 16_000)],
        "exotel": [ExotelWire(), ExotelWire(16_000)],
        "vonage": [VonageWire(), VonageWire(8_000)],
        "asterisk": [AsteriskWire(), AsteriskWire(json_format=True, codec="slin16", optimal_frame_size=640)],
    }[name]
    seeds: list[Frame] = []
    for wire in wires:
        seeds += wire.greeting()
        seeds.append(wire.media(bytes(range(160)) * 2, 0))
        seeds.append(wire.media(b"\x7f" * 160, 1))
        seeds += [wire.mark_played("m1"), wire.dtmf("5")]
        for extra in ("cleared", "stop", "error", "xoff", "xon"):
            method: Callable[[], Frame | None] | None = getattr(wire, extra, None)
            frame = method() if method is not None else None
            if frame is not None:
                seeds.append(frame)
    return seeds


CARRIER_SEEDS = {name: _carrier_seeds(name) for name in CARRIERS}
ALL_CARRIER_SEEDS = [frame for seeds in CARRIER_SEEDS.values() for frame in seeds]


def _carrier_parses(carrier: call.Carrier | DetectingCarrier, frame: Frame) -> None:
    try:
        events = carrier.parse(frame)
    except ProtocolError as exc:
        _coded(exc)
    else:
        assert all(isinstance(e, call.CallEvent) for e in events), events  # type: ignore[arg-type]


def _dialect_parses(dialect: CallDialect, frame: Frame) -> None:
    try:
        commands = dialect.parse(frame)
    except ProtocolError as exc:
        _coded(exc)
    else:
        assert all(isinstance(c, Command) for c in commands), commands
    dialect.pump(1.0)  # what it may send back after any message


@pytest.mark.parametrize("name", sorted(CARRIERS))
def test_the_carrier_seeds_are_real_messages(name: str) -> None:
    carrier = carrier_for(name)
    assert carrier is not None
    events = [event for frame in CARRIER_SEEDS[name][:3] for event in carrier.parse(frame)]
    assert any(isinstance(event, call.CallStart) for event in events), events


@pytest.mark.parametrize("name", sorted(CARRIERS))
@examples(150)
@given(data=st.data())
def test_each_carrier_and_its_call_dialect(name: str, data: st.DataObject) -> None:
    frames = data.draw(st.lists(frames_like(CARRIER_SEEDS[name]), min_size=1, max_size=10))
    carrier = carrier_for(name)
    assert carrier is not None
    dialect = CallDialect(carrier_for(name), wall_clock=lambda: 1_764_540_000.0)  # type: ignore[arg-type]
    for frame in frames:
        _carrier_parses(carrier, frame)
        _dialect_parses(dialect, frame)


@examples(200)
@given(st.lists(frames_like(ALL_CARRIER_SEEDS), min_size=1, max_size=12), st.booleans())
def test_carrier_detection(frames: list[Frame], signed_twilio: bool) -> None:
    detecting = DetectingCarrier(signed_only=frozenset({"twilio"}) if signed_twilio else frozenset())
    for frame in frames:
        _carrier_parses(detecting, frame)


# -- AudioSocket ------------------------------------------------------------------------------

AUDIOSOCKET_SEEDS = [
    encode_frame(KIND_UUID, bytes(range(16))),
    encode_frame(KIND_AUDIO, bytes(320)),
    encode_frame(0x12, bytes(640)),  # 16 kHz signed linear
    encode_frame(KIND_DTMF, b"7"),
    encode_frame(KIND_HANGUP),
    encode_frame(0xFF, b"\x01"),
]


@examples(300)
@given(
    st.lists(st.one_of(st.sampled_from(AUDIOSOCKET_SEEDS), st.binary(max_size=80)), max_size=10), st.data()
)
def test_audiosocket_stream(pieces: list[bytes], data: st.DataObject) -> None:
    """Bytes as TCP delivers them (cut anywhere) -> whole frames -> call events."""
    stream = b"".join(pieces)
    reader, carrier = TlvReader(), AudioSocketCarrier()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        for frame in reader.feed(stream[start:end]):
            kind, payload = decode_frame(frame)
            assert encode_frame(kind, payload) == frame
            _carrier_parses(carrier, frame)
    assert 0 <= reader.pending <= len(stream)


@examples(300)
@given(st.binary(max_size=200))
def test_audiosocket_frames(frame: bytes) -> None:
    try:
        kind, payload = decode_frame(frame)
    except ProtocolError as exc:
        _coded(exc)
    else:
        assert encode_frame(kind, payload) == frame
    _carrier_parses(AudioSocketCarrier(), frame)


# -- credentials --------------------------------------------------------------------------------

SIGNER = TokenSigner(b"property-test-token-secret-0123456789")
TOKEN, _ = SIGNER.mint(
    key_name="web", scopes=[Scope.REALTIME], now=1_000.0, ttl_s=600, session={"instructions": "x"}
)
KEYS = KeyStore(
    [
        ApiKey(
            name="web",
            digest=bytes.fromhex(hash_key("sk-web").partition(":")[2]),
            scopes=frozenset({Scope.REALTIME}),
        )
    ]
)
_header_text = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=60)
_secrets = st.one_of(
    _header_text,
    st.sampled_from(["sk-web", "b64.c2std2Vi", TOKEN, TOKEN[:-1], "ek_", "ek_.", "b64.", "b64.!!", "Bearer"]),
)


@examples(300)
@given(
    st.dictionaries(
        st.sampled_from(["authorization", "x-api-key", "sec-websocket-protocol", "origin", "host"]),
        st.one_of(
            _header_text,
            _secrets.map(lambda s: f"Bearer {s}"),
            _secrets.map(lambda s: f"realtime, openai-insecure-api-key.{s}"),
        ),
        max_size=4,
    ),
    st.dictionaries(st.sampled_from(["api_key", "call_id"]), _secrets, max_size=2),
)
def test_credentials_from_any_headers(headers: dict[str, str], query: dict[str, str]) -> None:
    for credential in presented(headers, query):
        assert isinstance(credential.secret, str) and credential.secret
        assert credential.source in ("bearer", "x-api-key", "subprotocol", "query")
    assert all(isinstance(p, str) for p in offered_subprotocols(headers))


@examples(300)
@given(st.one_of(_secrets, st.text(max_size=200)), st.floats(0, 2_000))
def test_client_secrets_verify_or_refuse(token: str, now: float) -> None:
    try:
        claims = SIGNER.verify(token, now=now)
    except TokenError:
        return
    assert token.startswith("ek_") and claims.key_name == "web"


def test_an_altered_client_secret_is_never_taken_for_another() -> None:
    """Every one-character change of a genuine secret, at every position: all refused.

    Found here: base64 decoding took "/" for "_" and ignored the spare bits of the
    signature's last character, so altered secrets passed; the signature must now be
    exactly the text the gateway wrote.
    """
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_+/=.!"
    for index, original in enumerate(TOKEN):
        for char in alphabet.replace(original, ""):
            with pytest.raises(TokenError):
                SIGNER.verify(TOKEN[:index] + char + TOKEN[index + 1 :], now=1_001.0)
    assert SIGNER.verify(TOKEN, now=1_001.0).key_name == "web"


def _connection(headers: dict[str, str], query: str, path: str) -> HTTPConnection:
    return HTTPConnection(
        {
            "type": "websocket",
            "path": path,
            "root_path": "",
            "query_string": query.encode("latin-1"),
            "headers": [(k.encode(), v.encode("latin-1")) for k, v in headers.items()],
            "client": ("203.0.113.9", 40000),
            "server": ("127.0.0.1", 8000),
            "scheme": "ws",
        }
    )


@examples(300)
@given(
    st.dictionaries(
        st.sampled_from(["authorization", "x-api-key", "sec-websocket-protocol", "origin"]),
        st.one_of(
            _header_text,
            _secrets.map(lambda s: f"Bearer {s}"),
            _secrets.map(lambda s: f"realtime, openai-insecure-api-key.{s}"),
        ),
        max_size=3,
    ),
    st.sampled_from(["", "api_key=sk-wrong", "api_key=%ff%fe", "duplex=1&api_key=", "call_id=x"]),
    st.sampled_from(["/v1/realtime", "/v1/duplex", "/telephony/twilio", "/admin/backends", "/metrics"]),
)
def test_the_gate_decides_any_handshake(headers: dict[str, str], query: str, path: str) -> None:
    """Whatever a handshake carries, the gate answers with a principal or a coded refusal, and a
    principal for a keyed endpoint only for the configured key (or a secret it minted)."""
    gate = Gate(keys=KEYS, signer=SIGNER, engine="echo")
    decision = gate.decide(_connection(headers, query, path), now=1_001.0)
    assert isinstance(decision, Principal | Denial)
    if isinstance(decision, Denial):
        assert isinstance(decision.code, ErrorCode) and decision.status in (401, 403, 429)
    elif not path.startswith("/telephony"):
        assert decision.name == "web", decision
        presented_secrets = {
            c.secret
            for c in presented(
                dict(headers),
                dict(p.split("=", 1) for p in query.split("&") if "=" in p),
            )
        }
        assert presented_secrets & {"sk-web", TOKEN}, presented_secrets
