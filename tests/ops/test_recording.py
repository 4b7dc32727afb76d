"""Session recordings: the writer, its failures (a full queue, a full disk), retention, and who is recorded."""

from __future__ import annotations

import base64
import errno
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from duplex_gateway.auth.keys import ApiKey, KeyStore
from duplex_gateway.auth.principal import ALL_SCOPES, Principal, PrincipalKind
from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.engine.port import EngineCapabilities
from duplex_gateway.ops import recording as rec
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import InputAudioAppend, InputAudioCommit
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig
from tests.typed import narrow

PCM16_24K = AudioFormat(encoding=Encoding.PCM16, rate=24_000)
ENGINE = EngineCapabilities(name="echo", input_rate=24_000, output_rate=24_000)


def tone(samples: int, start: int = 0) -> bytes:
    return (np.arange(start, start + samples) % 2000 - 1000).astype("<i2").tobytes()


def recording(tmp_path: Path, **kwargs: Any) -> rec.Recording:
    return rec.Recording(
        tmp_path / "20260101T000000.000000Z_sess_test",
        header={"session_id": "sess_test", "engine": "echo"},
        input_rate=24_000,
        output_rate=24_000,
        **kwargs,
    )


def log_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / rec.EVENTS_FILE).read_text(encoding="utf-8").splitlines()]


def append_frame(audio: bytes) -> tuple[str, InputAudioAppend]:
    frame = json.dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode()})
    return frame, InputAudioAppend(audio=audio)


def test_a_session_is_written_as_two_flac_tracks_and_a_log(tmp_path: Path) -> None:
    r = recording(tmp_path)
    first, second = tone(480), tone(480, 480)
    for audio in (first, second):
        frame, command = append_frame(audio)
        r.client_command(frame, [command], PCM16_24K)
        r.caller_audio(audio)
    r.client_command('{"type":"input_audio_buffer.commit"}', [InputAudioCommit()], PCM16_24K)
    r.client_command("not json", [], PCM16_24K)
    reply = tone(960, 7)
    r.assistant_audio(reply[:1001])  # an odd byte: half a sample waits for the next chunk
    r.assistant_audio(reply[1001:])
    wire = reply[::2]  # what the client got may differ (another rate): only its length is logged
    r.server_event(
        ev.AudioDelta(response_id="resp_1", item_id="item_1", audio=wire, rate=12_000, encoded=True), True
    )
    r.server_event(ev.AudioDone(response_id="resp_1", item_id="item_1"), False)
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)

    caller, rate = sf.read(r.folder / rec.CALLER_FILE, dtype="int16")
    assert rate == 24_000 and caller.astype("<i2").tobytes() == first + second
    assistant, _ = sf.read(r.folder / rec.ASSISTANT_FILE, dtype="int16")
    assert assistant.astype("<i2").tobytes() == reply

    log = log_of(r.folder)
    assert [line["kind"] for line in log] == [
        "session",
        "client",
        "client",
        "client",
        "client",
        "server",
        "server",
        "end",
    ]
    header, *body, end = log
    assert header["version"] == rec.FORMAT_VERSION and header["engine"] == "echo"
    times = [line["t"] for line in body]
    assert times == sorted(times)
    refs = [line["frame"]["audio"]["$audio"] for line in body[:2]]
    assert refs == [
        {"track": "caller", "bytes": 960, "offset": 0, "encoding": "pcm16", "rate": 24000},
        {"track": "caller", "bytes": 960, "offset": 480, "encoding": "pcm16", "rate": 24000},
    ]
    assert body[2]["commands"] == ["input_audio_buffer.commit"]
    assert body[3] == {"kind": "client", "dir": "in", "t": body[3]["t"], "commands": [], "text": "not json"}
    delta, done = body[4], body[5]
    assert delta["type"] == "response.output_audio.delta" and delta["dir"] == "out"
    assert delta["event"]["audio"] == {"$audio": {"track": "assistant", "bytes": len(wire), "offset": 0}}
    assert delta["event"]["rate"] == 12_000 and "sent" not in delta
    assert done["sent"] is False  # the dialect had no frame for it
    assert end["complete"] is True and end["reason"] == "client_closed" and end["code"] == 1000
    assert end["caller_samples"] == 960 and end["assistant_samples"] == 960
    assert end["config"]["input_format"] == {"encoding": "pcm16", "rate": 24000}


def test_an_append_in_its_own_format_is_logged_with_that_format(tmp_path: Path) -> None:
    r = recording(tmp_path)
    audio = bytes(160)
    frame = json.dumps(
        {"type": "input_audio_buffer.append", "audio": base64.b64encode(audio).decode("ascii")}
    )
    r.client_command(
        frame, [InputAudioAppend(audio=audio, encoding=Encoding.G711_ULAW, rate=8000)], PCM16_24K
    )
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)
    ref = log_of(r.folder)[1]["frame"]["audio"]["$audio"]
    assert (ref["encoding"], ref["rate"], ref["bytes"]) == ("g711_ulaw", 8000, 160)


def test_a_payload_in_base64_of_its_own_making_is_still_left_out(tmp_path: Path) -> None:
    r = recording(tmp_path)
    audio = bytes(range(256)) * 3  # its base64 has slashes, which this client escapes
    text = base64.b64encode(audio).decode("ascii").replace("/", "\\/")
    frame = '{"type":"input_audio_buffer.append","event_id":"e1","audio":"' + text + '"}'
    r.client_command(frame, [InputAudioAppend(audio=audio, event_id="e1")], PCM16_24K)
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)
    logged = log_of(r.folder)[1]["frame"]
    assert logged["event_id"] == "e1" and logged["audio"]["$audio"]["bytes"] == len(audio)


def test_hooks_after_the_end_are_ignored_and_no_recorder_does_nothing(tmp_path: Path) -> None:
    r = recording(tmp_path)
    r.closed("client_closed", 1000, SessionConfig())
    r.caller_audio(tone(100))
    r.closed("again", None, SessionConfig())
    assert r.wait(5)
    assert [line["kind"] for line in log_of(r.folder)] == ["session", "end"]
    assert not (r.folder / rec.CALLER_FILE).exists()  # no audio, no track
    nothing = rec.NO_RECORDER
    nothing.caller_audio(b"x")
    nothing.closed("client_closed", None, SessionConfig())


def test_a_full_queue_costs_the_recording_not_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    handle = rec._Writer.handle

    def slow_disk(self: rec._Writer, kind: Any, now: float, payload: Any) -> None:
        gate.wait(10)
        handle(self, kind, now, payload)

    monkeypatch.setattr(rec._Writer, "handle", slow_disk)
    r = recording(tmp_path, queue_size=16)
    chunk = tone(240)
    began = time.monotonic()
    for _ in range(200):
        r.caller_audio(chunk)
    assert time.monotonic() - began < 0.5  # nothing waited for the writer
    gate.set()
    # Once the writer catches up, what follows is kept again, after a gap line.
    deadline = time.monotonic() + 5
    while r._queue.qsize() and time.monotonic() < deadline:
        time.sleep(0.01)
    r.caller_audio(chunk)
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)

    log = log_of(r.folder)
    gaps = [line for line in log if line["kind"] == "gap"]
    end = log[-1]
    assert gaps and end["complete"] is False and end["problems"] == ["queue_overflow"]
    assert end["dropped"]["items"] == sum(gap["dropped"]["items"] for gap in gaps) > 0
    # Dropped audio became silence: the track keeps the session's timeline.
    assert end["caller_samples"] == 201 * 240
    assert sum("fell behind" in m for m in caplog.messages) == 1  # one line, not one per dropped item


def test_a_full_disk_is_one_log_line_and_an_incomplete_recording(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def full(self: rec._Track, pcm: bytes) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rec._Track, "write", full)
    caplog.set_level(logging.ERROR, logger="duplex_gateway.ops.recording")
    r = recording(tmp_path)
    r.server_event(ev.RateLimitsUpdated(), True)
    for _ in range(10):
        r.caller_audio(tone(240))
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)
    errors = [m for m in caplog.messages if "recording of session sess_test stopped" in m]
    assert len(errors) == 1 and os.strerror(errno.ENOSPC) in errors[0]
    end = log_of(r.folder)[-1]
    assert end["kind"] == "end" and end["complete"] is False
    assert end["problems"] == [f"write_failed: {os.strerror(errno.ENOSPC)}"]


def test_a_disk_that_fills_as_the_tracks_close_still_gets_the_end_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: rec._Track) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(rec._Track, "close", full)
    r = recording(tmp_path)
    r.caller_audio(tone(240))
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)
    end = log_of(r.folder)[-1]
    assert end["kind"] == "end" and end["complete"] is False and end["problems"][0].startswith("write_failed")


def test_a_folder_that_cannot_be_made_costs_only_the_recording(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = rec.Recording(blocker / "sub", header={"session_id": "s"}, input_rate=16_000, output_rate=24_000)
    r.caller_audio(tone(10))
    r.closed("client_closed", 1000, SessionConfig())
    assert r.wait(5)
    assert any("recording of session s stopped" in m for m in caplog.messages)


def folder(directory: Path, started: str, session: str, size: int = 0) -> Path:
    path = directory / f"{started}Z_{session}"
    path.mkdir(parents=True)
    (path / rec.EVENTS_FILE).write_bytes(bytes(size))
    return path


def test_retention_deletes_the_oldest_first(tmp_path: Path) -> None:
    old = folder(tmp_path, "20260101T000000.000000", "sess_a", 100)
    mid = folder(tmp_path, "20260102T000000.000000", "sess_b", 100)
    new = folder(tmp_path, "20260103T000000.000000", "sess_c", 100)
    other = tmp_path / "notes"  # not a recording: never counted, never touched
    other.mkdir()
    assert rec.sweep(tmp_path, max_recordings=2, max_bytes=None, max_age_s=None) == [old]
    assert rec.sweep(tmp_path, max_recordings=2, max_bytes=250, max_age_s=None) == []
    # The oldest is still being written: the next oldest goes instead.
    assert rec.sweep(
        tmp_path, max_recordings=None, max_bytes=150, max_age_s=None, keep=frozenset({mid.name})
    ) == [new]
    started = rec._folder_started(mid.name)
    assert started is not None
    day = 86_400.0
    assert (
        rec.sweep(tmp_path, max_recordings=None, max_bytes=None, max_age_s=day, now=started + day / 2) == []
    )
    assert rec.sweep(tmp_path, max_recordings=None, max_bytes=None, max_age_s=day, now=started + 2 * day) == [
        mid
    ]
    assert rec.sweep(tmp_path, max_recordings=None, max_bytes=None, max_age_s=None) == []
    assert other.is_dir()


def test_recordings_record_only_when_asked(tmp_path: Path) -> None:
    settings = load_settings(None, **{"recording.directory": str(tmp_path / "r")})
    off = rec.Recordings.from_settings(settings)
    keyed = Principal(kind=PrincipalKind.KEY, name="k", scopes=ALL_SCOPES, record=True)
    assert not off.active and not off.wants(keyed)
    assert off.start(
        "sess_1", principal=keyed, engine=ENGINE, dialect="realtime", config=SessionConfig()
    ) is (rec.NO_RECORDER)
    assert not (tmp_path / "r").exists()

    with_key = load_settings(
        None,
        **{
            "recording.directory": str(tmp_path / "r"),
            "auth.keys": [{"name": "k", "key": "secret", "record": True}, {"name": "j", "key": "other"}],
        },
    )
    recordings = rec.Recordings.from_settings(with_key)
    plain = Principal(kind=PrincipalKind.KEY, name="j", scopes=ALL_SCOPES)
    assert recordings.active and recordings.wants(keyed) and not recordings.wants(plain)
    assert not recordings.wants(None)
    store = KeyStore.from_settings(with_key.auth)
    assert narrow(store.named("k"), ApiKey).record and not narrow(store.named("j"), ApiKey).record

    everyone = rec.Recordings.from_settings(
        load_settings(
            None,
            **{
                "recording.enabled": True,
                "recording.directory": str(tmp_path / "r"),
            },
        )
    )
    recorder = everyone.start(
        "sess_1",
        principal=None,
        engine=ENGINE,
        dialect="realtime",
        config=SessionConfig(),
        endpoint={"path": "/v1/realtime"},
    )
    assert isinstance(recorder, rec.Recording)
    recorder.closed("client_closed", 1000, SessionConfig())
    assert recorder.wait(5)
    header = log_of(recorder.folder)[0]
    assert header["session_id"] == "sess_1" and header["endpoint"] == {"path": "/v1/realtime"}
    assert header["audio"]["assistant"]["rate"] == 24_000


def test_the_recording_section_is_checked() -> None:
    settings = load_settings(
        None, **{"recording.retention.max_recordings": 3, "recording.retention.max_bytes": 10}
    )
    assert settings.recording.retention.max_recordings == 3 and not settings.recording.enabled
    with pytest.raises(ConfigError, match="recording.retention.max_age_s"):
        load_settings(None, **{"recording.retention.max_age_s": 0})
    with pytest.raises(ConfigError, match="recording.keep"):
        load_settings(None, **{"recording.keep": 1})


def test_jsonable_keeps_no_payload() -> None:
    value = rec.jsonable({"a": b"\x00\x01", "b": (Encoding.PCM16, frozenset({2, 1})), "c": PCM16_24K})
    assert value == {"a": {"$bytes": 2}, "b": ["pcm16", [1, 2]], "c": {"encoding": "pcm16", "rate": 24000}}
