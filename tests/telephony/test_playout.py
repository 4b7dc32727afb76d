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
