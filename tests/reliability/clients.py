"""Clients that misbehave on purpose, and a place for the figures the reliability tests measure.

Raw WebSocket frames are written under the client library (``transport.write``), so a test
can send what no well-behaved library would: a header announcing a frame larger than the
server takes, a text frame that is not UTF-8, a compressed frame on a connection that
negotiated no compression. ``reset`` makes a client vanish with a TCP reset and no close
frame. :func:`record` keeps each figure under ``out/reliability/`` (docs/reliability.md
quotes them).
"""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path
from typing import Any

__all__ = ["FIGURES", "frame", "record", "reset", "small_receive_buffer"]

FIGURES = Path(__file__).resolve().parents[2] / "out" / "reliability"


def frame(
    opcode: int, payload: bytes, *, fin: bool = True, rsv1: bool = False, length: int | None = None
) -> bytes:
    """One masked client frame; ``length`` announces another payload length than ``payload``'s."""
    size = len(payload) if length is None else length
    head = bytes([(0x80 if fin else 0) | (0x40 if rsv1 else 0) | opcode])
    if size < 126:
        head += bytes([0x80 | size])
    elif size < 1 << 16:
        head += bytes([0x80 | 126]) + struct.pack("!H", size)
    else:
        head += bytes([0x80 | 127]) + struct.pack("!Q", size)
    mask = os.urandom(4)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def reset(ws: Any) -> None:
    """Vanish without a close frame: a TCP reset, as a killed client or a dropped network gives."""
    sock = ws.transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    ws.transport.abort()


def small_receive_buffer(port: int, size: int = 4096) -> socket.socket:
    """A connected socket whose receive window is ``size`` bytes (a reader that cannot keep up)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)
    sock.connect(("127.0.0.1", port))
    return sock


def record(name: str, **figures: Any) -> None:
    """Keep a test's figures (and print them: ``pytest -s`` shows them as they come)."""
    FIGURES.mkdir(parents=True, exist_ok=True)
    figures["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    (FIGURES / f"{name}.json").write_text(json.dumps(figures, indent=2, default=str))
    shown = {
        key: value for key, value in figures.items() if not isinstance(value, list | dict) or len(value) < 12
    }
    print(f"\n{name}: {json.dumps(shown, default=str)}")
