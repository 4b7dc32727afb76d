"""The caller's audio packets in order: a lost one costs its own 20 ms, nothing more."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from duplex_gateway.server.webrtc_jitter import REORDER_PACKETS, LossTolerantJitterBuffer, tolerate_loss


@dataclass
class Packet:
    sequence_number: int
    timestamp: int
    _data: bytes


def packet(seq: int) -> Packet:
    return Packet(seq % 65536, seq * 960, f"opus{seq}".encode())


def feed(buffer: LossTolerantJitterBuffer, seqs: list[int]) -> list[int]:
    """The sequence numbers of the frames handed out, by their timestamps."""
    out = []
    for seq in seqs:
        pli, frame = buffer.add(packet(seq))
        assert pli is False
        if frame is not None:
            out.append(frame.timestamp // 960)
            assert frame.data == f"opus{frame.timestamp // 960}".encode()
    return out


def test_packets_in_order_come_straight_out() -> None:
    buffer = LossTolerantJitterBuffer()
    assert feed(buffer, list(range(100, 140))) == list(range(100, 140))
    assert buffer.lost == buffer.late == 0


def test_a_reordered_packet_is_waited_for() -> None:
    buffer = LossTolerantJitterBuffer()
    assert feed(buffer, [0, 1, 3, 2, 4, 5]) == [0, 1, 2, 3, 4]
    assert buffer.lost == 0


def test_a_lost_packet_is_given_up_after_the_reorder_wait_and_only_it_is_lost() -> None:
    buffer = LossTolerantJitterBuffer()
    sent = [s for s in range(200) if s % 20 != 7]  # 5 % lost
    out = feed(buffer, sent)
    # Every packet that came is handed out, in order (the last few still queued behind the wait).
    assert out == sent[: len(out)]
    assert len(sent) - len(out) <= REORDER_PACKETS
    assert buffer.lost == sum(1 for s in range(out[-1]) if s % 20 == 7)


def test_aiortcs_own_buffer_throws_good_packets_away_for_a_lost_one() -> None:
    """The reason this buffer exists: the same stream through aiortc's keeps far fewer packets."""
    from aiortc.jitterbuffer import JitterBuffer

    theirs = JitterBuffer(capacity=16, prefetch=4)
    sent = [s for s in range(400) if s % 20 != 7]
    kept = sum(theirs.add(packet(s))[1] is not None for s in sent)  # type: ignore[arg-type]
    ours = len(feed(LossTolerantJitterBuffer(), sent))
    assert ours >= len(sent) - REORDER_PACKETS
    assert kept < ours - 20, (kept, ours)


def test_a_packet_after_its_place_was_given_up_is_dropped() -> None:
    buffer = LossTolerantJitterBuffer(reorder=2)
    assert feed(buffer, [0, 2, 3, 1, 4]) == [0, 2, 3]
    assert (buffer.lost, buffer.late) == (1, 1)


def test_the_sequence_wraps() -> None:
    buffer = LossTolerantJitterBuffer()
    seqs = list(range(65530, 65542))
    assert feed(buffer, seqs) == seqs


def test_a_jump_far_ahead_starts_over() -> None:
    buffer = LossTolerantJitterBuffer(capacity=16)
    assert feed(buffer, [0, 1, 2, 5000, 5001]) == [0, 1, 2, 5000, 5001]


def test_the_wait_must_fit_the_capacity() -> None:
    with pytest.raises(ValueError, match="reorder"):
        LossTolerantJitterBuffer(reorder=16, capacity=16)


async def test_it_goes_into_an_aiortc_receiver() -> None:
    from aiortc import RTCPeerConnection

    pc = RTCPeerConnection()
    try:
        transceiver = pc.addTransceiver("audio")
        buffer = tolerate_loss(transceiver.receiver)
        assert buffer is not None
        assert transceiver.receiver._RTCRtpReceiver__jitter_buffer is buffer
    finally:
        await pc.close()
