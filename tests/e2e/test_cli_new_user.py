"""What a new user does first: ``duplex-gateway serve --engine echo``, then talk to it.

Runs the installed console script (``.venv/bin/duplex-gateway``) with no config file,
streams a WAV read with soundfile (pcm16, 16 kHz, as recorded) and checks the echo:
the reply is the caller's own speech, resampled to the session's 24 kHz output.
Also: a config file with a typo makes ``serve`` exit non-zero and name the key; a port in use is
said in one line before any model loads; ``call`` says in one line, before it connects where it
can, that its file is missing or not audio, that ``--out`` cannot be written, that the file holds
no speech (closing the session so the gateway keeps none for a resume) or that nothing listens.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr

from tests.e2e.helpers import (
    CONSOLE_SCRIPT,
    REPO,
    SPEECH_WAV,
    EventLog,
    GatewayFactory,
    audio_of,
    duration_ms,
    free_port,
    gateway_env,
    send_json,
    stream_audio,
    wait_answered_turn,
    ws_connect,
)

pytestmark = pytest.mark.e2e


def _best_correlation(reply: np.ndarray, reference: np.ndarray) -> float:
    """Peak normalised cross-correlation of ``reply`` inside ``reference`` (FFT, any lag)."""
    n = len(reply) + len(reference)
    size = 1 << (n - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(reference, size) * np.conj(np.fft.rfft(reply, size)), size)
    lag = int(np.argmax(corr[: len(reference)]))
    window = reference[lag : lag + len(reply)]
    m = min(len(window), len(reply))
    a, b = reply[:m], window[:m]
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-9))


async def test_serve_echo_and_stream_a_wav(gateway_factory: GatewayFactory) -> None:
    assert CONSOLE_SCRIPT.exists(), CONSOLE_SCRIPT
    gw = gateway_factory.start(None, console_script=True, args=["--engine", "echo"], name="cli")
    assert gw.readyz()["engine"] == "echo"

    pcm, rate = sf.read(SPEECH_WAV, dtype="int16")
    assert rate == 16000 and pcm.ndim == 1
    pad = np.zeros(rate, dtype=np.int16)  # 1 s of silence either side, as a recording would have
    stream = np.concatenate([pad, pcm, pad]).astype("<i2").tobytes()

    async with ws_connect(gw, "/v1/realtime") as ws:
        log = EventLog(ws.recv)
        try:
            _, created = await log.wait_for("session.created", 5)
            # Defaults: pcm16 at 24 kHz both ways, server VAD on.
            assert created["session"]["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 24000}
            assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"
            await send_json(
                ws,
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}},
                    },
                },
            )
            _, updated = await log.wait_for("session.updated", 5)
            assert updated["session"]["audio"]["input"]["format"]["rate"] == rate
            await stream_audio(ws, stream, frame_ms=20, rate=rate, speed=1.4, lead_ms=1500, timeout=20)
            turn = await wait_answered_turn(log, 5, done_timeout=15)
            started, stopped = turn.started, turn.stopped
            assert turn.done["response"]["status"] == "completed", turn.done
            deltas = [e for e in turn.reply_events if e["type"] == "response.output_audio.delta"]
            assert deltas and {d.get("sample_rate_hz", 24000) for d in deltas} == {24000}
            reply = audio_of(turn.reply_events, turn.response_id)
        finally:
            await log.aclose()

    reply_ms = duration_ms(reply, 24000)
    turn_ms = stopped["audio_end_ms"] - started["audio_start_ms"]
    assert abs(reply_ms - turn_ms) <= 600, (reply_ms, turn_ms)
    assert 2500 <= reply_ms <= 5500, reply_ms
    # The echo is the caller's own speech: compare with the WAV resampled to 24 kHz.
    reference = soxr.resample(np.concatenate([pad, pcm, pad]).astype(np.float32) / 32768, rate, 24000)
    reply_f = np.frombuffer(reply, dtype="<i2").astype(np.float32) / 32768
    assert np.sqrt(np.mean(reply_f**2)) > 0.01, "the reply is silent"
    similarity = await asyncio.to_thread(_best_correlation, reply_f, reference.astype(np.float32))
    assert similarity > 0.9, f"the echo does not sound like the caller (correlation {similarity:.3f})"
    await gw.wait_sessions(0)


BAD_CONFIGS = {
    "unknown_nested_key": ("limits:\n  max_sesions: 3\n", ["max_sesions"]),
    "unknown_top_level_key": ("servr:\n  port: 9000\n", ["servr"]),
    "bad_value": ("limits:\n  max_sessions: 0\n", ["limits.max_sessions"]),
    "unknown_engine": ("engine:\n  name: no-such-engine\n", ["engine.name", "no-such-engine"]),
}


def test_bad_config_exits_non_zero_and_names_the_key(tmp_path: Path) -> None:
    procs = {}
    for name, (text, _) in BAD_CONFIGS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text, encoding="utf-8")
        cmd = [
            str(CONSOLE_SCRIPT),
            "serve",
            "--config",
            str(path),
            "--port",
            str(free_port()),
            "--host",
            "127.0.0.1",
        ]
        procs[name] = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=gateway_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
    failures = []
    for name, proc in procs.items():
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=5)
            failures.append(f"{name}: still running after 30 s (it started a server on a bad config)")
            continue
        stderr = err.decode(errors="replace")
        if proc.returncode == 0:
            failures.append(f"{name}: exit code 0")
        failures.extend(
            f"{name}: stderr does not name {needle!r}: {stderr[-500:]!r}"
            for needle in BAD_CONFIGS[name][1]
            if needle not in stderr
        )
        if "Traceback" in stderr:
            failures.append(f"{name}: a traceback instead of a message: {stderr[-1500:]}")
    assert not failures, "\n".join(failures)


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = subprocess.run(
        [str(CONSOLE_SCRIPT), "serve", "--config", str(missing), "--port", str(free_port())],
        cwd=REPO,
        env=gateway_env(),
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    assert proc.returncode != 0
    stderr = proc.stderr.decode(errors="replace")
    assert str(missing) in stderr and "Traceback" not in stderr, stderr


def _one_line_failure(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The single stderr line a failed command printed; it names every needle, and no traceback."""
    assert proc.returncode != 0, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def _run(args: list[str], cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(CONSOLE_SCRIPT), *args],
        cwd=cwd,
        env=gateway_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )


def test_serve_on_a_port_in_use_says_so_before_loading_anything() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # The default engine (embedded) takes seconds to load its models: none of it may run first.
        proc = _run(["serve", "--port", str(port), "--host", "127.0.0.1"])
    _one_line_failure(proc, f"port {port}", "already in use", "--port")
    assert "INFO" not in proc.stderr


def test_call_reports_bad_files_before_it_connects(tmp_path: Path) -> None:
    (tmp_path / "notes.wav").write_text("not audio", encoding="utf-8")
    sf.write(tmp_path / "ok.wav", np.zeros(1600, np.int16), 16000, subtype="PCM_16")
    # Nothing listens at this URL: a message about the file proves the call checked it first.
    url = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    cases = {
        "nope.wav": (["nope.wav"], ["no such file", "nope.wav"]),
        "not audio": (["notes.wav"], ["cannot read notes.wav as audio", "Format not recognised"]),
        "a folder": ([str(tmp_path)], ["is a folder"]),
        "--out into a missing folder": (
            ["ok.wav", "--out", "missing/reply.wav"],
            ["missing/reply.wav", "no folder"],
        ),
        "nothing listening": (["ok.wav"], ["cannot reach the gateway", url, "is it running"]),
    }
    for name, (args, needles) in cases.items():
        proc = _run(["call", *args, "--url", url, "--timeout", "10"], cwd=tmp_path)
        try:
            _one_line_failure(proc, *needles)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from None
    assert not (tmp_path / "missing").exists()


async def test_call_on_a_file_without_speech_ends_at_once_and_leaves_no_session(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    # Resumable sessions, as by default: a call that only drops its socket would stay parked 30 s.
    gw = gateway_factory.start({"limits": {"resume_grace_s": 30}}, name="call-no-speech")
    noise = np.random.default_rng(7).normal(0, 30, 16000 * 2).astype(np.int16)  # 2 s of faint hiss
    sf.write(tmp_path / "quiet.wav", noise, 16000, subtype="PCM_16")
    proc = await asyncio.to_thread(
        _run, ["call", "quiet.wav", "--url", f"{gw.ws_url}/v1/realtime", "--timeout", "60"], tmp_path, 60
    )
    line = _one_line_failure(proc, "no speech heard in quiet.wav")
    assert "2.0 s of audio" in line, line
    body = await gw.wait_sessions(0, timeout=5)
    assert body["sessions"] == 0
    assert "client_closed (1000)" in gw.stderr()


async def test_call_saves_the_reply(gateway_factory: GatewayFactory, tmp_path: Path) -> None:
    gw = gateway_factory.start({"engine": {"name": "echo"}}, name="call-reply")
    pcm, rate = sf.read(SPEECH_WAV, dtype="int16")
    sf.write(tmp_path / "hello.wav", pcm, rate, subtype="PCM_16")
    proc = await asyncio.to_thread(
        _run, ["call", "hello.wav", "--url", f"{gw.ws_url}/v1/realtime", "--out", "reply.wav"], tmp_path, 60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reply completed" in proc.stdout and "reply audio written to reply.wav" in proc.stdout
    reply, reply_rate = sf.read(tmp_path / "reply.wav", dtype="int16")
    assert reply_rate == 24000 and len(reply) > reply_rate, (reply_rate, len(reply))


async def test_call_commits_the_turn_itself_when_the_gateway_detects_none(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory.start({"session": {"turn_detection": "none"}}, name="call-no-vad")
    pcm, rate = sf.read(SPEECH_WAV, dtype="int16")
    sf.write(tmp_path / "hello.wav", pcm, rate, subtype="PCM_16")
    proc = await asyncio.to_thread(
        _run, ["call", "hello.wav", "--url", f"{gw.ws_url}/v1/realtime", "--timeout", "30"], tmp_path, 60
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "reply completed" in proc.stdout, proc.stdout
    await gw.wait_sessions(0)


async def test_call_with_a_wrong_key_says_the_gateway_refused_it(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory.start({"auth": {"keys": [{"name": "caller", "key": "sk-right"}]}}, name="call-key")
    sf.write(tmp_path / "ok.wav", np.zeros(1600, np.int16), 16000, subtype="PCM_16")
    url = f"{gw.ws_url}/v1/realtime"
    for args in ([], ["--api-key", "sk-wrong"]):
        proc = await asyncio.to_thread(_run, ["call", "ok.wav", "--url", url, *args], tmp_path, 30)
        _one_line_failure(proc, f"the gateway at {url} refused the connection: HTTP 401: ", "--api-key")
