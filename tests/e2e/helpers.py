"""End-to-end helpers: a REAL gateway process on loopback, and clients' helpers.

``gateway_factory`` / ``module_gateway_factory`` start ``python -m duplex_gateway serve``
(or the ``duplex-gateway`` console script) as a subprocess with a temporary YAML
config on a free port, wait for ``/readyz`` and stop it with SIGTERM (SIGKILL after
10 s). The server's stderr goes to a file; any ``Traceback`` in it fails the test
during which it appeared (or the module teardown, for what is logged at shutdown):
the gateway must never crash on bad input.

Audio helpers load ``tests/fixtures/speech_16k.wav`` at any rate / wire format and
stream it in frames paced at (a multiple of) real time.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import soundfile as sf
import soxr
import yaml

REPO = Path(__file__).resolve().parents[2]
SPEECH_WAV = REPO / "tests" / "fixtures" / "speech_16k.wav"
VENV_BIN = Path(sys.executable).parent
PYTHON = sys.executable
CONSOLE_SCRIPT = VENV_BIN / "duplex-gateway"

# The embedded engine loads Whisper and Piper before it is ready: 16 s on a busy 2-core machine.
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

# Every gateway started by a GatewayFactory, for the per-test log check (conftest).
_RUNNING: list[Gateway] = []


# ---------------------------------------------------------------------------------------
# The gateway process


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUPLEX_GATEWAY_")}
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Gateway:
    """One running gateway process."""

    port: int
    proc: subprocess.Popen[bytes]
    stderr_path: Path
    stdout_path: Path
    name: str
    checked: int = 0  # stderr bytes already checked for tracebacks
    exit_code: int | None = None
    stopped: bool = field(default=False)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def stderr(self) -> str:
        return self.stderr_path.read_text(encoding="utf-8", errors="replace")

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                return exc.code, json.loads(body or b"null")
            except ValueError:
                return exc.code, body

    def readyz(self) -> dict[str, Any]:
        status, body = self.get("/readyz")
        assert status == 200, (status, body)
        return body  # type: ignore[no-any-return]

    async def wait_sessions(self, expected: int, timeout: float = 5.0) -> dict[str, Any]:
        """Poll ``/readyz`` until it reports ``sessions == expected``."""
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {}
        while time.monotonic() < deadline:
            body = await asyncio.to_thread(self.readyz)
            if body.get("sessions") == expected:
                return body
            await asyncio.sleep(0.05)
        raise AssertionError(f"/readyz still reports {body} after {timeout} s (expected sessions={expected})")

    def new_log(self) -> str:
        """stderr written since the last check; advances the check mark."""
        data = self.stderr_path.read_bytes()
        new, self.checked = data[self.checked :], len(data)
        return new.decode("utf-8", errors="replace")

    def stop(self) -> int | None:
        if self.stopped:
            return self.exit_code
        self.stopped = True
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired as timeout:
                self.proc.kill()
                self.proc.wait(5)
                self.exit_code = self.proc.returncode
                raise AssertionError(
                    f"gateway {self.name} ignored SIGTERM for {STOP_TIMEOUT_S} s; killed"
                ) from timeout
        self.exit_code = self.proc.returncode
        return self.exit_code


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


class GatewayFactory:
    """Starts gateways; stops them (and checks their logs) on :meth:`close`."""

    def __init__(self, tmp: Path) -> None:
        self._tmp = tmp
        self._started: list[Gateway] = []

    def start(
        self,
        config: dict[str, Any] | None = None,
        *,
        console_script: bool = False,
        args: list[str] | None = None,
        name: str = "gateway",
        ready: bool = True,
    ) -> Gateway:
        """Start ``serve`` with ``config`` written to a temp YAML (``None``: no --config).

        ``ready=False``: a gateway whose engine cannot open sessions (``/readyz`` answers 503);
        wait only for the process to serve ``/healthz``.
        """
        port = free_port()
        index = len(self._started)
        base = self._tmp / f"{name}-{index}"
        cmd = [str(CONSOLE_SCRIPT)] if console_script else [PYTHON, "-m", "duplex_gateway"]
        cmd += ["serve"]
        if config is not None:
            # These tests exercise the gateway with the loopback engine unless a test picks another.
            config = {**config, "engine": {"name": "echo", **config.get("engine", {})}}
            # A dropped client frees its slot at once unless a test is about resuming.
            config["limits"] = {"resume_grace_s": 0, **config.get("limits", {})}
            # A session still replying when the test stops its gateway holds the stop for this drain
            # grace at most (well inside STOP_TIMEOUT_S), unless a test is about draining.
            config["server"] = {"drain_grace_s": 2, **config.get("server", {})}
            cfg = base.with_suffix(".yaml")
            cfg.write_text(yaml.safe_dump(config), encoding="utf-8")
            cmd += ["--config", str(cfg)]
        cmd += list(args or [])
        cmd += ["--port", str(port), "--host", "127.0.0.1"]
        stderr_path = base.with_suffix(".stderr.log")
        stdout_path = base.with_suffix(".stdout.log")
        with open(stderr_path, "wb") as err, open(stdout_path, "wb") as out:
            proc = subprocess.Popen(
                cmd, cwd=REPO, env=gateway_env(), stdout=out, stderr=err, stdin=subprocess.DEVNULL
            )
        gw = Gateway(
            port=port, proc=proc, stderr_path=stderr_path, stdout_path=stdout_path, name=f"{name}-{index}"
        )
        self._started.append(gw)
        _RUNNING.append(gw)
        self._wait_ready(gw, "/readyz" if ready else "/healthz")
        return gw

    @staticmethod
    def _wait_ready(gw: Gateway, probe: str = "/readyz") -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if gw.proc.poll() is not None:
                raise AssertionError(
                    f"gateway {gw.name} exited with {gw.proc.returncode} before it was ready:\n{_tail(gw.stderr_path)}"
                )
            try:
                status, _ = gw.get(probe, timeout=1.0)
                if status == 200:
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        gw.stop()
        raise AssertionError(
            f"gateway {gw.name} not ready after {READY_TIMEOUT_S} s:\n{_tail(gw.stderr_path)}"
        )

    def close(self) -> None:
        problems: list[str] = []
        for gw in self._started:
            try:
                gw.stop()
            except AssertionError as exc:
                problems.append(str(exc))
            rest = gw.new_log()
            if "Traceback" in rest:
                problems.append(f"Traceback in gateway {gw.name} log (at shutdown):\n{rest[-6000:]}")
            if gw in _RUNNING:
                _RUNNING.remove(gw)
        self._started.clear()
        if problems:
            pytest.fail("\n\n".join(problems), pytrace=False)


# ---------------------------------------------------------------------------------------
# Audio


@cache
def _speech_float(rate: int) -> np.ndarray:
    audio, sr = sf.read(SPEECH_WAV, dtype="float32", always_2d=False)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    if sr != rate:
        audio = soxr.resample(audio, sr, rate).astype(np.float32)
    return np.clip(audio, -1.0, 1.0)


def _ulaw(x: np.ndarray) -> bytes:
    """G.711 mu-law, bit-exact with the reference g711.c (14-bit magnitude, bias 33)."""
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int32) >> 2
    mask = np.where(pcm < 0, 0x7F, 0xFF)
    mag = np.minimum(np.where(pcm < 0, -pcm, pcm), 8159) + 0x21
    seg = np.searchsorted(np.array([0x3F, 0x7F, 0xFF, 0x1FF, 0x3FF, 0x7FF, 0xFFF, 0x1FFF]), mag)
    code = np.where(seg >= 8, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))
    return ((code ^ mask) & 0xFF).astype(np.uint8).tobytes()


def _alaw(x: np.ndarray) -> bytes:
    """G.711 A-law on 16-bit samples."""
    pcm = (np.clip(x, -1, 1) * 32767).astype(np.int32) >> 3  # 13-bit
    sign = np.where(pcm >= 0, 0x80, 0)
    mag = np.where(pcm >= 0, pcm, -pcm - 1)
    mag = np.minimum(mag, 0xFFF)
    seg = np.where(mag < 32, 0, np.floor(np.log2(np.maximum(mag, 1))).astype(np.int32) - 4)
    seg = np.clip(seg, 0, 7)
    mantissa = np.where(seg == 0, mag >> 1, mag >> seg) & 0x0F
    return ((sign | (seg << 4) | mantissa) ^ 0x55).astype(np.uint8).tobytes()


def encode(samples: np.ndarray, fmt: str = "pcm16") -> bytes:
    """Float samples in [-1, 1] -> wire bytes."""
    if fmt == "pcm16":
        return (np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes()
    if fmt == "pcm_f32le":
        return np.asarray(samples, dtype="<f4").tobytes()
    if fmt == "g711_ulaw":
        return _ulaw(samples)
    if fmt == "g711_alaw":
        return _alaw(samples)
    raise ValueError(fmt)


def decode(data: bytes, fmt: str = "pcm16") -> np.ndarray:
    """Wire bytes -> float samples in [-1, 1] (independent of the gateway's codecs)."""
    if fmt == "pcm16":
        return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768
    if fmt == "pcm_f32le":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    codes = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
    if fmt == "g711_ulaw":
        u = ~codes & 0xFF
        mag = (((u & 0x0F) << 3) + 0x84) << ((u >> 4) & 0x07)
        pcm = np.where(u & 0x80, 0x84 - mag, mag - 0x84)
        return (pcm / 32768).astype(np.float32)
    if fmt == "g711_alaw":
        a = codes ^ 0x55
        seg = (a >> 4) & 0x07
        mant = a & 0x0F
        mag = np.where(seg == 0, (mant << 4) + 8, ((mant << 4) + 0x108) << np.maximum(seg - 1, 0))
        pcm = np.where(a & 0x80, mag, -mag)
        return (pcm / 32768).astype(np.float32)
    raise ValueError(fmt)


def bytes_per_sample(fmt: str) -> int:
    return {"pcm16": 2, "pcm_f32le": 4, "g711_ulaw": 1, "g711_alaw": 1}[fmt]


def load_speech(rate: int = 24_000, fmt: str = "pcm16") -> bytes:
    """The speech fixture (≈4.4 s) resampled to ``rate`` in wire format ``fmt``."""
    return encode(_speech_float(rate), fmt)


def silence(ms: float, rate: int = 24_000, fmt: str = "pcm16") -> bytes:
    return encode(np.zeros(int(rate * ms / 1000), dtype=np.float32), fmt)


def speech_turn(
    rate: int = 24_000, fmt: str = "pcm16", *, before_ms: float = 1000, after_ms: float = 1000
) -> bytes:
    """Silence, the speech fixture, silence: one caller turn for server VAD."""
    return silence(before_ms, rate, fmt) + load_speech(rate, fmt) + silence(after_ms, rate, fmt)


def duration_ms(data: bytes, rate: int = 24_000, fmt: str = "pcm16") -> float:
    return len(data) / bytes_per_sample(fmt) * 1000.0 / rate


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


async def _send_append(ws: Any, chunk: bytes) -> None:
    if hasattr(ws, "input_audio_buffer"):  # the openai SDK's AsyncRealtimeConnection
        await ws.input_audio_buffer.append(audio=b64(chunk))
    else:  # a raw websockets connection
        await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": b64(chunk)}))


async def stream_audio(
    ws: Any,
    pcm: bytes,
    frame_ms: float = 20,
    realtime: bool = True,
    *,
    rate: int = 24_000,
    fmt: str = "pcm16",
    speed: float = 1.0,
    lead_ms: float = 0.0,
    send: Callable[[bytes], Awaitable[None]] | None = None,
    timeout: float = 60.0,
) -> None:
    """Send ``pcm`` as ``input_audio_buffer.append`` frames of ``frame_ms``.

    With ``realtime`` the frames follow a fixed schedule at ``speed`` x real time,
    the first ``lead_ms`` of audio going out at once; without it they go out as fast
    as the socket takes them (the gateway paces the client with TCP backpressure).
    """
    step = int(rate * frame_ms / 1000) * bytes_per_sample(fmt)
    sender = send or (lambda chunk: _send_append(ws, chunk))
    loop = asyncio.get_running_loop()

    async def run() -> None:
        start = loop.time()
        for offset in range(0, len(pcm), step):
            chunk = pcm[offset : offset + step]
            await sender(chunk)
            if realtime:
                sent_ms = duration_ms(pcm[: offset + len(chunk)], rate, fmt)
                due = start + max(0.0, sent_ms - lead_ms) / 1000.0 / speed
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)

    await asyncio.wait_for(run(), timeout)


# ---------------------------------------------------------------------------------------
# Raw-client helpers


async def recv_event(ws: Any, timeout: float = 5.0) -> dict[str, Any]:
    """The next server event (JSON) from a websockets connection."""
    message = await asyncio.wait_for(ws.recv(), timeout)
    assert isinstance(message, str | bytes), message
    event = json.loads(message)
    assert isinstance(event, dict), event
    return event


async def recv_until(
    ws: Any,
    stop: str | Callable[[dict[str, Any]], bool],
    timeout: float = 10.0,
    into: list[dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read events until one has type ``stop`` (or satisfies it); returns (that event, all read)."""
    match = (lambda e: e.get("type") == stop) if isinstance(stop, str) else stop
    seen = into if into is not None else []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            types = [e.get("type") for e in seen[-30:]]
            raise AssertionError(f"no {stop!r} within {timeout} s; last events: {types}")
        try:
            event = await recv_event(ws, remaining)
        except TimeoutError:
            types = [e.get("type") for e in seen[-30:]]
            raise AssertionError(f"no {stop!r} within {timeout} s; last events: {types}") from None
        seen.append(event)
        if match(event):
            return event, seen


async def collect_for(ws: Any, seconds: float) -> list[dict[str, Any]]:
    """Every event that arrives within ``seconds``."""
    events: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (remaining := deadline - loop.time()) > 0:
        try:
            events.append(await recv_event(ws, remaining))
        except TimeoutError:
            break
    return events


def audio_of(events: list[dict[str, Any]], response_id: str | None = None) -> bytes:
    """The decoded audio of every audio delta (GA or beta name) in ``events``."""
    out = bytearray()
    for e in events:
        is_audio = e.get("type") in ("response.output_audio.delta", "response.audio.delta")
        if is_audio and response_id in (None, e.get("response_id")):
            out += base64.b64decode(e["delta"])
    return bytes(out)


def is_delta_of(response_id: str) -> Callable[[dict[str, Any]], bool]:
    """Matches an audio delta (GA or beta name) of ``response_id``."""

    def match(e: dict[str, Any]) -> bool:
        return e.get("type") in ("response.output_audio.delta", "response.audio.delta") and (
            e.get("response_id") == response_id
        )

    return match


def done_of(response_id: str) -> Callable[[dict[str, Any]], bool]:
    """Matches the ``response.done`` of ``response_id``."""
    return lambda e: e.get("type") == "response.done" and e["response"]["id"] == response_id


class EventLog:
    """Reads a connection's server events in the background so a test can wait on them.

    ``recv`` returns one raw message (str or bytes); every message must be a JSON object.
    """

    def __init__(self, recv: Callable[[], Awaitable[str | bytes]]) -> None:
        self.events: list[dict[str, Any]] = []
        self.ended: BaseException | None = None
        self._recv = recv
        self._cond = asyncio.Condition()
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            while True:
                message = await self._recv()
                event = json.loads(message)
                assert isinstance(event, dict), event
                async with self._cond:
                    self.events.append(event)
                    self._cond.notify_all()
        except BaseException as exc:  # the connection closed (or the reader was cancelled)
            self.ended = exc
            async with self._cond:
                self._cond.notify_all()
            if isinstance(exc, asyncio.CancelledError):
                raise

    def types(self, start: int = 0) -> list[str]:
        return [str(e.get("type")) for e in self.events[start:]]

    async def wait_for(
        self,
        match: str | Callable[[dict[str, Any]], bool],
        timeout: float = 10.0,
        start: int = 0,
    ) -> tuple[int, dict[str, Any]]:
        """The first event at index >= ``start`` of type ``match`` (or satisfying it), and its index."""
        pred = (lambda e: e.get("type") == match) if isinstance(match, str) else match
        index = start
        try:
            async with asyncio.timeout(timeout):
                async with self._cond:
                    while True:
                        while index < len(self.events):
                            if pred(self.events[index]):
                                return index, self.events[index]
                            index += 1
                        if self.ended is not None:
                            raise AssertionError(
                                f"connection ended ({self.ended!r}) before {match!r}; saw {self.types(start)[-30:]}"
                            )
                        await self._cond.wait()
        except TimeoutError:
            raise AssertionError(f"no {match!r} within {timeout} s; saw {self.types(start)[-30:]}") from None

    async def aclose(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, TimeoutError):
            await asyncio.wait_for(self._task, 2)


@dataclass
class AnsweredTurn:
    """One server-VAD turn and the reply to it, as found in an :class:`EventLog`."""

    started: dict[str, Any]
    stopped: dict[str, Any]
    response_id: str
    done: dict[str, Any]
    reply_events: list[dict[str, Any]]  # from response.created up to response.done


async def wait_answered_turn(
    log: EventLog, timeout: float, done_timeout: float | None = None
) -> AnsweredTurn:
    """Wait for speech_started, speech_stopped, response.created and that response's response.done."""
    i_start, started = await log.wait_for("input_audio_buffer.speech_started", timeout)
    _, stopped = await log.wait_for("input_audio_buffer.speech_stopped", timeout, start=i_start)
    index, created = await log.wait_for("response.created", timeout, start=i_start)
    response_id = created["response"]["id"]
    done_index, done = await log.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id,
        done_timeout or timeout,
        start=index,
    )
    return AnsweredTurn(started, stopped, response_id, done, log.events[index:done_index])


# ---------------------------------------------------------------------------------------
# Raw websockets clients


def ws_connect(gw: Gateway, path: str = "/v1/realtime", **kwargs: Any) -> Any:
    """A ``websockets`` client connection to ``gw`` (use with ``async with``)."""
    from websockets.asyncio.client import connect

    options: dict[str, Any] = {"open_timeout": 5, "close_timeout": 2, "max_size": None, "ping_interval": None}
    options.update(kwargs)
    return connect(gw.ws_url + path, **options)


async def send_json(ws: Any, event: dict[str, Any]) -> None:
    await asyncio.wait_for(ws.send(json.dumps(event)), 5)


async def wait_closed(ws: Any, timeout: float = 5.0) -> int | None:
    """Wait for the server to close ``ws``; the close code it sent."""
    await asyncio.wait_for(ws.wait_closed(), timeout)
    return cast("int | None", getattr(ws, "close_code", None))
