"""The caller's audio packets put back in order, a lost one given up on after a short wait.

aiortc's own audio jitter buffer waits for a missing packet until sixteen later ones have come,
and then makes room by throwing away the packets queued *in front of* the hole, one per arrival,
until the hole reaches the front. On a network that loses 5 % of the packets, each lost 20 ms
packet so cost the caller about 100 ms of speech (the recognizer heard half the words wrong) and
left a third of a second of delay behind it.

:class:`LossTolerantJitterBuffer` keeps every packet that arrives. It waits for a missing one
only while fewer than :data:`REORDER_PACKETS` later packets are queued (packets reordered by a
network come within a few), then counts it lost and goes on with the next it has; a packet that
comes after its place was given up on is dropped. The receiver takes one frame per packet added,
so a queue once formed stays at that length: the wait bounds the delay a loss adds (60 ms).

The gap a lost packet leaves is kept in the frames' timestamps; the call fills it with silence
(:class:`~duplex_gateway.server.webrtc.CallSocket`), so the caller's audio clock stays true.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

__all__ = ["REORDER_PACKETS", "EncodedFrame", "LossTolerantJitterBuffer"]

#: Later packets queued behind a missing one at which it is counted lost (60 ms of Opus).
REORDER_PACKETS: Final = 3
#: Packets held at most: a packet further ahead than this restarts the sequence (a new source).
CAPACITY: Final = 64
_SEQUENCE: Final = 1 << 16


@dataclass(slots=True)
class EncodedFrame:
    """One packet's payload for the decoder (aiortc's ``JitterFrame``: the receiver remaps ``timestamp``)."""

    data: bytes
    timestamp: int


class LossTolerantJitterBuffer:
    """Audio RTP packets in sequence order, one frame out per packet in (aiortc's jitter buffer contract)."""

    def __init__(self, *, reorder: int = REORDER_PACKETS, capacity: int = CAPACITY) -> None:
        if not 0 < reorder < capacity:
            raise ValueError("reorder must be positive and below capacity")
        self._reorder = reorder
        self._capacity = capacity
        self._packets: dict[int, Any] = {}
        #: The sequence number of the next frame to hand out (None before the first packet).
        self._next: int | None = None
        #: Packets given up on, and packets that came after their place was.
        self.lost = 0
        self.late = 0

    @property
    def capacity(self) -> int:
        return self._capacity

    def add(self, packet: Any) -> tuple[bool, EncodedFrame | None]:
        """Take one RTP packet (its depayloaded ``_data`` set); the next frame in order, if one is due.

        The first item is aiortc's "ask for a key frame", never wanted for audio.
        """
        seq = int(packet.sequence_number)
        if self._next is None:
            self._next = seq
        ahead = (seq - self._next) % _SEQUENCE
        if ahead >= _SEQUENCE // 2:
            self.late += 1
            return False, None
        if ahead >= self._capacity:
            # Far beyond anything held: the sender started over (or a long outage); so do we.
            self.lost += len(self._packets)
            self._packets.clear()
            self._next = seq
        self._packets[seq] = packet
        return False, self._take()

    def _take(self) -> EncodedFrame | None:
        assert self._next is not None
        if self._next not in self._packets:
            offsets = [(s - self._next) % _SEQUENCE for s in self._packets]
            if max(offsets) < self._reorder:
                return None  # the missing packet may still come
            skipped = min(offsets)
            self.lost += skipped
            self._next = (self._next + skipped) % _SEQUENCE
        packet = self._packets.pop(self._next)
        self._next = (self._next + 1) % _SEQUENCE
        return EncodedFrame(data=bytes(getattr(packet, "_data", b"")), timestamp=int(packet.timestamp))


def tolerate_loss(receiver: Any) -> LossTolerantJitterBuffer | None:
    """Put a :class:`LossTolerantJitterBuffer` in an aiortc audio receiver, before its packets come.

    Returns it (None: this aiortc keeps its buffer elsewhere, and its own stays).
    """
    attribute = "_RTCRtpReceiver__jitter_buffer"
    if not hasattr(receiver, attribute):
        return None
    buffer = LossTolerantJitterBuffer()
    setattr(receiver, attribute, buffer)
    return buffer
