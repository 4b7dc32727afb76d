"""Replay's pure parts: reading a recording, rebuilding what the client sent, comparing two runs."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from duplex_gateway.audio.codec import decode
from duplex_gateway.cli import main
from duplex_gateway.ops import replay as rp
from duplex_gateway.vocabulary.formats import Encoding

RATE = 24_000


def speechlike(seconds: float, rate: int = RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) * np.sin(2 * np.pi * 3 * t)).astype(np.float32)


def caller_track(folder: Path, samples: np.ndarray) -> rp.CallerAudio:
    folder.mkdir(parents=True, exist_ok=True)
    sf.write(
        folder / "caller.flac", (samples * 32767).astype(np.int16), RATE, subtype="PCM_16", format="FLAC"
    )
    return rp.CallerAudio(folder, RATE)


def ref(size: int, offset: int, encoding: str = "pcm16", rate: int = RATE) -> dict[str, Any]:
    return {"track": "caller", "bytes": size, "offset": offset, "encoding": encoding, "rate": rate}


def test_pcm16_at_the_engine_rate_comes_back_exactly(tmp_path: Path) -> None:
    samples = speechlike(0.5)
    audio = caller_track(tmp_path, samples)
    pcm = (samples * 32767).astype("<i2").tobytes()
    assert audio.wire(ref(960, 0)) == pcm[:960]
    assert audio.wire(ref(960, 480)) == pcm[960:1920]
    # Past the end of the track: silence, and always as many bytes as the client sent.
    tail = audio.wire(ref(960, len(samples) - 100))
    assert tail == pcm[-200:] + bytes(760)
    assert audio.wire(ref(961, 0)) == pcm[:960] + b"\x00"  # the partial sample the gateway refused


@pytest.mark.parametrize(
    ("encoding", "rate"), [("g711_ulaw", 8000), ("pcm16", 16_000), ("pcm_f32le", 48_000)]
)
def test_other_formats_come_back_within_the_resampler_and_codec(
    tmp_path: Path, encoding: str, rate: int
) -> None:
    samples = speechlike(1.0)
    audio = caller_track(tmp_path, samples)
    width = Encoding(encoding).bytes_per_sample
    second = rate * width  # one second at the client's rate, from the start of the track
    wire = audio.wire(ref(second, 0, encoding, rate))
    assert len(wire) == second
    back = decode(wire, Encoding(encoding))
    expected = np.interp(np.arange(rate) * RATE / rate, np.arange(samples.size), samples)
    middle = slice(rate // 10, rate - rate // 10)  # the resampler's edges aside
    assert np.corrcoef(back[middle], expected[middle])[0, 1] > 0.99


def server(t: float, type_: str, **event: Any) -> dict[str, Any]:
    return {"kind": "server", "dir": "out", "t": t, "type": type_, "event": event}


def session(
    events: list[dict[str, Any]],
    *,
    client: list[dict[str, Any]] | None = None,
    reason: str = "client_closed",
    folder: Path = Path("rec"),
) -> rp.RecordedSession:
    end = {
        "kind": "end",
        "t": (events[-1]["t"] if events else 0) + 0.1,
        "reason": reason,
        "code": 1000,
        "complete": True,
    }
    return rp.RecordedSession(
        folder,
        {"session_id": "sess_0123456789abcdef", "engine": "echo"},
        tuple(client or ()),
        tuple(events),
        end,
    )


def reply(salt: str, t0: float, deltas: int) -> list[dict[str, Any]]:
    item, resp, out = f"item_{salt}00001", f"resp_{salt}00002", f"item_{salt}00003"
    return [
        server(t0, "session.created", session_id="sess_x"),
        server(t0 + 0.1, "input_audio_buffer.committed", item_id=item, previous_item_id=None),
        server(t0 + 0.2, "response.created", response_id=resp),
        *(
            server(t0 + 0.3 + i / 100, "response.output_audio.delta", response_id=resp, item_id=out)
            for i in range(deltas)
        ),
        server(t0 + 0.5, "response.done", response_id=resp, output=[{"id": out}]),
    ]


def test_sequences_number_ids_and_fold_deltas() -> None:
    entries = rp.sequence(session(reply("aaaaaaaa", 0.0, 3)))
    assert [e.key for e in entries] == [
        "session.created",
        "input_audio_buffer.committed item_id=item#1",
        "response.created response_id=resp#1",
        "response.output_audio.delta response_id=resp#1 item_id=item#2",
        "response.done response_id=resp#1 id=item#2",
        "end reason=client_closed",
    ]
    assert entries[3].count == 3
    exact = rp.sequence(session(reply("aaaaaaaa", 0.0, 3)), exact_deltas=True)
    assert exact[3].key.endswith("×3")


def test_runs_with_other_ids_and_timings_compare_equal() -> None:
    then = session(reply("aaaaaaaa", 0.0, 3))
    now = session(reply("bbbbbbbb", 0.02, 4))  # other ids, 20 ms later, a different chunking
    result = rp.compare(then, now, engine="echo")
    assert result.equal and result.diff == []
    assert result.delta_counts == [("response.output_audio.delta response_id=resp#1 item_id=item#2", 3, 4)]
    assert rp.first_audio_latency(then) == pytest.approx(0.2)
    worst = result.max_drift()
    assert worst is not None and worst[1] == pytest.approx(0.02)
    report = result.report()
    assert "event sequence: SAME" in report and "3 deltas recorded, 4 now" in report
    assert "first audio latency 0.200 s recorded, 0.200 s now (+0 ms)" in report
    data = result.as_json()
    assert data["equal"] is True and data["timings"]["matched_events"] == 6
    assert not rp.compare(then, now, exact_deltas=True).equal


def test_a_different_run_is_a_readable_diff() -> None:
    then = session(reply("aaaaaaaa", 0.0, 2))
    events = [*reply("bbbbbbbb", 0.0, 0)[:2], server(0.3, "error", code="engine_error", message="x")]
    result = rp.compare(then, session(events, reason="engine_error"), engine="echo")
    assert not result.equal
    text = result.report()
    assert "event sequence: DIFFERENT" in text
    assert "-response.created response_id=resp#1" in text
    assert "+error code=engine_error" in text
    assert "-end reason=client_closed" in text and "+end reason=engine_error" in text
    assert json.loads(json.dumps(result.as_json()))["diff"] == result.diff


def test_frames_are_rebuilt_with_their_audio_and_the_new_runs_ids(tmp_path: Path) -> None:
    samples = speechlike(0.1)
    audio = caller_track(tmp_path, samples)
    recorded = session(reply("aaaaaaaa", 0.0, 1))
    ids = rp._Ids(recorded)
    ids.learn('{"type":"session.created","session":{"id":"sess_fedcba9876543210"}}')
    ids.learn('{"type":"conversation.item.added","item":{"id":"item_bbbbbbbb00001"}}')
    truncate = {
        "kind": "client",
        "t": 1.0,
        "commands": ["conversation.item.truncate"],
        "frame": {
            "type": "conversation.item.truncate",
            "item_id": "item_aaaaaaaa00003",
            "content_index": 0,
            "note": "sess_0123456789abcdef",
            "client_item": "item_mine",
        },
    }
    rebuilt = json.loads(rp.rebuild_frame(truncate, audio, ids.rewrite) or "")
    assert rebuilt["item_id"] == "item_bbbbbbbb00003"
    assert rebuilt["note"] == "sess_fedcba9876543210" and rebuilt["client_item"] == "item_mine"
    append = {
        "kind": "client",
        "t": 0.0,
        "commands": ["input_audio_buffer.append"],
        "frame": {"type": "input_audio_buffer.append", "audio": {"$audio": ref(200, 0)}},
    }
    rebuilt = json.loads(rp.rebuild_frame(append, audio) or "")
    assert base64.b64decode(rebuilt["audio"]) == (samples[:100] * 32767).astype("<i2").tobytes()
    assert (
        rp.rebuild_frame({"kind": "client", "t": 0, "commands": [], "text": "not json"}, audio) == "not json"
    )
    assert (
        rp.rebuild_frame({"kind": "client", "t": 0, "commands": [], "binary": {"$bytes": 3}}, audio) is None
    )


def test_reading_a_recording(tmp_path: Path) -> None:
    lines = [
        {"kind": "session", "session_id": "s", "engine": "echo"},
        {"kind": "client", "dir": "in", "t": 0.1, "commands": [], "text": "x"},
        server(0.2, "rate_limits.updated"),
        {"kind": "gap", "t": 0.3, "dropped": {"items": 1}},
    ]
    log = tmp_path / "events.jsonl"
    log.write_text("\n".join(json.dumps(line) for line in lines) + '\n{"kind": "ser', encoding="utf-8")
    recorded = rp.load_recording(log)  # a log cut short mid-line: the rest is read
    assert recorded.folder == tmp_path and len(recorded.client) == 1 and len(recorded.server) == 1
    assert recorded.end is None and not recorded.complete and recorded.gaps == 1
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "events.jsonl").write_text('{"kind":"client"}\n', encoding="utf-8")
    with pytest.raises(rp.ReplayError, match="no session header"):
        rp.load_recording(tmp_path / "other")
    with pytest.raises(rp.ReplayError, match="cannot read"):
        rp.load_recording(tmp_path / "missing")


def test_the_command_refuses_what_it_cannot_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "missing"), "--engine", "echo"]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "events.jsonl").write_text(
        json.dumps({"kind": "session", "session_id": "s", "engine": "echo", "dialect": "telephony"}) + "\n",
        encoding="utf-8",
    )
    assert main(["replay", str(tmp_path), "--engine", "echo"]) == 2
    assert "phone call" in capsys.readouterr().err
    assert main(["replay", str(tmp_path), "--speed", "0"]) == 2
