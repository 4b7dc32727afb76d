"""The carrier's playout buffer as the gateway models it: pacing, marks, the clear epoch."""

from __future__ import annotations

from typing import Any

from duplex_gateway.telephony.carrier import Framing
from duplex_gateway.telephony.playout import Heard, Playout, Truncation
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from tests.typed import narrow

ULAW = AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000)
PCM16 = AudioFormat(encoding=Encoding.PCM16, rate=8_000)


def playout(**kw: object) -> Playout:
    options: dict[str, Any] = {"lead_ms": 100.0, "marks": True, **kw}
    fmt = options.pop("fmt", ULAW)
    framing = options.pop("framing", Framing(chunk_ms=40))
    return Playout(fmt, framing, **options)


def test_audio_goes_out_at_real_time_plus_the_lead() -> None:
    p = playout()
    p.queue("r1", "i1", bytes(8_000))  # 1 s
    out, wake = p.due(0.0)
    # 40 ms pieces until the carrier holds more than the 100 ms lead: 3 pieces (120 ms).
    assert [len(o.audio) for o in out] == [320, 320, 320]
    assert wake is not None and abs(wake - 0.02) < 1e-9
    assert p.due(0.01)[0] == []  # not yet
    out, _ = p.due(0.02)
    assert len(out) == 1
    # After a second of wall time everything went out, never more than the lead ahead.
    sent = 4
    t = 0.02
    while True:
        t += 0.04
        out, wake = p.due(t)
        sent += len(out)
        if wake is None:
            break
    assert sent == 25 and t < 1.0


def test_a_short_piece_waits_for_the_rest_unless_the_reply_is_done() -> None:
    p = playout()
    p.queue("r1", "i1", bytes(100))
    assert p.due(0.0) == ([], None)
    p.queue("r1", "i1", bytes(300))
    assert [len(o.audio) for o in p.due(0.0)[0]] == [320]
    p.finish("r1")
    assert [len(o.audio) for o in p.due(0.0)[0]] == [80]


def test_pieces_obey_the_carriers_minimum_and_multiple() -> None:
    # Exotel's rule: at least 3.2 KB, a multiple of 320 B (PCM16 at 8 kHz: 200 ms, 20 ms).
    p = playout(fmt=PCM16, framing=Framing(chunk_ms=100, min_bytes=3200, multiple=320), lead_ms=10_000)
    p.queue("r1", "i1", bytes(10_000))
    p.finish("r1")
    sizes = [len(o.audio) for o in p.due(0.0)[0]]
    assert all(size >= 3200 and size % 320 == 0 for size in sizes), sizes
    assert sum(sizes) >= 10_000


def test_marks_are_the_playback_cursor_and_a_clear_starts_a_new_epoch() -> None:
    p = playout(lead_ms=1_000)
    p.queue("r1", "i1", bytes(1600))  # 200 ms: five 40 ms pieces, each with a mark
    out, _ = p.due(0.0)
    names = [o.mark for o in out]
    assert len(names) == 5 and all(names)
    assert p.played(names[1]) == Heard("r1", "i1", 80)
    assert p.heard_ms(0.0) == 80
    assert p.pending(0.0)
    cut = p.clear(0.0)
    assert cut == Truncation("r1", "i1", 80)
    # Twilio echoes every pending mark on a clear: they say "dropped", not "played".
    assert all(p.played(narrow(name, str)) is None for name in names[2:])
    assert not p.pending(0.0)
    assert p.clear(0.0) is None  # nothing was cut this time


def test_an_echoed_mark_skips_the_ones_before_it() -> None:
    p = playout(lead_ms=1_000)
    p.queue("r1", "i1", bytes(960))
    names = [o.mark for o in p.due(0.0)[0]]
    assert p.played(narrow(names[2], str)) == Heard("r1", "i1", 120)
    assert p.played(narrow(names[0], str)) is None
    assert not p.pending(0.0)


def test_without_marks_the_clock_is_the_cursor() -> None:
    p = playout(marks=False)
    p.queue("r1", "i1", bytes(8_000))
    out, _ = p.due(0.0)
    assert all(o.mark is None for o in out)  # 120 ms sent at t=0
    assert p.heard_ms(0.05) == 50
    assert p.pending(0.05)
    assert p.clear(0.05) == Truncation("r1", "i1", 50)


def test_a_new_reply_starts_its_own_count_and_flow_control_holds_audio() -> None:
    p = playout(lead_ms=1_000)
    p.queue("r1", "i1", bytes(320))
    p.finish("r1")
    p.queue("r2", "i2", bytes(320))
    p.finish("r2")
    out = p.due(0.0)[0]
    assert [p.played(narrow(o.mark, str)) for o in out] == [Heard("r1", "i1", 40), Heard("r2", "i2", 40)]
    p.paused = True
    p.queue("r3", "i3", bytes(320))
    p.finish("r3")
    assert p.due(1.0)[0] == []
    p.paused = False
    assert len(p.due(1.0)[0]) == 1


def _ramp(n: int) -> bytes:
    """Audio whose every byte says where it was in the reply (so a resend shows what came back)."""
    return bytes(i % 251 for i in range(n))


def test_a_hold_takes_back_what_the_carrier_had_not_played_and_sends_on_from_there() -> None:
    p = playout(lead_ms=1_000)
    reply = _ramp(1600)  # 200 ms: five 40 ms pieces
    p.queue("r1", "i1", reply)
    p.finish("r1")
    out, _ = p.due(0.0)
    assert p.played(narrow(out[1].mark, str)) == Heard("r1", "i1", 80)  # 80 ms played
    assert p.hold(0.1)  # the carrier had three pieces to clear
    assert p.due(0.2) == ([], None)  # nothing while held
    stale = [o.mark for o in out[2:]]
    assert all(p.played(narrow(name, str)) is None for name in stale)  # cleared, not played
    p.release()
    resent, _ = p.due(0.3)
    assert b"".join(o.audio for o in resent) == reply[640:]  # from the pause point, nothing twice
    assert p.played(narrow(resent[-1].mark, str)) == Heard("r1", "i1", 200)


def test_a_hold_without_marks_goes_by_the_clock_and_an_empty_buffer_needs_no_clear() -> None:
    p = playout(marks=False)
    reply = _ramp(8_000)  # 1 s
    p.queue("r1", "i1", reply)
    out, _ = p.due(0.0)  # 120 ms sent at t=0
    assert p.hold(0.05)
    p.release()
    resent, _ = p.due(0.06)
    sent = b"".join(o.audio for o in out)
    assert b"".join(o.audio for o in resent)[: len(sent) - 400] == sent[400:]  # from 50 ms on
    assert p.heard_ms(0.06) == 50
    idle = playout()
    assert not idle.hold(0.0)


def test_a_hold_on_a_carrier_with_no_buffer_to_clear_stops_sending_and_takes_nothing_back() -> None:
    p = playout(marks=False)
    reply = _ramp(8_000)  # 1 s
    p.queue("r1", "i1", reply)
    out, _ = p.due(0.0)  # 120 ms sent at t=0: the carrier plays all of it
    assert not p.hold(0.05, reclaim=False)  # nothing to clear
    held, _ = p.due(0.2)
    assert held == []
    p.release()
    resent, _ = p.due(0.5)
    # It goes on after what was sent: nothing is heard twice, nothing lost.
    assert b"".join(o.audio for o in out + resent) == reply[: len(b"".join(o.audio for o in out + resent))]
    assert p.heard_ms(0.5) == 120


def test_a_clear_during_a_hold_cuts_the_reply_at_the_pause_point() -> None:
    p = playout(lead_ms=1_000)
    p.queue("r1", "i1", _ramp(1600))
    out, _ = p.due(0.0)
    p.played(narrow(out[0].mark, str))
    p.hold(0.05)
    assert p.clear(0.5) == Truncation("r1", "i1", 40)
    assert not p.holding and not p.pending(0.5)
