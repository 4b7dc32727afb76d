#!/usr/bin/env python3
"""Coverage-guided fuzzing of the gateway's parsers with atheris (libFuzzer for Python).

    .venv/bin/python scripts/fuzz.py TARGET --minutes N     # one parser
    .venv/bin/python scripts/fuzz.py all --minutes N        # each target for N minutes, in turn
    .venv/bin/python scripts/fuzz.py --list

Targets: the Realtime client event parser (``realtime``), each carrier's message parser
wrapped in the call dialect (``twilio`` ... ``asterisk``), carrier detection on
``/telephony`` (``detect``), the AudioSocket TCP framing (``audiosocket``), and the
credentials of a request as the auth layer reads them (``auth``: headers, subprotocols,
query, client secrets, the gate's decision).

A target passes an input when the parser returns, or raises the one exception it
documents (``ProtocolError``, with a code from ``ErrorCode``; ``TokenError`` for a
client secret). Anything else is a finding: libFuzzer stops, and the input that caused
it is written to ``out/fuzz/<target>/crash-*``. The corpus grows in
``out/fuzz/<target>/corpus`` (seeded with real messages of each protocol) and is reused
by the next run.

Needs the ``fuzz`` extra (``pip install -e '.[fuzz]'``). Where atheris cannot be
installed, ``HYPOTHESIS_PROFILE=long pytest tests/properties`` is the same check with
generated, not coverage-guided, inputs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "out" / "fuzz"

_B64 = base64.b64encode(bytes(range(160))).decode()
#: Real messages of each protocol: the starting corpus. Frames are joined with FRAME_SEP;
#: each starts with "T" (a text frame) or "B" (a binary one).
SEEDS: dict[str, list[list[str | bytes]]] = {
    "realtime": [
        [
            json.dumps(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "output_modalities": ["audio"],
                        "instructions": "Be brief.",
                        "audio": {
                            "input": {
                                "format": {"type": "audio/pcm", "rate": 24000},
                                "turn_detection": {"type": "server_vad", "silence_duration_ms": 500},
                            },
                            "output": {"format": {"type": "audio/pcmu"}, "voice": "alloy"},
                        },
                        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                        "tool_choice": {"type": "function", "name": "f"},
                        "include": ["turn.latency"],
                        "extra_body": {"auto_response": True},
                    },
                }
            )
        ],
        [
            json.dumps(
                {
                    "type": "input_audio_buffer.append",
                    "audio": _B64,
                    "format": "pcm16",
                    "sample_rate_hz": 16000,
                }
            )
        ],
        [json.dumps({"type": "input_audio_buffer.commit", "response_create": True, "final": False})],
        [
            json.dumps(
                {
                    "type": "response.create",
                    "response": {
                        "conversation": "none",
                        "output_modalities": ["text"],
                        "metadata": {"k": "v"},
                        "max_output_tokens": "inf",
                        "input": [
                            {"type": "item_reference", "id": "item_1"},
                            {
                                "type": "message",
                                "role": "user",
                                "content": [{"type": "input_text", "text": "hi"}],
                            },
                        ],
                    },
                }
            )
        ],
        [
            json.dumps(
                {
                    "type": "conversation.item.create",
                    "previous_item_id": "root",
                    "item": {"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c1"},
                }
            )
        ],
        [
            json.dumps(
                {
                    "type": "conversation.item.truncate",
                    "item_id": "i",
                    "content_index": 0,
                    "audio_end_ms": 1500,
                }
            )
        ],
        [json.dumps({"type": "playback.ack", "response_id": "r", "played_ms": 300})],
        [
            json.dumps(
                {"type": "turn.signal", "event": "session.update", "payload": {"session": {"voice": "ash"}}}
            )
        ],
        [
            json.dumps(
                {
                    "type": "session.resume",
                    "session_id": "s",
                    "resume_token": "t",
                    "last_received_server_event_seq": 3,
                }
            )
        ],
        [json.dumps({"type": "session.event_ack", "server_event_seq": 7}), b"\x00\x01"],
    ],
    "twilio": [
        [
            json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}),
            json.dumps(
                {
                    "event": "start",
                    "sequenceNumber": "1",
                    "start": {
                        "accountSid": "AC1",
                        "streamSid": "MZ1",
                        "callSid": "CA1",
                        "tracks": ["inbound"],
                        "customParameters": {"profile": "sales"},
                        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
                    },
                    "streamSid": "MZ1",
                }
            ),
            json.dumps(
                {
                    "event": "media",
                    "media": {"track": "inbound", "chunk": "1", "payload": _B64},
                    "streamSid": "MZ1",
                }
            ),
            json.dumps({"event": "mark", "streamSid": "MZ1", "mark": {"name": "m1"}}),
            json.dumps(
                {"event": "dtmf", "streamSid": "MZ1", "dtmf": {"track": "inbound_track", "digit": "5"}}
            ),
            json.dumps({"event": "stop", "stop": {"callSid": "CA1"}, "streamSid": "MZ1"}),
        ]
    ],
    "telnyx": [
        [
            json.dumps({"event": "connected", "version": "1.0.0"}),
            json.dumps(
                {
                    "event": "start",
                    "sequence_number": "1",
                    "stream_id": "S1",
                    "start": {
                        "call_control_id": "v3:1",
                        "from": "+13122010094",
                        "to": "+13122123456",
                        "client_state": "aGk=",
                        "custom_parameters": {"profile": "p"},
                        "media_format": {"encoding": "L16", "sample_rate": 16000, "channels": 1},
                    },
                }
            ),
            json.dumps(
                {
                    "event": "media",
                    "sequence_number": "3",
                    "stream_id": "S1",
                    "media": {"track": "inbound", "chunk": "2", "timestamp": "20", "payload": _B64},
                }
            ),
            json.dumps(
                {
                    "event": "media",
                    "sequence_number": "2",
                    "stream_id": "S1",
                    "media": {"track": "inbound", "chunk": "1", "timestamp": "0", "payload": _B64},
                }
            ),
            json.dumps({"event": "mark", "stream_id": "S1", "mark": {"name": "m1"}}),
            json.dumps({"event": "dtmf", "stream_id": "S1", "dtmf": {"digit": "5"}}),
            json.dumps(
                {
                    "event": "error",
                    "stream_id": "S1",
                    "error": {"title": "t", "code": "100005", "detail": "d"},
                }
            ),
            json.dumps({"event": "stop", "stream_id": "S1", "stop": {"call_control_id": "v3:1"}}),
        ]
    ],
    "plivo": [
        [
            json.dumps(
                {
                    "event": "start",
                    "sequenceNumber": 1,
                    "start": {
                        "callId": "c1",
                        "streamId": "s1",
                        "accountId": "MA1",
                        "tracks": ["inbound"],
                        "mediaFormat": {"encoding": "audio/x-l16", "sampleRate": 16000},
                    },
                    "extra_headers": "from=14155550100;to=14155550199;profile=p",
                }
            ),
            json.dumps(
                {
                    "event": "media",
                    "streamId": "s1",
                    "media": {"track": "inbound", "chunk": 1, "payload": _B64},
                }
            ),
            json.dumps({"event": "playedStream", "streamId": "s1", "name": "m1"}),
            json.dumps({"event": "dtmf", "streamId": "s1", "dtmf": {"digit": "5"}}),
            json.dumps({"event": "clearedAudio", "streamId": "s1"}),
        ]
    ],
    "exotel": [
        [
            json.dumps({"event": "connected"}),
            json.dumps(
                {
                    "event": "start",
                    "stream_sid": "MZ1",
                    "start": {
                        "stream_sid": "MZ1",
                        "call_sid": "CA1",
                        "from": "+919876543210",
                        "to": "+918012345678",
                        "custom_parameters": {"profile": "p"},
                        "media_format": {"encoding": "base64", "sample_rate": "16000", "bit_rate": "256kbps"},
                    },
                }
            ),
            json.dumps({"event": "media", "stream_sid": "MZ1", "media": {"chunk": "1", "payload": _B64}}),
            json.dumps({"event": "mark", "stream_sid": "MZ1", "mark": {"name": "m1"}}),
            json.dumps({"event": "dtmf", "stream_sid": "MZ1", "dtmf": {"digit": "5", "duration": "100"}}),
            json.dumps({"event": "stop", "stream_sid": "MZ1", "stop": {"reason": "callended"}}),
        ]
    ],
    "vonage": [
        [
            json.dumps(
                {
                    "event": "websocket:connected",
                    "content-type": "audio/l16;rate=16000",
                    "uuid": "u1",
                    "from": "447700900000",
                    "to": "447700900001",
                }
            ),
            bytes(640),
            json.dumps({"event": "websocket:notify", "payload": {"mark": "m1"}}),
            json.dumps({"event": "websocket:dtmf", "digit": "5", "duration": 260}),
            json.dumps({"event": "websocket:cleared"}),
        ]
    ],
    "asterisk": [
        [
            (
                "MEDIA_START connection_id:c1 channel:WebSocket/c1/0x1 channel_id:1.1 format:ulaw "
                "optimal_frame_size:160 ptime:20"
            ),
            bytes(320),
            "MEDIA_MARK_PROCESSED m1",
            "DTMF_END digit:5 channel_id:1.1",
            "MEDIA_XOFF",
            "MEDIA_XON",
        ],
        [
            json.dumps(
                {
                    "event": "MEDIA_START",
                    "connection_id": "c1",
                    "channel_id": "1.1",
                    "format": "slin16",
                    "optimal_frame_size": 640,
                    "ptime": 20,
                    "channel_variables": {"CALLER": "100"},
                }
            ),
            bytes(640),
            json.dumps({"event": "MEDIA_MARK_PROCESSED", "correlation_id": "m1"}),
            json.dumps({"event": "DTMF_END", "digit": "5"}),
        ],
    ],
    "audiosocket": [
        [
            b"\x01\x00\x10"
            + bytes(range(16))
            + b"\x10\x01\x40"
            + bytes(320)
            + b"\x12\x02\x80"
            + bytes(640)
            + b"\x03\x00\x017"
            + b"\xff\x00\x01\x01"
            + b"\x00\x00\x00"
        ]
    ],
    "auth": [
        ["authorization", "Bearer sk-web"],
        ["sec-websocket-protocol", "realtime, openai-insecure-api-key.b64.c2std2Vi"],
        ["x-api-key", "sk-web", "origin", "https://app.example.com"],
        ["query", "api_key=sk-web&duplex=1"],
    ],
}
SEEDS["detect"] = [
    frames for name in ("twilio", "telnyx", "plivo", "exotel", "vonage", "asterisk") for frames in SEEDS[name]
]
TARGETS = tuple(SEEDS)
FRAME_SEP = b"\n\x00\xff\n"


def _encode(frames: list[str | bytes]) -> bytes:
    return FRAME_SEP.join(b"T" + f.encode() if isinstance(f, str) else b"B" + f for f in frames)


def _frames(data: bytes) -> list[str | bytes]:
    """An input as a connection's sequence of frames (text frames are valid UTF-8 or dropped)."""
    frames: list[str | bytes] = []
    for piece in data.split(FRAME_SEP)[:32]:
        if piece[:1] == b"B":
            frames.append(piece[1:])
        else:
            try:
                frames.append(piece[1:].decode("utf-8"))
            except UnicodeDecodeError:
                frames.append(piece[1:].decode("latin-1"))
    return frames


# -- the targets (imported under atheris' instrumentation) ------------------------------------


def _build(target: str) -> Callable[[bytes], None]:
    from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError

    def coded(exc: ProtocolError) -> None:
        if not isinstance(exc.code, ErrorCode) or not exc.message:
            raise AssertionError(f"an uncoded ProtocolError: {exc.code!r} {exc.message!r}")

    if target == "realtime":
        from duplex_gateway.dialects.realtime import RealtimeDialect

        def realtime(data: bytes) -> None:
            dialect = RealtimeDialect(
                session_id="s", beta=bool(data[:1] == b"b"), duplex=True, max_message_bytes=65536
            )
            for frame in _frames(data):
                try:
                    dialect.parse(frame)
                except ProtocolError as exc:
                    coded(exc)

        return realtime

    if target == "audiosocket":
        from duplex_gateway.telephony.audiosocket import AudioSocketCarrier, TlvReader, decode_frame

        def audiosocket(data: bytes) -> None:
            reader, carrier = TlvReader(), AudioSocketCarrier()
            step = max(1, data[0] if data else 1)
            for offset in range(0, len(data), step):
                for frame in reader.feed(data[offset : offset + step]):
                    try:
                        decode_frame(frame)
                        carrier.parse(frame)
                    except ProtocolError as exc:
                        coded(exc)

        return audiosocket

    if target == "auth":
        import hashlib

        from starlette.requests import HTTPConnection

        from duplex_gateway.auth.gate import Gate
        from duplex_gateway.auth.keys import ApiKey, KeyStore
        from duplex_gateway.auth.principal import Scope
        from duplex_gateway.auth.tokens import TokenError, TokenSigner

        signer = TokenSigner(b"fuzz-token-secret-0123456789abcdef")
        token, _ = signer.mint(key_name="web", scopes=[Scope.REALTIME], now=1000.0, ttl_s=600)
        keys = KeyStore(
            [
                ApiKey(
                    name="web", digest=hashlib.sha256(b"sk-web").digest(), scopes=frozenset({Scope.REALTIME})
                )
            ]
        )
        gate = Gate(keys=keys, signer=signer, engine="echo")

        def auth(data: bytes) -> None:
            parts = [p.decode("latin-1") for p in data.split(FRAME_SEP)]
            headers: list[tuple[bytes, bytes]] = []
            query = ""
            for name, value in zip(parts[::2], parts[1::2], strict=False):
                value = value.replace("TOKEN", token)
                if name == "query":
                    query = value
                else:
                    headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
            for path in ("/v1/realtime", "/telephony/twilio", "/v1/realtime/client_secrets"):
                conn = HTTPConnection(
                    {
                        "type": "websocket",
                        "path": path,
                        "root_path": "",
                        "headers": headers,
                        "query_string": query.encode("latin-1"),
                        "client": ("203.0.113.9", 1),
                        "scheme": "ws",
                    }
                )
                gate.decide(conn, now=1001.0)
            for part in parts:
                with contextlib.suppress(TokenError):
                    signer.verify(part.replace("TOKEN", token), now=1001.0)

        return auth

    from duplex_gateway.telephony.dialect import CallDialect
    from duplex_gateway.telephony.registry import DetectingCarrier, carrier_for

    def carrier_target(data: bytes) -> None:
        translator = DetectingCarrier() if target == "detect" else carrier_for(target)
        dialect = CallDialect(translator, wall_clock=lambda: 1_764_540_000.0)  # type: ignore[arg-type]
        for index, frame in enumerate(_frames(data)):
            try:
                dialect.parse(frame)
            except ProtocolError as exc:
                coded(exc)
            dialect.pump(float(index))

    return carrier_target


def _run_one(target: str, seconds: int, corpus: Path, artifacts: Path) -> None:
    """In this process: fuzz ``target`` for ``seconds`` (libFuzzer prints its own statistics)."""
    import logging

    import atheris

    logging.disable(logging.CRITICAL)  # the carriers log what they refuse: millions of lines, no finding
    with atheris.instrument_imports(include=["duplex_gateway"]):
        fuzz = _build(target)
    atheris.Setup(
        [
            sys.argv[0],
            str(corpus),
            f"-max_total_time={seconds}",
            "-print_final_stats=1",
            f"-artifact_prefix={artifacts}/",
            "-max_len=4096",
            "-timeout=10",
            "-rss_limit_mb=2048",
        ],
        fuzz,
    )
    atheris.Fuzz()


def _seed(target: str, corpus: Path) -> None:
    corpus.mkdir(parents=True, exist_ok=True)
    for index, frames in enumerate(SEEDS[target]):
        data = (
            FRAME_SEP.join(p.encode() for p in frames)
            if target == "auth"
            else (frames[0] if target == "audiosocket" else _encode(frames))
        )
        assert isinstance(data, bytes)
        (corpus / f"seed-{index}").write_bytes(data)


def _stat(output: str, name: str) -> int | None:
    match = re.search(rf"stat::{name}:\s+(\d+)", output)
    return int(match.group(1)) if match else None


def _fuzz(target: str, minutes: float) -> dict[str, object]:
    """Fuzz one target in a child process; what it found, with libFuzzer's counts."""
    base = OUT / target
    corpus, artifacts = base / "corpus", base
    _seed(target, corpus)
    before = {p.name for p in artifacts.glob("crash-*")}
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            target,
            "--seconds",
            str(max(1, int(minutes * 60))),
            "--corpus",
            str(corpus),
            "--artifacts",
            str(artifacts),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=False,
    )
    output = proc.stdout + proc.stderr
    crashes = sorted({p.name for p in artifacts.glob("crash-*")} - before)
    result: dict[str, object] = {
        "target": target,
        "seconds": round(time.monotonic() - started),
        "executions": _stat(output, "number_of_executed_units"),
        "corpus": len(list(corpus.iterdir())),
        "exit": proc.returncode,
        "crashes": [str(artifacts / c) for c in crashes],
    }
    (base / "last-run.log").write_text(output)
    if proc.returncode != 0:
        tail = output[-3000:]
        print(f"\n--- {target}: libFuzzer exited {proc.returncode}\n{tail}", file=sys.stderr)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("target", nargs="?", help=f"one of {', '.join(TARGETS)}, or all")
    parser.add_argument("--minutes", type=float, default=2.0, help="fuzzing time per target (default 2)")
    parser.add_argument("--list", action="store_true", help="list the targets")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--corpus", help=argparse.SUPPRESS)
    parser.add_argument("--artifacts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _run_one(args.child, args.seconds, Path(args.corpus), Path(args.artifacts))
        return 0
    if args.list or not args.target:
        print("\n".join(TARGETS))
        return 0
    try:
        import atheris  # noqa: F401
    except ImportError:
        print(
            "atheris is not installed: pip install -e '.[fuzz]' (or run "
            "HYPOTHESIS_PROFILE=long pytest tests/properties)",
            file=sys.stderr,
        )
        return 2
    targets = TARGETS if args.target == "all" else (args.target,)
    unknown = [t for t in targets if t not in SEEDS]
    if unknown:
        parser.error(f"unknown target {unknown[0]!r}; choose one of {', '.join(TARGETS)} or all")
    results = []
    for target in targets:
        result = _fuzz(target, args.minutes)
        results.append(result)
        print(
            f"{target:12} {result['seconds']:>5} s  {result['executions'] or 0:>10} executions  "
            f"corpus {result['corpus']:>5}  crashes {len(result['crashes'])}",
            flush=True,
        )  # type: ignore[arg-type]
    (OUT / "summary.json").write_text(json.dumps(results, indent=2))
    return 1 if any(r["crashes"] or r["exit"] not in (0,) for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
