"""End-to-end latency of the gateway with the ``embedded`` CPU engine, and each model's real-time factor.

Run from the repository root::

    .venv/bin/python benchmarks/latency.py [--sessions 1 4] [--turns 5] [--out docs/performance.md]

What it does, bounded in time (a few minutes on 2 cores) and stopping by itself:

1. Starts a real gateway (``python -m duplex_gateway serve``, engine ``embedded``) on a free
   loopback port with a temporary YAML config, waits for ``/readyz`` and always stops it.
2. For each concurrency level: that many WebSocket clients (started at random moments
   within the first second) each do one unmeasured warm-up turn, then ``--turns`` turns.
   A turn is 1 s of silence, the speech fixture (4.39 s, "Please send me the weather report
   for Tuesday morning.") and 1 s of silence, sent as pcm16 at 24 kHz in 20 ms frames at
   real time; the client keeps streaming silence (an open microphone) until
   ``response.done``. Per turn it records, from the end of the caller's speech:
   the first reply audio, the final caller transcript, and the ``speech_stopped`` event.
3. Times each model in-process (load once, warm, median of several runs): Silero VAD,
   pocketsphinx partials, Whisper tiny.en and Piper.
4. Prints the results and writes them as markdown to ``--out``.

"End of caller speech" is defined as in ``duplex_gateway/call.py``: the server's
``speech_stopped.audio_end_ms`` minus ``silence_duration_ms``, placed on the client's
real-time send clock (the wall time at which the 20 ms frame holding that instant of
audio was sent). Because the server can only notice the end of speech after
``silence_duration_ms`` of silence, that wait is part of every latency measured this way.

``--set engine.embedded.partials=false`` (repeatable) overrides any config key of the
gateway under test, for A/B runs.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import random
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.fixtures import SPEECH_END_MS, SPEECH_START_MS, load_speech

FRAME_MS = 20
INPUT_RATE = 24_000
LEAD_SILENCE_MS = 1_000
TAIL_SILENCE_MS = 1_000
FIXTURE_S = 4.39
KEYWORD = "weather"
TARGET_P50_MS = 700.0
READY_TIMEOUT_S = 180.0
TURN_TIMEOUT_S = 45.0
#: A two-sentence reply of the kind the engine gives (the restating responder plus an intent).
PIPER_TEXT = "You said: please send me the weather report for Tuesday morning. It's 10:30 AM UTC."

AUDIO_DELTAS = ("response.output_audio.delta", "response.audio.delta")
TRANSCRIPT_DONE = "conversation.item.input_audio_transcription.completed"


# -- the gateway process ---------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _parse_value(text: str) -> Any:
    return yaml.safe_load(text)


def gateway_config(max_concurrency: int, overrides: Sequence[str]) -> dict[str, Any]:
    config: dict[str, Any] = {
        "server": {"log_level": "warning", "web_demo": False},
        "limits": {"max_sessions": max(8, max_concurrency + 2)},
        "engine": {"name": "embedded", "embedded": {"max_sessions": max(8, max_concurrency + 2)}},
    }
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set wants KEY=VALUE, got {item!r}")
        node = config
        *parents, leaf = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = _parse_value(value)
    return config


class GatewayProcess:
    """``python -m duplex_gateway serve`` on a free loopback port; a context manager that always stops it."""

    def __init__(self, config: dict[str, Any], workdir: Path) -> None:
        self.port = free_port()
        self.config_path = workdir / "gateway.yaml"
        self.config_path.write_text(yaml.safe_dump(config), encoding="utf-8")
        self.log_path = workdir / "gateway.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s = 0.0

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/realtime"

    def __enter__(self) -> Self:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
        env["HF_HUB_OFFLINE"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        cmd = [sys.executable, "-m", "duplex_gateway", "serve", "--config", str(self.config_path),
               "--port", str(self.port), "--host", "127.0.0.1"]
        started = time.perf_counter()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.started_s = time.perf_counter() - started
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode} before /readyz:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"gateway not ready after {READY_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


# -- one client ------------------------------------------------------------------------------


@dataclass
class Turn:
    """What one caller turn measured (wall times are time.monotonic())."""

    session: int
    index: int
    warmup: bool
    start_ms: int  # where the turn's audio starts on the session's input clock
    silence_ms: int  # the session's turn_detection.silence_duration_ms
    speech_starts: int = 0
    in_speech: bool = False
    audio_start_ms: int | None = None
    audio_end_ms: int | None = None
    stopped_wall: float | None = None
    transcript: str = ""
    transcript_wall: float | None = None
    created_wall: float | None = None
    first_audio_wall: float | None = None
    reply_audio_bytes: int = 0
    done_wall: float | None = None
    status: str | None = None
    errors: list[str] = field(default_factory=list)
    # Filled in at the end.
    speech_end_wall: float | None = None  # by the server's VAD (the call.py definition)
    true_end_wall: float | None = None  # when the fixture's last speech sample was sent

    @property
    def true_speech_end_ms(self) -> int:
        return self.start_ms + LEAD_SILENCE_MS + SPEECH_END_MS

    def since_end_ms(self, wall: float | None) -> float | None:
        if wall is None or self.speech_end_wall is None:
            return None
        return (wall - self.speech_end_wall) * 1000.0

    def since_true_end_ms(self, wall: float | None) -> float | None:
        if wall is None or self.true_end_wall is None:
            return None
        return (wall - self.true_end_wall) * 1000.0

    @property
    def heard_keyword(self) -> bool:
        return KEYWORD in self.transcript.lower()


class Client:
    """One caller: a WebSocket session that streams its microphone at real time for all its turns."""

    def __init__(self, url: str, number: int, segment: bytes, silence_ms: int) -> None:
        self.url = url
        self.number = number
        self.segment = segment
        self.frame_bytes = INPUT_RATE * FRAME_MS // 1000 * 2
        self.silence_frame = bytes(self.frame_bytes)
        self.silence_ms = silence_ms
        self.pending = bytearray()
        self.sent_at: list[float] = []  # wall time after frame i (audio [20i, 20i+20) ms) went out
        self.send_lag_ms: list[float] = []  # how late frame i went out against the real-time schedule
        self.turn: Turn | None = None
        self.turns: list[Turn] = []
        self.changed = asyncio.Event()

    async def run(self, turns: int, warmup: int, stagger_s: float) -> list[Turn]:
        import websockets

        await asyncio.sleep(stagger_s)
        async with websockets.connect(self.url, max_size=None, open_timeout=30) as ws:
            created = json.loads(await asyncio.wait_for(ws.recv(), 30))
            if created.get("type") == "error":
                raise RuntimeError(f"session {self.number} refused: {created['error']}")
            detection = created.get("session", {}).get("audio", {}).get("input", {}).get("turn_detection")
            if isinstance(detection, dict):
                self.silence_ms = int(detection.get("silence_duration_ms", self.silence_ms))
            await ws.send(json.dumps({
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {
                        "input": {"format": {"type": "audio/pcm", "rate": INPUT_RATE},
                                  "transcription": {"model": "whisper-1"}},
                        "output": {"format": {"type": "audio/pcm", "rate": 24_000}},
                    },
                },
            }))
            while True:
                event = json.loads(await asyncio.wait_for(ws.recv(), 30))
                if event.get("type") == "session.updated":
                    break
                if event.get("type") == "error":
                    raise RuntimeError(f"session.update refused: {event['error']}")
            sender = asyncio.create_task(self._send(ws))
            receiver = asyncio.create_task(self._receive(ws))
            try:
                for index in range(warmup + turns):
                    await self._one_turn(index - warmup, warmup=index < warmup)
                    if sender.done() or receiver.done():
                        break
            finally:
                sender.cancel()
                receiver.cancel()
                for task in (sender, receiver):
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
        for turn in self.turns:
            if turn.audio_end_ms is not None:
                turn.speech_end_wall = self._sent_wall(turn.audio_end_ms - self.silence_ms)
            turn.true_end_wall = self._sent_wall(turn.true_speech_end_ms)
        return self.turns

    def _sent_wall(self, audio_ms: int) -> float | None:
        """When the frame holding the last millisecond before ``audio_ms`` went out."""
        frame = max(0, -(-audio_ms // FRAME_MS) - 1)
        return self.sent_at[frame] if frame < len(self.sent_at) else None

    async def _one_turn(self, index: int, *, warmup: bool) -> None:
        start_ms = (len(self.sent_at) + len(self.pending) // self.frame_bytes) * FRAME_MS
        turn = Turn(session=self.number, index=index, warmup=warmup, start_ms=start_ms,
                    silence_ms=self.silence_ms)
        self.turn = turn
        self.turns.append(turn)
        self.pending += self.segment
        segment_end_frame = start_ms // FRAME_MS + len(self.segment) // self.frame_bytes
        loop = asyncio.get_running_loop()
        deadline = loop.time() + len(self.segment) / 2 / INPUT_RATE + TURN_TIMEOUT_S
        while True:
            sent_all = len(self.sent_at) >= segment_end_frame
            replied = turn.done_wall is not None and not turn.in_speech
            if sent_all and replied:
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                turn.errors.append("timeout waiting for response.done")
                return
            self.changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.1))

    async def _send(self, ws: Any) -> None:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        frame_no = 0
        while True:
            if self.pending:
                chunk = bytes(self.pending[: self.frame_bytes])
                del self.pending[: self.frame_bytes]
            else:
                chunk = self.silence_frame
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(chunk).decode()}))
            self.sent_at.append(time.monotonic())
            self.send_lag_ms.append(max(0.0, loop.time() - (t0 + frame_no * FRAME_MS / 1000)) * 1000)
            frame_no += 1
            delay = t0 + frame_no * FRAME_MS / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    async def _receive(self, ws: Any) -> None:
        async for message in ws:
            now = time.monotonic()
            event = json.loads(message)
            kind = event.get("type", "")
            turn = self.turn
            if turn is None:
                continue
            if kind == "input_audio_buffer.speech_started":
                turn.speech_starts += 1
                turn.in_speech = True
                turn.audio_start_ms = event.get("audio_start_ms")
                turn.first_audio_wall = None  # a split turn: measure the reply to its last part
                turn.done_wall = None
            elif kind == "input_audio_buffer.speech_stopped":
                turn.in_speech = False
                turn.audio_end_ms = int(event["audio_end_ms"])
                turn.stopped_wall = now
            elif kind == TRANSCRIPT_DONE:
                turn.transcript = event.get("transcript", "")
                turn.transcript_wall = now
            elif kind == "response.created":
                turn.created_wall = now
            elif kind in AUDIO_DELTAS:
                if turn.first_audio_wall is None and turn.stopped_wall is not None:
                    turn.first_audio_wall = now
                turn.reply_audio_bytes += len(event.get("delta", "")) * 3 // 4
            elif kind == "response.done":
                turn.status = event.get("response", {}).get("status")
                turn.done_wall = now
            elif kind == "error":
                error = event.get("error", {})
                turn.errors.append(f"{error.get('code')}: {error.get('message')}")
            self.changed.set()


def turn_segment() -> bytes:
    speech = load_speech(INPUT_RATE)
    audio = np.concatenate([
        np.zeros(INPUT_RATE * LEAD_SILENCE_MS // 1000, np.float32),
        speech,
        np.zeros(INPUT_RATE * TAIL_SILENCE_MS // 1000, np.float32),
    ])
    frame = INPUT_RATE * FRAME_MS // 1000
    audio = np.concatenate([audio, np.zeros((-audio.size) % frame, np.float32)])
    return bytes((np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes())


async def run_level(
    url: str, sessions: int, turns: int, warmup: int, rng: random.Random
) -> tuple[list[Turn], list[float]]:
    """Run one concurrency level; the turns and every frame's send lag (ms)."""
    segment = turn_segment()
    clients = [Client(url, number, segment, silence_ms=500) for number in range(sessions)]
    staggers = [rng.uniform(0.0, 1.0) for _ in clients]
    per_turn_s = len(segment) / 2 / INPUT_RATE + TURN_TIMEOUT_S
    async with asyncio.timeout(30 + (warmup + turns) * per_turn_s):
        results = await asyncio.gather(
            *(client.run(turns, warmup, stagger) for client, stagger in zip(clients, staggers, strict=True)),
            return_exceptions=True,
        )
    measured: list[Turn] = []
    lags: list[float] = []
    for client, result in zip(clients, results, strict=True):
        if isinstance(result, BaseException):
            print(f"  session {client.number} failed: {type(result).__name__}: {result}", file=sys.stderr)
            measured.extend(client.turns)
        else:
            measured.extend(result)
        lags.extend(client.send_lag_ms)
    return measured, lags


# -- statistics ----------------------------------------------------------------------------------


@dataclass
class Summary:
    count: int
    p50: float
    p95: float
    max: float

    def cells(self) -> list[str]:
        return [f"{self.p50:.0f}", f"{self.p95:.0f}", f"{self.max:.0f}"]


def summarize(values: Sequence[float | None]) -> Summary | None:
    data = [v for v in values if v is not None]
    if not data:
        return None
    arr = np.asarray(data, dtype=float)
    return Summary(len(data), float(np.percentile(arr, 50)), float(np.percentile(arr, 95)), float(arr.max()))


@dataclass
class LevelResult:
    sessions: int
    turns: list[Turn]
    wall_s: float
    send_lag_ms: list[float] = field(default_factory=list)

    @property
    def measured(self) -> list[Turn]:
        return [t for t in self.turns if not t.warmup]

    def metric(self, fn: Callable[[Turn], float | None]) -> Summary | None:
        return summarize([fn(t) for t in self.measured])


METRICS: list[tuple[str, Callable[[Turn], float | None]]] = [
    ("end of speech → first reply audio", lambda t: t.since_end_ms(t.first_audio_wall)),
    ("true end of speech (client clock) → first reply audio", lambda t: t.since_true_end_ms(t.first_audio_wall)),
    ("end of speech → final caller transcript", lambda t: t.since_end_ms(t.transcript_wall)),
    ("end of speech → `speech_stopped` received", lambda t: t.since_end_ms(t.stopped_wall)),
    ("`speech_stopped` → first reply audio",
     lambda t: None if t.first_audio_wall is None or t.stopped_wall is None
     else (t.first_audio_wall - t.stopped_wall) * 1000),
    ("final transcript → first reply audio",
     lambda t: None if t.first_audio_wall is None or t.transcript_wall is None
     else (t.first_audio_wall - t.transcript_wall) * 1000),
    ("VAD speech end − true speech end",
     lambda t: None if t.audio_end_ms is None
     else float(t.audio_end_ms - t.silence_ms - t.true_speech_end_ms)),
]


# -- model real-time factors (in-process) ---------------------------------------------------------


@dataclass
class ModelTiming:
    name: str
    what: str
    seconds: float  # median compute time
    audio_s: float
    runs: int
    load_s: float
    extra: str = ""

    @property
    def rtf(self) -> float:
        return self.seconds / self.audio_s if self.audio_s else float("nan")


def _median_time(fn: Callable[[], object], runs: int, before: Callable[[], object] | None = None) -> float:
    times = []
    for _ in range(runs):
        if before is not None:
            before()
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def measure_models(runs: int) -> list[ModelTiming]:
    from duplex_gateway.engine.embedded.asr import SAMPLE_RATE, FinalRecognizer, PartialRecognizerPool
    from duplex_gateway.engine.embedded.engine import default_workers
    from duplex_gateway.engine.embedded.tts import PiperSynthesizer, split_sentences
    from duplex_gateway.audio.vad import SileroVad

    cores = default_workers()
    speech16 = load_speech(SAMPLE_RATE)
    audio_s = speech16.size / SAMPLE_RATE
    pcm16 = (np.clip(speech16, -1, 1) * 32767).round().astype("<i2").tobytes()
    results: list[ModelTiming] = []

    # Silero VAD: the fixture in 20 ms chunks, as the gateway feeds it.
    started = time.perf_counter()
    stream = SileroVad.shared().stream()
    load = time.perf_counter() - started
    step = SAMPLE_RATE * FRAME_MS // 1000

    def vad() -> None:
        for offset in range(0, speech16.size, step):
            stream.process(speech16[offset : offset + step])

    stream.reset()
    vad()
    seconds = _median_time(vad, runs, before=stream.reset)
    results.append(ModelTiming("Silero VAD", "fixture in 20 ms chunks (1 intra-op thread)", seconds, audio_s,
                               runs, load))

    # pocketsphinx partials: the fixture in 100 ms chunks.
    started = time.perf_counter()
    pool = PartialRecognizerPool()
    recognizer = pool.acquire()
    load = time.perf_counter() - started
    chunk = SAMPLE_RATE // 10 * 2
    hyps: list[str] = []

    def partials() -> None:
        for offset in range(0, len(pcm16), chunk):
            text = recognizer.feed(pcm16[offset : offset + chunk])
            if text:
                hyps.append(text)

    partials()
    recognizer.reset()
    seconds = _median_time(partials, runs, before=recognizer.reset)
    results.append(ModelTiming("pocketsphinx partials", "fixture fed in 100 ms chunks", seconds, audio_s, runs,
                               load, extra=f"last partial: “{hyps[-1] if hyps else ''}”"))
    recognizer.reset()

    # Whisper tiny.en: the whole fixture as one turn.
    started = time.perf_counter()
    final = FinalRecognizer(cpu_threads=cores)
    load = time.perf_counter() - started
    final.warm()
    text = final.transcribe(speech16)
    seconds = _median_time(lambda: final.transcribe(speech16), runs)
    results.append(ModelTiming("Whisper tiny.en (int8)", f"whole fixture, cpu_threads={cores}", seconds, audio_s,
                               runs, load, extra=f"“{text}”"))

    # Piper: a two-sentence reply, sentence by sentence as the engine does.
    started = time.perf_counter()
    voice = PiperSynthesizer(threads=cores)
    load = time.perf_counter() - started
    voice.warm()
    sentences = split_sentences(PIPER_TEXT)
    first_pcm = voice.synthesize(sentences[0])
    total_bytes = sum(len(voice.synthesize(s)) for s in sentences)
    reply_s = total_bytes / 2 / voice.sample_rate
    first_s = len(first_pcm) / 2 / voice.sample_rate
    seconds = _median_time(lambda: [voice.synthesize(s) for s in sentences], runs)
    first = _median_time(lambda: voice.synthesize(sentences[0]), runs)
    results.append(ModelTiming("Piper (joe, medium)", f"{len(sentences)}-sentence reply, threads={cores}", seconds,
                               reply_s, runs, load))
    results.append(ModelTiming("Piper, first sentence only", f"“{sentences[0]}”", first, first_s, runs, 0.0,
                               extra="= time to first sentence: the engine's first audio waits for it"))
    return results


# -- report ---------------------------------------------------------------------------------------


def load_average() -> str:
    with contextlib.suppress(OSError, IndexError):
        return Path("/proc/loadavg").read_text(encoding="utf-8").split()[0]
    return "?"


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def render(
    levels: list[LevelResult],
    models: list[ModelTiming],
    *,
    command: str,
    config: dict[str, Any],
    gateway_start_s: float,
    total_s: float,
    load_before: str,
) -> str:
    from duplex_gateway.engine.embedded.engine import default_workers

    now = dt.datetime.now().astimezone()
    lines: list[str] = []
    add = lines.append
    add("# Performance: end-to-end latency and model speed (embedded CPU engine)")
    add("")
    add("Generated by `benchmarks/latency.py`; rerun it to refresh these numbers. All numbers below come")
    add("from one run on the machine described here.")
    add("")
    add(f"- **Date:** {now:%Y-%m-%d %H:%M %Z}")
    add(f"- **Machine:** {os.cpu_count()} logical cores (usable: {default_workers()}), CPU: {cpu_model()}; "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}")
    add(f"- **Command:** `{command}`")
    add(f"- **Gateway config** (the rest are the defaults in `configs/default.yaml`): "
        f"`{json.dumps(config, separators=(',', ':'))}`")
    add(f"- Gateway start to `/readyz` (models loaded and warmed): {gateway_start_s:.1f} s; whole run {total_s:.0f} s.")
    add(f"- 1-minute load average at the start / end of the run: {load_before} / {load_average()} "
        "(anything above 0 at the start is other work sharing these cores; numbers move with it).")
    add("- The clients run on the same cores as the gateway, over loopback.")
    add("")
    add("## End-to-end latency")
    add("")
    add("Each session streams 1 s silence + the 4.39 s fixture (“Please send me the weather report for Tuesday")
    add("morning.”) + 1 s silence as pcm16 at 24 kHz in 20 ms frames at real time, keeps streaming silence")
    add("until `response.done`, and repeats. Sessions start at random moments within the first second. One")
    add("warm-up turn per session is not counted. Milliseconds; p95 of a handful of turns is close to the max.")
    add("")
    header = "| metric (ms) |"
    rule = "|---|"
    for level in levels:
        header += f" {level.sessions} session{'s' if level.sessions > 1 else ''}: p50 | p95 | max |"
        rule += "---:|---:|---:|"
    add(header)
    add(rule)
    for name, fn in METRICS:
        row = f"| {name} |"
        for level in levels:
            summary = level.metric(fn)
            row += (" " + " | ".join(summary.cells()) + " |") if summary else " – | – | – |"
        add(row)
    row = "| turns measured (replies completed) |"
    for level in levels:
        done = sum(1 for t in level.measured if t.status == "completed")
        row += f" {len(level.measured)} ({done}) | | |"
    add(row)
    row = f"| final transcript contains “{KEYWORD}” |"
    for level in levels:
        hits = sum(1 for t in level.measured if t.heard_keyword)
        row += f" {hits}/{len(level.measured)} | | |"
    add(row)
    row = "| turns split by the VAD |"
    for level in levels:
        split = sum(1 for t in level.measured if t.speech_starts > 1)
        row += f" {split} | | |"
    add(row)
    row = "| error events received, warm-up turns included (by code) |"
    for level in levels:
        errors = [e for t in level.turns for e in t.errors]
        row += f" {error_counts(errors) or 0} | | |"
    add(row)
    row = "| client send lag behind real time (ms) |"
    for level in levels:
        lag = summarize(level.send_lag_ms)
        row += (" " + " | ".join(lag.cells()) + " |") if lag else " – | – | – |"
    add(row)
    add("")
    if levels and levels[0].sessions == 1:
        first = levels[0].metric(METRICS[0][1])
        if first is not None:
            verdict = "meets" if first.p50 <= TARGET_P50_MS else "misses"
            add(f"**Target:** p50 end of speech → first reply audio ≤ {TARGET_P50_MS:.0f} ms for one session. "
                f"This run: {first.p50:.0f} ms, which **{verdict}** it.")
            add("")
    transcripts = sorted({t.transcript for level in levels for t in level.measured if t.transcript})
    if transcripts:
        add("Final transcripts heard: " + "; ".join(f"“{t}”" for t in transcripts[:5]))
        add("")
    add("What the rows mean (all measured at the client):")
    add("")
    add("- *End of speech* is the server's `speech_stopped.audio_end_ms` minus `silence_duration_ms`")
    add("  (the same definition as `duplex-gateway call`), placed on the client's send clock: the wall time")
    add("  the 20 ms frame holding that instant was sent. The server can only decide that speech ended after")
    add("  `silence_duration_ms` (500 ms by default) of silence, so that wait is **inside** every “end of")
    add("  speech → …” number; `speech_stopped` → first reply audio is what the engine and gateway add after")
    add("  the turn is detected.")
    add("- *First reply audio*: arrival of the first `response.output_audio.delta`. The engine must first")
    add("  transcribe the turn (Whisper), build the reply text and synthesize its first sentence (Piper).")
    add("- *True end of speech (client clock)*: when the client sent the frame holding the fixture's last")
    add("  speech sample (3386 ms into the file). It needs no server clock, so it stays right when the")
    add("  server drops audio (`input_rate_exceeded`), which moves the server's input clock and with it the")
    add("  VAD-based rows.")
    add("- *Final caller transcript*: arrival of `conversation.item.input_audio_transcription.completed`.")
    add("- *VAD speech end − true speech end*: where the VAD put the end of speech relative to where the")
    add("  fixture's speech really ends (3386 ms into the file); positive means the VAD ends late. Far off")
    add("  zero (negative) when the server dropped audio: then trust the *true end of speech* row.")
    add("- *Client send lag*: how late the clients' frames went out against the real-time schedule (a starved")
    add("  client sends in bursts, which the server's rate limit may refuse).")
    add("")
    add("## Model speed (in-process, same machine)")
    add("")
    add("Each model is loaded once, warmed, then timed; median of several runs, one at a time with nothing")
    add("else running (the gateway is stopped by then). RTF = compute time / audio duration (below 1 is faster")
    add("than real time).")
    add("")
    add("| model | what | median time (ms) | audio (s) | RTF | load (s) | notes |")
    add("|---|---|---:|---:|---:|---:|---|")
    for m in models:
        load = f"{m.load_s:.2f}" if m.load_s else ""
        add(f"| {m.name} | {m.what} | {m.seconds * 1000:.0f} | {m.audio_s:.2f} | {m.rtf:.3f} | {load} | "
            f"{m.extra} |")
    add("")
    return "\n".join(lines)


def error_counts(errors: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for error in errors:
        code = error.split(":", 1)[0]
        counts[code] = counts.get(code, 0) + 1
    return ", ".join(f"{code} ×{n}" for code, n in sorted(counts.items()))


def vad_offsets(turn: Turn) -> str:
    """Where the VAD put the turn's start (less its prefix padding: the onset) and end, against the fixture."""
    base = turn.start_ms + LEAD_SILENCE_MS
    start = "-" if turn.audio_start_ms is None else f"{turn.audio_start_ms - base - SPEECH_START_MS:+d}"
    end = "-" if turn.audio_end_ms is None else f"{turn.audio_end_ms - turn.silence_ms - base - SPEECH_END_MS:+d}"
    return f"{start}/{end}"


def print_turns(level: LevelResult) -> None:
    for t in level.turns:
        def ms(v: float | None) -> str:
            return "   -" if v is None else f"{v:5.0f}"

        tag = "warm" if t.warmup else f"t{t.index}"
        print(f"  s{t.session} {tag:>4}: first audio {ms(t.since_end_ms(t.first_audio_wall))} ms, "
              f"transcript {ms(t.since_end_ms(t.transcript_wall))} ms, "
              f"stopped {ms(t.since_end_ms(t.stopped_wall))} ms, "
              f"VAD start/end vs fixture {vad_offsets(t)} ms, status {t.status}, "
              f"“{t.transcript}”{' errors: ' + error_counts(t.errors) if t.errors else ''}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 4], help="concurrency levels")
    parser.add_argument("--turns", type=int, default=5, help="measured turns per session")
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured turns per session first")
    parser.add_argument("--runs", type=int, default=5, help="runs per model for the real-time factors")
    parser.add_argument("--out", default="docs/performance.md", help="markdown report ('' to skip)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the start stagger")
    parser.add_argument("--skip-models", action="store_true", help="skip the in-process model timings")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a gateway config key, e.g. engine.embedded.partials=false")
    args = parser.parse_args(argv)
    if any(n < 1 for n in args.sessions) or args.turns < 1:
        parser.error("--sessions and --turns must be positive")

    command = shlex.join([".venv/bin/python", "benchmarks/latency.py", *(sys.argv[1:] if argv is None else argv)])
    started = time.perf_counter()
    load_before = load_average()
    rng = random.Random(args.seed)
    config = gateway_config(max(args.sessions), args.set)
    levels: list[LevelResult] = []
    with tempfile.TemporaryDirectory(prefix="duplex-bench-") as tmp:
        print("starting gateway (engine embedded) ...", flush=True)
        with GatewayProcess(config, Path(tmp)) as gateway:
            print(f"gateway ready on port {gateway.port} after {gateway.started_s:.1f} s", flush=True)
            for sessions in args.sessions:
                print(f"{sessions} concurrent session(s), {args.warmup} warm-up + {args.turns} turns each ...",
                      flush=True)
                level_started = time.perf_counter()
                turns: list[Turn] = []
                lags: list[float] = []
                try:
                    turns, lags = asyncio.run(run_level(gateway.ws_url, sessions, args.turns, args.warmup, rng))
                except TimeoutError:
                    print(f"  level {sessions} timed out\n{gateway.log_tail()}", file=sys.stderr)
                level = LevelResult(sessions, turns, time.perf_counter() - level_started, lags)
                levels.append(level)
                print_turns(level)
            gateway_start_s = gateway.started_s
            log = gateway.log_tail(20_000)
        if "Traceback" in log:
            print(f"gateway log has a traceback:\n{log[-3000:]}", file=sys.stderr)
    models: list[ModelTiming] = []
    if not args.skip_models:
        print("timing the models in-process ...", flush=True)
        models = measure_models(args.runs)
    report = render(levels, models, command=command, config=config, gateway_start_s=gateway_start_s,
                    total_s=time.perf_counter() - started, load_before=load_before)
    print()
    print(report)
    if args.out:
        out = Path(args.out)
        if not out.is_absolute():
            out = REPO / out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(report, encoding="utf-8")
        print(f"\nwritten to {out}")
    ok = all(level.measured and all(t.first_audio_wall is not None for t in level.measured) for level in levels)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
