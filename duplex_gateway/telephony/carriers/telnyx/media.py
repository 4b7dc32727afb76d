"""Telnyx media streaming, bidirectional in RTP mode (TeXML ``<Stream bidirectionalMode="rtp">``).

JSON text frames in snake_case; ``stream_id`` is top-level and ``sequence_number``,
``chunk`` and ``timestamp`` are strings. ``media.payload`` is a base64 RTP payload
(no RTP header) in the codec of ``start.media_format``: PCMU (the default), PCMA,
L16 or G.722 here; OPUS and AMR-WB are refused. Telnyx does not promise the order of
media frames, so they are put back in order by ``media.chunk`` (``sequence_number``
when a frame has no chunk) before any audio reaches the session. Marks are echoed once
the audio before them has played, and a ``clear`` echoes every queued mark at once
(the playout's clear epoch tells those apart). No id is echoed back on outbound
messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from duplex_gateway.dialects import wire_codec
from duplex_gateway.telephony import carrier as call
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "L16_RATES",
    "REORDER_WINDOW",
    "MediaReorder",
    "TelnyxCarrier",
]

#: Media frames held behind a missing one before the gap is given up (20 ms frames: 100 ms at most).
REORDER_WINDOW = 5
#: Given-up slots remembered, so a frame arriving after its slot was given up is told from a duplicate.
_SKIP_MEMORY = 256
#: A counter this far behind (a second of 20 ms frames) and not a given-up slot has started over.
_RESTART = 50
#: Rates Telnyx streams L16 at (``bidirectionalSamplingRate`` offers 8, 16 and 24 kHz).
L16_RATES = (8_000, 16_000, 24_000)
#: Codecs Telnyx offers that no codec here decodes.
_REFUSED = frozenset({"OPUS", "AMR-WB", "AMR_WB", "AMRWB"})
#: ``media_format.encoding`` spellings by codec (older docs and SDKs write MIME types).
_ALIASES = {
    "PCMU": "PCMU",
    "AUDIO/X-MULAW": "PCMU",
    "PCMA": "PCMA",
    "AUDIO/X-ALAW": "PCMA",
    "L16": "L16",
    "AUDIO/X-L16": "L16",
    "AUDIO/L16": "L16",
    "G722": "G722",
    "G.722": "G722",
}
#: The G.722 bit rate Telnyx sends (mode 1; the 56 and 48 kbit/s modes are not used on calls).
_G722_BIT_RATE = 64_000


class TelnyxCarrier:
    """One Telnyx media stream."""

    name: ClassVar[str] = "telnyx"
    has_marks = True

    def __init__(self) -> None:
        self.stream_id: str | None = None
        self._codec: _Codec | None = None
        self._framing = call.Framing(chunk_ms=40)
        # Caller audio is ordered by media.chunk, which counts the caller's media frames from 1:
        # a message that never reaches the socket leaves no hole in it. sequence_number counts
        # every message (the start is the first), and orders only frames that carry no chunk.
        self.by_chunk = MediaReorder(first=1)
        self.by_sequence = MediaReorder()

    @property
    def framing(self) -> call.Framing:
        return self._framing

    @staticmethod
    def recognizes(frame: Frame) -> bool:
        """A Telnyx start: a top-level ``stream_id`` and ``start.call_control_id``."""
        message = call.peek_json(frame)
        if message is None or "stream_id" not in message:
            return False
        start = message.get("start")
        return isinstance(start, dict) and "call_control_id" in start

    def parse(self, frame: Frame) -> Sequence[call.CallEvent]:
        message = call.json_message(frame, "Telnyx")
        kind = message.get("event")
        seq = _counter(message, "sequence_number")
        if kind == "media":
            return self._media(message, seq)
        # Every message takes a sequence number: one that is not caller audio fills its slot.
        events: list[call.CallEvent] = (
            self._audio(self.by_sequence.push(seq, None)) if seq is not None else []
        )
        if kind == "start":
            events.append(self._start(message))
        elif kind == "mark":
            events.append(call.MarkPlayed(_name(message, "mark", "name")))
        elif kind == "dtmf":
            events.append(call.Dtmf(_name(message, "dtmf", "digit")))
        elif kind == "stop":
            # What is still held waits for frames that will never come: the caller said it, so it counts.
            events.extend(self._audio([*self.by_chunk.flush(), *self.by_sequence.flush()]))
            events.append(call.CallEnded("stop"))
        elif kind == "error":
            events.append(_error(message))
        elif kind != "connected":
            raise call.bad_message(f"unknown Telnyx event {str(kind)[:64]!r}")
        return events

    def _media(self, message: dict[str, Any], seq: int | None) -> list[call.CallEvent]:
        media = message.get("media")
        if not isinstance(media, dict):
            raise call.bad_message("a Telnyx media message has no 'media' object")
        track = media.get("track", "inbound")
        caller = track in ("inbound", "inbound_track")
        payload = (
            call.media_payload(media, "Telnyx") if caller else None
        )  # only the caller's side is the caller
        if payload and self._codec is not None and len(payload) % self._codec.sample_bytes:
            # Refused on arrival: once held for reordering, a bad frame would take good ones down with it.
            raise call.bad_message(f"a Telnyx media payload of {len(payload)} bytes is not whole samples")
        chunk = _counter(media, "chunk")
        if chunk is not None and caller:
            # Ordered by its chunk; its sequence number only fills its slot in the other order.
            released = self.by_sequence.push(seq, None) if seq is not None else []
            return self._audio([*released, *self.by_chunk.push(chunk, payload)])
        if seq is not None:
            # Another track's frame only fills its slot (its chunks may be counted apart from the caller's).
            return self._audio(self.by_sequence.push(seq, payload))
        return self._audio([payload] if payload else [])  # nothing to order it by: as it came

    def _audio(self, payloads: Sequence[bytes]) -> list[call.CallEvent]:
        codec = self._codec
        if codec is None:
            return []  # before the start the stream has no format (and the call no session to hear it)
        # A frame held from before the start was never checked against the format (found by
        # fuzzing: an odd-length L16 payload failed the byte swap and ended the call): not whole
        # samples, it cannot be heard, and is dropped.
        return [
            call.CallAudio(codec.decode(payload))
            for payload in payloads
            if payload and not len(payload) % codec.sample_bytes
        ]

    def _start(self, message: dict[str, Any]) -> call.CallStart:
        start = message.get("start")
        if not isinstance(start, dict):
            raise call.bad_message("a Telnyx start message has no 'start' object")
        self.stream_id = call.text_field(message, "stream_id") or call.text_field(start, "stream_id")
        # A format the gateway cannot take raises UNSUPPORTED_*: the call dialect ends such a call.
        codec = _codec_for(start.get("media_format") or {})
        self._codec = codec
        fmt_out = codec.format
        # Telnyx plays RTP chunks of 20 ms to 30 s: a reply's last piece is padded to 20 ms.
        self._framing = call.Framing(chunk_ms=40, min_bytes=fmt_out.byte_count(20), multiple=codec.multiple)
        parameters = _parameters(start.get("custom_parameters"))
        client_state = call.text_field(start, "client_state")
        if client_state is not None:
            parameters.setdefault("client_state", client_state)
        return call.CallStart(
            carrier=self.name,
            call_id=call.text_field(start, "call_control_id"),
            stream_id=self.stream_id,
            caller=call.text_field(start, "from"),
            callee=call.text_field(start, "to"),
            parameters=parameters,
            input_format=fmt_out,
            output_format=fmt_out,
        )

    def media(self, audio: bytes) -> Sequence[Frame]:
        codec = self._codec
        payload = codec.encode(audio) if codec is not None else audio
        return [call.dump({"event": "media", "media": {"payload": wire_codec.b64encode(payload)}})]

    def mark(self, name: str) -> Frame | None:
        return call.dump({"event": "mark", "mark": {"name": name}})

    def clear(self) -> Frame | None:
        return call.dump({"event": "clear"})

    def hangup(self) -> Frame | None:
        return None  # closing the stream ends a <Connect><Stream>; Call Control hangs up over REST


class MediaReorder:
    """Puts one stream's media frames back in the order of a counter (pure: no clock).

    A frame that arrives ahead of a missing one is held; the missing one releases
    it and everything held after it. A gap that never fills is given up once more
    than ``window`` frames wait behind it: they are released in order and the
    stream goes on, so a lost frame costs at most ``window`` frames of delay, never
    the frames behind it. A frame that arrives after its slot was given up is
    released at once (late audio is still the caller's words); one whose slot was
    already released is a duplicate and is dropped. A counter that falls back by
    more than a second of frames has started over: what is held is released and the
    order starts again from it. ``gaps``, ``late``, ``duplicates`` and ``restarts``
    count each.
    """

    def __init__(self, window: int = REORDER_WINDOW, *, first: int | None = None) -> None:
        self.window = window
        #: The counter value released next (None: the first frame to arrive says).
        self.next: int | None = first
        self._first: int | None = first
        self._held: dict[int, bytes | None] = {}
        self._skipped: dict[int, None] = {}  # insertion-ordered, trimmed to _SKIP_MEMORY
        self.gaps = 0
        self.late = 0
        self.duplicates = 0
        self.restarts = 0

    @property
    def held(self) -> int:
        """Frames waiting for a missing one."""
        return len(self._held)

    def push(self, key: int, audio: bytes | None) -> list[bytes]:
        """Frame ``key`` arrived (``audio`` None: a slot with no caller audio, e.g. a DTMF message);
        the audio now due, in order."""
        if self.next is None or self._first is None:
            self.next = self._first = key
        out: list[bytes] = []
        if key < self.next:
            if key in self._skipped or key < self._first:
                # Its slot was given up (or it predates the first frame seen): late, not lost.
                self._skipped.pop(key, None)
                self.late += 1
                return [audio] if audio else []
            if key > self.next - _RESTART:
                self.duplicates += 1
                return []
            # Far behind and never given up: the counter started over, and this is its first frame.
            out = self.flush()
            self._skipped.clear()
            self.next = self._first = key
            self.restarts += 1
        if key in self._held:
            self.duplicates += 1
            return out
        self._held[key] = audio
        out += self._drain()
        while len(self._held) > self.window:
            self._give_up(min(self._held))
            out += self._drain()
        return out

    def flush(self) -> list[bytes]:
        """Everything held, in order: the missing frames will not come (the stream ended, or its counter restarted)."""
        out: list[bytes] = []
        while self._held:
            self._give_up(min(self._held))
            out += self._drain()
        return out

    def _give_up(self, upto: int) -> None:
        assert self.next is not None
        self.gaps += upto - self.next
        for missing in range(max(self.next, upto - _SKIP_MEMORY), upto):
            self._skipped[missing] = None
        while len(self._skipped) > _SKIP_MEMORY:
            del self._skipped[next(iter(self._skipped))]
        self.next = upto

    def _drain(self) -> list[bytes]:
        out: list[bytes] = []
        assert self.next is not None
        while self.next in self._held:
            audio = self._held.pop(self.next)
            if audio:
                out.append(audio)
            self.next += 1
        return out


# -- codecs ------------------------------------------------------------------------------------


class _Codec(Protocol):
    """A stream's RTP payload to and from the format the session hears and speaks."""

    format: AudioFormat
    #: Reply pieces are whole multiples of this many bytes (of ``format``).
    multiple: int
    #: A payload is whole multiples of this many bytes.
    sample_bytes: int

    def decode(self, payload: bytes) -> bytes: ...
    def encode(self, audio: bytes) -> bytes: ...


class _Passthrough:
    """G.711: the session takes μ-law and A-law as they are."""

    multiple = 1
    sample_bytes = 1

    def __init__(self, fmt: AudioFormat) -> None:
        self.format = fmt

    def decode(self, payload: bytes) -> bytes:
        return payload

    def encode(self, audio: bytes) -> bytes:
        return audio


class _L16:
    """RTP L16 is network byte order (big-endian, RFC 3551 §4.5.11); the session's PCM16 is little-endian."""

    multiple = 2
    sample_bytes = 2

    def __init__(self, rate: int) -> None:
        self.format = AudioFormat(encoding=Encoding.PCM16, rate=rate)

    def decode(self, payload: bytes) -> bytes:
        return _swap16(payload)

    def encode(self, audio: bytes) -> bytes:
        return _swap16(audio)


class _G722:
    """G.722 at 64 kbit/s, 16 kHz audio, through libg722. One encoder and one decoder per
    stream: the codec is adaptive (ADPCM), so each direction keeps its own state."""

    multiple = 4  # the encoder takes samples in pairs (one code byte for two samples)
    sample_bytes = 1

    def __init__(self) -> None:
        # libg722's bindings come with the telephony extra; only a G.722 stream needs them.
        import G722

        self.format = AudioFormat(encoding=Encoding.PCM16, rate=16_000)
        self._decoder = G722.G722(16_000, _G722_BIT_RATE, use_numpy=False)
        self._encoder = G722.G722(16_000, _G722_BIT_RATE, use_numpy=False)

    def decode(self, payload: bytes) -> bytes:
        samples = np.asarray(self._decoder.decode(payload), dtype=np.int16)
        return samples.astype("<i2").tobytes()

    def encode(self, audio: bytes) -> bytes:
        samples = np.frombuffer(audio[: len(audio) - len(audio) % 2], dtype="<i2").astype(np.int16)
        return bytes(self._encoder.encode(samples))


def _codec_for(fmt: Any) -> _Codec:
    if not isinstance(fmt, dict):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "a Telnyx start's media_format is not an object"
        )
    raw = call.text_field(fmt, "encoding") or "PCMU"
    codec = _ALIASES.get(raw.upper())
    if codec is None:
        why = "is not decoded here" if raw.upper() in _REFUSED else "is not one Telnyx streams"
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            f"Telnyx codec {raw[:32]} {why}: stream PCMU, PCMA, L16 or G722 (codec and bidirectionalCodec)",
        )
    channels = fmt.get("channels", 1)
    if channels not in (1, "1"):
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"Telnyx codec {codec} with {channels} channels: mono only"
        )
    if codec == "PCMU":
        # G.711 is 8 kHz by definition, whatever rate the stream reports.
        return _Passthrough(AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000))
    if codec == "PCMA":
        return _Passthrough(AudioFormat(encoding=Encoding.G711_ALAW, rate=8_000))
    if codec == "G722":
        # 16 kHz audio, whatever rate the stream reports (RTP clocks G.722 at 8 kHz).
        try:
            return _G722()
        except ImportError:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
                "Telnyx codec G722 needs the gateway's 'telephony' extra "
                "(pip install 'duplex-gateway[telephony]'): stream PCMU, PCMA or L16, or install it",
            ) from None
    try:
        rate = _counter(fmt, "sample_rate") or 8_000
    except ProtocolError:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            f"Telnyx L16 sample_rate {str(fmt.get('sample_rate'))[:32]!r} is not a number",
        ) from None
    if rate not in L16_RATES:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED_SAMPLE_RATE, f"Telnyx codec L16 at {rate} Hz: 8000, 16000 or 24000 only"
        )
    return _L16(rate)


def _swap16(data: bytes) -> bytes:
    return np.frombuffer(data, dtype=np.uint16).byteswap().tobytes()


# -- message fields ------------------------------------------------------------------------


def _counter(obj: dict[str, Any], key: str) -> int | None:
    """An integer field Telnyx writes as a string ("12"); None when absent."""
    value = obj.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise call.bad_message(f"a Telnyx {key} is not an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise call.bad_message(f"a Telnyx {key} is not an integer: {str(value)[:32]!r}")


def _name(message: dict[str, Any], key: str, field: str) -> str:
    inner = message.get(key)
    value = inner.get(field) if isinstance(inner, dict) else None
    if not isinstance(value, str) or not value:
        raise call.bad_message(f"a Telnyx {key} message has no {key}.{field}")
    return value


def _error(message: dict[str, Any]) -> call.CarrierError:
    error = message.get("error")
    if not isinstance(error, dict):
        raise call.bad_message("a Telnyx error message has no 'error' object")
    code = call.text_field(error, "code") or call.text_field(error, "title") or "unknown"
    title = call.text_field(error, "title")
    detail = call.text_field(error, "detail")
    text = ": ".join(part for part in (title, detail) if part) or "no detail"
    return call.CarrierError(code=code, message=text)


def _parameters(raw: Any) -> dict[str, str]:
    """``custom_parameters``: an object on the socket; a list of {name, value} where Call Control writes one."""
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items() if v is not None}
    if isinstance(raw, list):
        pairs = (item for item in raw if isinstance(item, dict) and isinstance(item.get("name"), str))
        return {item["name"]: str(item.get("value", "")) for item in pairs}
    return {}
