"""Recording and replay against REAL gateway processes.

A session with one server-VAD turn (real speech, the gateway's VAD, the echo engine at 24 kHz,
so caller audio reaches the engine unconverted) is recorded by one gateway; the tests read the
recording back (FLAC and JSONL), and ``duplex-gateway replay`` plays it against the echo engine
again: unchanged it must exit 0, against another configuration or from a tampered recording 1,
with a diff a person can read.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf
import yaml

from tests.e2e.helpers import (
    PYTHON,
    REPO,
    EventLog,
    Gateway,
    GatewayFactory,
    audio_of,
    gateway_env,
    send_json,
    speech_turn,
    stream_audio,
    wait_answered_turn,
    ws_connect,
)

pytestmark = pytest.mark.e2e

#: The gateway that records and the one replay runs share everything but the recording section.
BASE_CONFIG: dict[str, Any] = {"engine": {"name": "echo", "echo": {"pace": 0}}}
REPLAY_TIMEOUT_S = 120


@dataclass
class RecordedCall:
    folder: Path
    sent: bytes  # the caller audio the client sent (PCM16, 24 kHz)
    received: list[dict[str, Any]]  # every server event the client got
    config: Path  # the gateway configuration, for replay


def finished(directory: Path, count: int = 1, timeout: float = 10.0) -> list[Path]:
    """The recording folders in ``directory`` once ``count`` of them have their end line."""
    deadline = time.monotonic() + timeout
    while True:
        folders = sorted(p for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else []
        done = [p for p in folders if '"kind":"end"' in _read(p / "events.jsonl")]
        if len(done) >= count or time.monotonic() > deadline:
            return done
        time.sleep(0.05)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return ""


def log_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text(encoding="utf-8").splitlines()]


async def one_turn(
    gw: Gateway, *, headers: dict[str, str] | None = None, bad_frame: bool = True
) -> tuple[bytes, list]:
    """Connect, say one turn, let the echo answer, close (1000); what was sent and received."""
    turn = speech_turn(before_ms=600, after_ms=900)
    async with ws_connect(gw, additional_headers=headers or {}) as ws:
        log = EventLog(ws.recv)
        await log.wait_for("session.created")
        if bad_frame:
            # A frame the gateway refuses is recorded too, with the error it cost.
            await send_json(ws, {"type": "no.such.event"})
            await log.wait_for("error")
        await stream_audio(ws, turn, frame_ms=40, speed=4.0)
        answered = await wait_answered_turn(log, timeout=20)
        await log.wait_for("rate_limits.updated", start=log.events.index(answered.done))
        await asyncio.sleep(0.2)
        await ws.close()
        await log.aclose()
        return turn, log.events


@pytest.fixture(scope="module")
def recorded(
    module_gateway_factory: GatewayFactory, tmp_path_factory: pytest.TempPathFactory
) -> RecordedCall:
    base = tmp_path_factory.mktemp("recorded")
    directory = base / "recordings"
    gw = module_gateway_factory.start(
        {**BASE_CONFIG, "recording": {"enabled": True, "directory": str(directory)}}
    )
    sent, received = asyncio.run(one_turn(gw))
    folders = finished(directory)
    assert len(folders) == 1, list(directory.iterdir())
    config = base / "replay.yaml"
    config.write_text(yaml.safe_dump({**BASE_CONFIG, "limits": {"resume_grace_s": 0}}), encoding="utf-8")
    return RecordedCall(folders[0], sent, received, config)


def test_the_recording_holds_what_was_said_and_heard(recorded: RecordedCall) -> None:
    folder = recorded.folder
    caller, caller_rate = sf.read(folder / "caller.flac", dtype="int16")
    assistant, assistant_rate = sf.read(folder / "assistant.flac", dtype="int16")
    assert caller_rate == assistant_rate == 24_000  # the echo engine's rate in both directions
    # PCM16 at the engine's rate reaches it unconverted: the track is the client's bytes exactly.
    assert caller.astype("<i2").tobytes() == recorded.sent
    # The reply as the engine made it; the client asked for the same format, so it heard exactly this.
    assert assistant.astype("<i2").tobytes() == audio_of(recorded.received)
    assert len(assistant) > 24_000  # the echo of the speech, several seconds of it

    log = log_of(folder)
    header, end = log[0], log[-1]
    assert header["kind"] == "session" and header["engine"] == "echo" and header["dialect"] == "realtime"
    assert header["endpoint"]["path"] == "/v1/realtime"
    assert header["config"]["input_format"] == {"encoding": "pcm16", "rate": 24000}
    assert header["audio"]["caller"] == {"file": "caller.flac", "encoding": "pcm16", "rate": 24000}
    assert end["kind"] == "end" and end["complete"] is True and end["problems"] == []
    assert (end["reason"], end["code"]) == ("client_closed", 1000)
    assert end["caller_samples"] == len(caller) and end["assistant_samples"] == len(assistant)

    body = log[1:-1]
    times = [record["t"] for record in body]
    assert times == sorted(times) and times[0] >= 0 and end["t"] >= times[-1]
    assert {record["dir"] for record in body} == {"in", "out"}
    # Every event the client got, in order, and nothing it did not get (bar what its dialect drops).
    sent_types = [r["type"] for r in body if r["dir"] == "out" and r.get("sent", True)]
    assert sent_types == [event["type"] for event in recorded.received]

    client = [record for record in body if record["dir"] == "in"]
    assert client[0]["commands"] == [] and client[0]["frame"] == {"type": "no.such.event"}
    appends = [record["frame"]["audio"]["$audio"] for record in client[1:]]
    assert all(record["commands"] == ["input_audio_buffer.append"] for record in client[1:])
    assert sum(ref["bytes"] for ref in appends) == len(recorded.sent)
    # Each append's offset is where its audio starts in the caller track.
    offset = 0
    for ref in appends:
        assert (ref["offset"], ref["encoding"], ref["rate"]) == (offset, "pcm16", 24000)
        offset += ref["bytes"] // 2
    deltas = [r for r in body if r.get("type") == "response.output_audio.delta"]
    assert deltas and all("audio" in r["event"] and "$audio" in r["event"]["audio"] for r in deltas)
    assert sum(r["event"]["audio"]["$audio"]["bytes"] for r in deltas) == len(assistant) * 2
    assert "delta" not in json.dumps(body[0])  # no payload anywhere: audio is in the FLAC files only


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "duplex_gateway", "replay", *args],
        check=False,
        cwd=REPO,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=REPLAY_TIMEOUT_S,
    )


def test_replay_against_the_same_engine_is_equal(recorded: RecordedCall, tmp_path: Path) -> None:
    out, kept = tmp_path / "diff.json", tmp_path / "kept"
    result = replay(
        str(recorded.folder),
        "--engine",
        "echo",
        "--config",
        str(recorded.config),
        "--out",
        str(out),
        "--keep",
        str(kept),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "event sequence: SAME" in result.stdout
    assert "first audio latency" in result.stdout
    diff = json.loads(out.read_text(encoding="utf-8"))
    assert diff["equal"] is True and diff["diff"] == []
    assert diff["recorded"]["sequence"] == diff["replayed"]["sequence"]
    assert "input_audio_buffer.speech_started item_id=item#1" in diff["recorded"]["sequence"]
    assert diff["timings"]["first_audio_latency_s"]["recorded"] is not None
    assert diff["timings"]["matched_events"] == len(diff["recorded"]["sequence"])
    # The new run's own recording, kept where asked.
    assert [p.name for p in kept.iterdir()] == [Path(diff["replay_recording"]).name]


def test_replay_against_another_configuration_differs(recorded: RecordedCall, tmp_path: Path) -> None:
    # Without turn detection nobody ends the caller's turn: no reply, and replay says so.
    config = tmp_path / "no-vad.yaml"
    config.write_text(
        yaml.safe_dump({**BASE_CONFIG, "session": {"turn_detection": "none"}}), encoding="utf-8"
    )
    out = tmp_path / "diff.json"
    result = replay(str(recorded.folder), "--engine", "echo", "--config", str(config), "--out", str(out))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "event sequence: DIFFERENT" in result.stdout
    assert "-input_audio_buffer.speech_started item_id=item#1" in result.stdout
    assert "-response.created" in result.stdout
    diff = json.loads(out.read_text(encoding="utf-8"))
    assert diff["equal"] is False and diff["diff"]


def test_replay_of_a_tampered_recording_differs(recorded: RecordedCall, tmp_path: Path) -> None:
    # Take the refused frame out: the replayed session has no error to report.
    folder = tmp_path / recorded.folder.name
    shutil.copytree(recorded.folder, folder)
    lines = (folder / "events.jsonl").read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if '"commands":[]' not in line]
    assert len(kept) == len(lines) - 1
    (folder / "events.jsonl").write_text("\n".join(kept) + "\n", encoding="utf-8")
    result = replay(str(folder), "--engine", "echo", "--config", str(recorded.config))
    assert result.returncode == 1, result.stdout + result.stderr
    assert "-error code=unknown_event" in result.stdout or "-error code=" in result.stdout


def test_nothing_is_written_unless_asked_and_a_key_can_ask(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    directory = tmp_path / "recordings"
    gw = gateway_factory.start(
        {
            **BASE_CONFIG,
            "recording": {"enabled": False, "directory": str(directory)},
            "auth": {
                "keys": [
                    {"name": "recorded", "key": "sk-rec", "record": True},
                    {"name": "plain", "key": "sk-plain"},
                ]
            },
        }
    )

    async def session(key: str) -> None:
        async with ws_connect(gw, additional_headers={"Authorization": f"Bearer {key}"}) as ws:
            log = EventLog(ws.recv)
            await log.wait_for("session.created")
            await send_json(ws, {"type": "input_audio_buffer.append", "audio": ""})
            await ws.close()
            await log.aclose()

    asyncio.run(session("sk-plain"))
    asyncio.run(gw.wait_sessions(0))
    time.sleep(0.3)
    assert not directory.exists()  # recording off and the key does not ask: not even the folder
    asyncio.run(session("sk-rec"))
    folders = finished(directory)
    assert len(folders) == 1
    assert log_of(folders[0])[0]["key"] == "recorded"


def test_retention_deletes_the_oldest(gateway_factory: GatewayFactory, tmp_path: Path) -> None:
    directory = tmp_path / "recordings"
    gw = gateway_factory.start(
        {
            **BASE_CONFIG,
            "recording": {"enabled": True, "directory": str(directory), "retention": {"max_recordings": 2}},
        }
    )

    async def session() -> str:
        async with ws_connect(gw) as ws:
            log = EventLog(ws.recv)
            _, created = await log.wait_for("session.created")
            await ws.close()
            await log.aclose()
            return str(created["session"]["id"])

    ids = []
    for count in (1, 2, 3):
        ids.append(asyncio.run(session()))
        # The third may be seen finished before its writer swept the oldest (it sweeps right after).
        assert len(finished(directory, min(count, 2))) in ((count,) if count < 3 else (2, 3))
    deadline = time.monotonic() + 5  # the third writer sweeps once it has finished
    while len(left := sorted(p.name for p in directory.iterdir())) > 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(left) == 2, left
    assert [name.split("Z_", 1)[1] for name in left] == ids[1:]
