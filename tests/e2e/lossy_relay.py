"""A UDP relay on 127.0.0.1 that stands between a WebRTC caller and the gateway and loses packets.

Each side is told the relay is the other: the caller's offer goes to the gateway with its one
candidate rewritten to the relay's gateway-facing socket, the gateway's answer reaches the caller
with its candidate rewritten to the relay's caller-facing socket. Every packet of the call then
crosses the relay, which drops a share of the media at random, each way on its own:

* RTP and RTCP (the audio, RFC 7983: first byte 128-191), and
* DTLS application data (first byte 23: the SCTP packets that carry the data channel).

ICE's connectivity checks and the DTLS handshake always pass: a lossy network slows a call's set-up
by retransmissions that are not what is measured here, and aiortc's DTLS handshake retransmits
only on a timer of seconds.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass, field
from typing import cast

__all__ = ["LossyRelay"]

_CANDIDATE = re.compile(r"^a=candidate:(\S+) (\d) (udp|UDP) (\d+) (\S+) (\d+) typ host(.*)$")
_RTP = range(128, 192)
_DTLS_APPLICATION_DATA = 23


@dataclass
class _Direction:
    """One way through the relay: where it sends, and what it did with the packets."""

    loss: float
    rng: random.Random
    to: tuple[str, int] | None = None
    passed: int = 0
    dropped: int = 0

    def lose(self, packet: bytes) -> bool:
        lossy = packet[0] in _RTP or packet[0] == _DTLS_APPLICATION_DATA
        return lossy and self.rng.random() < self.loss


class _Side(asyncio.DatagramProtocol):
    def __init__(self, relay: LossyRelay, inbound: _Direction) -> None:
        self._relay = relay
        self._inbound = inbound
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self._relay.forward(self, data)


@dataclass
class LossyRelay:
    """Two sockets on 127.0.0.1; ``loss`` of the media is dropped each way (seeded: runs repeat)."""

    loss: float
    seed: int = 5
    to_gateway: _Direction = field(init=False)
    to_caller: _Direction = field(init=False)
    _caller_side: _Side = field(init=False)
    _gateway_side: _Side = field(init=False)

    def __post_init__(self) -> None:
        self.to_gateway = _Direction(self.loss, random.Random(self.seed))
        self.to_caller = _Direction(self.loss, random.Random(self.seed + 1))

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._caller_side = _Side(self, self.to_gateway)
        self._gateway_side = _Side(self, self.to_caller)
        await loop.create_datagram_endpoint(lambda: self._caller_side, local_addr=("127.0.0.1", 0))
        await loop.create_datagram_endpoint(lambda: self._gateway_side, local_addr=("127.0.0.1", 0))

    def close(self) -> None:
        for side in (self._caller_side, self._gateway_side):
            if side.transport is not None:
                side.transport.close()

    def offer(self, sdp: str) -> str:
        """The caller's offer as the gateway gets it: the relay's gateway side is the caller."""
        sdp, self.to_caller.to = _through(sdp, self._port(self._gateway_side))
        return sdp

    def answer(self, sdp: str) -> str:
        """The gateway's answer as the caller gets it: the relay's caller side is the gateway."""
        sdp, self.to_gateway.to = _through(sdp, self._port(self._caller_side))
        return sdp

    def forward(self, side: _Side, packet: bytes) -> None:
        if side is self._caller_side:
            direction, out = self.to_gateway, self._gateway_side
        else:
            direction, out = self.to_caller, self._caller_side
        if not packet or direction.to is None or out.transport is None:
            return
        if direction.lose(packet):
            direction.dropped += 1
            return
        direction.passed += 1
        out.transport.sendto(packet, direction.to)

    @staticmethod
    def _port(side: _Side) -> int:
        assert side.transport is not None
        return int(side.transport.get_extra_info("sockname")[1])


def _through(sdp: str, port: int) -> tuple[str, tuple[str, int]]:
    """``sdp`` with its one 127.0.0.1 host candidate moved to the relay's ``port``; where it was."""
    lines, found = [], None
    for line in sdp.splitlines():
        match = _CANDIDATE.match(line)
        if match is None:
            lines.append(line)
            continue
        if match.group(5) != "127.0.0.1" or match.group(2) != "1" or found is not None:
            continue  # one path only: every packet crosses the relay
        found = ("127.0.0.1", int(match.group(6)))
        foundation, component, transport, priority = match.group(1, 2, 3, 4)
        lines.append(
            f"a=candidate:{foundation} {component} {transport} {priority} 127.0.0.1 {port} typ host{match.group(7)}"
        )
    assert found is not None, f"no 127.0.0.1 host candidate in:\n{sdp}"
    return "\r\n".join(lines) + "\r\n", found
