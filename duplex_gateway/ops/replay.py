"""``duplex-gateway replay``: play a recorded session against a gateway again and compare what it says.

The gateway runs in this process (a real uvicorn on a loopback port, with the engine named on the
command line) and records the new session itself, so both runs are compared in one vocabulary:
the gateway's own events, as :mod:`duplex_gateway.ops.recording` writes them. A client plays the
recording's client frames in order at their recorded times (divided by ``--speed``), each append
carrying its stretch of the recorded caller audio in the format the client sent it in, so the
audio goes out in the frames and at the pace the original client used.

Two things are compared:

* the event sequence: each server event's type with its ids numbered by first appearance
  (``item#1``, ``resp#1``), an error's code, and how the session ended. A stream of deltas of
  one part counts as one entry unless ``--exact-deltas`` asks for the number of deltas too (a
  different chunk size changes it, not the conversation). Any difference exits 1;
* the timings: each matched event's time in the new run against the recording's, summarised as
  the first reply audio's latency then and now and the largest drift. They are reported, never
  a failure: a loaded machine is not a regression.

Ids the gateway made up in the recorded run and the client sent back (a truncate's ``item_id``,
the session id) are rewritten to the new run's, learnt from the events it sends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import difflib
import json
import logging
import re
import socket
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlencode

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

from duplex_gateway.audio.codec import encode
from duplex_gateway.ops.recording import CALLER_FILE, EVENTS_FILE
from duplex_gateway.vocabulary.formats import Encoding

__all__ = [
    "CallerAudio",
    "Comparison",
    "RecordedSession",
    "ReplayError",
    "compare",
    "first_audio_latency",
    "load_recording",
    "rebuild_frame",
    "replay",
    "run",
    "sequence",
]

logger = logging.getLogger(__name__)

#: The server events that end a caller's turn, for the first reply audio's latency.
_TURN_ENDS: Final = frozenset({"input_audio_buffer.committed", "input_audio_buffer.speech_stopped"})
_CLIENT_TURN_ENDS: Final = frozenset({"response.create", "input_audio_buffer.commit", "input.commit"})
_FIRST_AUDIO: Final = "response.output_audio.delta"
#: Fields that hold ids; their values are numbered by first appearance, per prefix.
_ID_FIELDS: Final = frozenset({"id", "item_id", "response_id", "call_id", "previous_item_id", "session_id"})
#: How the gateway's ids look (session/machine.py, host/resumption.py): a random part per session and a counter.
_SESSION_ID = re.compile(r"sess_(?:[A-Za-z0-9-]{1,32}_)?[0-9a-f]{16}")
_MINTED_ID = re.compile(r"\b(item|resp|call)_([0-9a-f]{8})(\d{5})\b")
#: The ends the client made (it closed or dropped the socket) rather than the gateway.
_CLIENT_ENDS: Final = frozenset({"client_closed", "client_dropped"})
_START_TIMEOUT_S: Final = 300.0


class ReplayError(Exception):
    """The recording cannot be replayed (unreadable, a phone call, the gateway would not start)."""


@dataclass(frozen=True, slots=True)
class RecordedSession:
    """One recording's log, read back."""

    folder: Path
    header: Mapping[str, Any]
    client: tuple[Mapping[str, Any], ...]
    server: tuple[Mapping[str, Any], ...]
    end: Mapping[str, Any] | None
    gaps: int = 0

    @property
    def complete(self) -> bool:
        return self.end is not None and bool(self.end.get("complete")) and not self.gaps

    @property
    def close(self) -> str:
        if self.end is None:
            return "(no end recorded)"
        code = self.end.get("code")
        return f"{self.end.get('reason')}" + (f" ({code})" if code is not None else "")


def load_recording(path: str | Path) -> RecordedSession:
    """Read a recording folder (or its ``events.jsonl``)."""
    path = Path(path)
    folder = path.parent if path.name == EVENTS_FILE else path
    log = folder / EVENTS_FILE
    try:
        lines = log.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ReplayError(f"cannot read {log}: {exc.strerror}") from None
    header: Mapping[str, Any] | None = None
    client: list[Mapping[str, Any]] = []
    server: list[Mapping[str, Any]] = []
    end: Mapping[str, Any] | None = None
    gaps = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # the last line of a recording cut short
            raise ReplayError(f"{log}:{number}: not JSON") from None
        kind = record.get("kind") if isinstance(record, dict) else None
        if kind == "session":
            header = record
        elif kind == "client":
            client.append(record)
        elif kind == "server":
            server.append(record)
        elif kind == "gap":
            gaps += 1
        elif kind == "end":
            end = record
    if header is None:
        raise ReplayError(f"{log} has no session header: not a recording")
    return RecordedSession(folder, header, tuple(client), tuple(server), end, gaps)


# -- the caller's audio, as the client sent it ------------------------------------------------------


class CallerAudio:
    """The recorded caller track, cut and converted back into the appends the client sent."""

    def __init__(self, folder: Path, rate: int) -> None:
        self.rate = rate
        self._converted: dict[int, npt.NDArray[np.float32]] = {}
        if not (folder / CALLER_FILE).exists():  # the caller sent no audio
            self._pcm: npt.NDArray[np.int16] = np.zeros(0, dtype=np.int16)
            return
        try:
            samples, file_rate = sf.read(folder / CALLER_FILE, dtype="int16", always_2d=False)
        except (OSError, sf.LibsndfileError) as exc:
            raise ReplayError(f"cannot read {folder / CALLER_FILE}: {exc}") from None
        if file_rate != rate:
            raise ReplayError(f"{CALLER_FILE} is at {file_rate} Hz, the log says {rate} Hz")
        self._pcm = np.asarray(samples, dtype=np.int16).reshape(-1)

    def wire(self, ref: Mapping[str, Any]) -> bytes:
        """The bytes of one recorded append: ``ref`` is its ``$audio`` reference."""
        size, offset = int(ref["bytes"]), int(ref["offset"])
        encoding, rate = Encoding(str(ref["encoding"])), int(ref["rate"])
        count = size // encoding.bytes_per_sample
        if encoding is Encoding.PCM16 and rate == self.rate:
            # The engine took the client's bytes as they were: the track holds them exactly.
            data = _padded(self._pcm, offset, count).astype("<i2").tobytes()
        else:
            start = round(offset * rate / self.rate)
            data = encode(_padded(self._at(rate), start, count), encoding)
        return data + bytes(size - len(data))  # a partial sample the gateway refused: refused again

    def _at(self, rate: int) -> npt.NDArray[np.float32]:
        converted = self._converted.get(rate)
        if converted is None:
            floats = self._pcm.astype(np.float32) / 32768.0
            converted = (
                floats
                if rate == self.rate
                else np.asarray(soxr.resample(floats, self.rate, rate, quality="HQ"), dtype=np.float32)
            )
            self._converted[rate] = converted
        return converted


def _padded(samples: npt.NDArray[Any], start: int, count: int) -> npt.NDArray[Any]:
    piece = samples[max(start, 0) : max(start, 0) + count]
    if piece.size < count:
        piece = np.concatenate([piece, np.zeros(count - piece.size, dtype=samples.dtype)])
    return piece


# -- ids ---------------------------------------------------------------------------------------


class _Ids:
    """Maps the recorded run's gateway-made ids to the new run's, learnt from the new run's frames."""

    def __init__(self, recorded: RecordedSession) -> None:
        self._old_session = str(recorded.header.get("session_id", ""))
        self._new_session: str | None = None
        self._old_salt = _first_salt(json.dumps(record.get("event")) for record in recorded.server)
        self._new_salt: str | None = None

    def learn(self, frame: str) -> None:
        if self._new_session is None and (match := _SESSION_ID.search(frame)):
            self._new_session = match.group(0)
        if self._new_salt is None:
            self._new_salt = _first_salt((frame,))

    def rewrite(self, text: str) -> str:
        if self._new_session and self._old_session and self._old_session != self._new_session:
            text = text.replace(self._old_session, self._new_session)
        old, new = self._old_salt, self._new_salt
        if old and new and old != new:
            text = _MINTED_ID.sub(
                lambda m: f"{m.group(1)}_{new}{m.group(3)}" if m.group(2) == old else m.group(0), text
            )
        return text


def _first_salt(texts: Iterable[str]) -> str | None:
    for text in texts:
        if match := _MINTED_ID.search(text):
            return match.group(2)
    return None


def rebuild_frame(
    record: Mapping[str, Any], audio: CallerAudio | None, rewrite: Callable[[str], str] = str
) -> str | None:
    """A recorded client frame as the client sent it (None: a binary frame, which is not replayed).

    ``rewrite`` maps the recorded run's ids in its strings to the new run's.
    """
    if "frame" in record:
        return json.dumps(_fill(record["frame"], audio, rewrite), separators=(",", ":"))
    text = record.get("text")
    return rewrite(text) if isinstance(text, str) else None


def _fill(data: Any, audio: CallerAudio | None, rewrite: Callable[[str], str]) -> Any:
    if isinstance(data, dict):
        ref = data.get("$audio")
        if isinstance(ref, dict) and len(data) == 1:
            if audio is None:
                raise ReplayError("the recording has no caller audio for its appends")
            return base64.b64encode(audio.wire(ref)).decode("ascii")
        return {key: _fill(value, audio, rewrite) for key, value in data.items()}
    if isinstance(data, list):
        return [_fill(value, audio, rewrite) for value in data]
    if isinstance(data, str):
        return rewrite(data)
    return data


# -- the comparison ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    key: str
    t: float
    count: int = 1


def _ids_of(value: Any, found: list[tuple[str, str]], name: str = "") -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _ids_of(item, found, key)
    elif isinstance(value, list):
        for item in value:
            _ids_of(item, found, name)
    elif isinstance(value, str) and name in _ID_FIELDS and value:
        found.append((name, value))


def sequence(recorded: RecordedSession, *, exact_deltas: bool = False) -> list[_Entry]:
    """The session's server events as comparable entries, ending with how it closed."""
    numbers: dict[str, str] = {}
    per_prefix: dict[str, int] = {}

    def number(value: str) -> str:
        if value not in numbers:
            prefix = value.split("_", 1)[0] if "_" in value else "id"
            per_prefix[prefix] = per_prefix.get(prefix, 0) + 1
            numbers[value] = f"{prefix}#{per_prefix[prefix]}"
        return numbers[value]

    entries: list[_Entry] = []
    for record in recorded.server:
        event = record.get("event") or {}
        found: list[tuple[str, str]] = []
        _ids_of(event, found)
        parts = [str(record.get("type"))]
        if record.get("type") == "error":
            parts.append(f"code={event.get('code')}")
        seen: set[tuple[str, str]] = set()
        for name, value in found:
            if name == "session_id" or (name, value) in seen:
                continue
            seen.add((name, value))
            parts.append(f"{name}={number(value)}")
        key = " ".join(parts)
        last = entries[-1] if entries else None
        if last is not None and last.key == key and str(record.get("type")).endswith(".delta"):
            entries[-1] = _Entry(last.key, last.t, last.count + 1)
            continue
        entries.append(_Entry(key, float(record.get("t", 0.0))))
    if recorded.end is not None:
        entries.append(_Entry(f"end reason={recorded.end.get('reason')}", float(recorded.end.get("t", 0.0))))
    if exact_deltas:
        entries = [_Entry(f"{e.key} ×{e.count}" if e.count > 1 else e.key, e.t, e.count) for e in entries]
    return entries


def first_audio_latency(recorded: RecordedSession) -> float | None:
    """Seconds from the end of the turn the first reply audio answered to that audio."""
    first = next((float(r["t"]) for r in recorded.server if r.get("type") == _FIRST_AUDIO), None)
    if first is None:
        return None
    ends = [float(r["t"]) for r in recorded.server if r.get("type") in _TURN_ENDS and float(r["t"]) <= first]
    ends += [
        float(r["t"])
        for r in recorded.client
        if _CLIENT_TURN_ENDS.intersection(r.get("commands") or ()) and float(r["t"]) <= first
    ]
    return first - max(ends) if ends else first


@dataclass
class Comparison:
    """A replay against its recording: equal or not, and how the timings moved."""

    recorded: RecordedSession
    replayed: RecordedSession
    speed: float
    engine: str
    exact_deltas: bool = False
    diff: list[str] = field(default_factory=list)
    equal: bool = True
    drifts: list[tuple[str, float, float]] = field(default_factory=list)  # (entry, then, now)
    delta_counts: list[tuple[str, int, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def latency(self) -> tuple[float | None, float | None]:
        return first_audio_latency(self.recorded), first_audio_latency(self.replayed)

    def max_drift(self) -> tuple[str, float] | None:
        if not self.drifts:
            return None
        key, then, now = max(self.drifts, key=lambda d: abs(d[2] - d[1] / self.speed))
        return key, now - then / self.speed

    def report(self) -> str:
        """What a person reads: the verdict, the differences, the timings."""
        old, new = self.recorded, self.replayed
        lines = [
            f"replay of {old.folder} against engine {self.engine} (speed {self.speed:g})",
            f"  recorded: {len(old.server)} events, closed {old.close}",
            f"  replayed: {len(new.server)} events, closed {new.close}",
            *(f"  warning: {warning}" for warning in self.warnings),
            f"event sequence: {'SAME' if self.equal else 'DIFFERENT'}",
        ]
        lines += [f"  {line}" for line in self.diff]
        for key, then, now in self.delta_counts:
            lines.append(f"  note: {key}: {then} deltas recorded, {now} now")
        then_latency, now_latency = self.latency
        timing = (
            f"timings: first audio latency {_seconds(then_latency)} recorded, {_seconds(now_latency)} now"
        )
        if then_latency is not None and now_latency is not None:
            timing += f" ({(now_latency - then_latency) * 1000:+.0f} ms)"
        lines.append(timing)
        worst = self.max_drift()
        if worst is not None:
            drifts = [abs(now - then / self.speed) for _, then, now in self.drifts]
            lines.append(
                f"  over {len(self.drifts)} matched events: max drift {worst[1] * 1000:+.0f} ms at {worst[0]}, "
                f"median {statistics.median(drifts) * 1000:.0f} ms"
            )
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        then_latency, now_latency = self.latency
        worst = self.max_drift()
        return {
            "equal": self.equal,
            "recording": str(self.recorded.folder),
            "replay_recording": str(self.replayed.folder),
            "engine": self.engine,
            "speed": self.speed,
            "exact_deltas": self.exact_deltas,
            "warnings": self.warnings,
            "recorded": {
                "events": len(self.recorded.server),
                "close": self.recorded.end,
                "sequence": [e.key for e in sequence(self.recorded, exact_deltas=self.exact_deltas)],
            },
            "replayed": {
                "events": len(self.replayed.server),
                "close": self.replayed.end,
                "sequence": [e.key for e in sequence(self.replayed, exact_deltas=self.exact_deltas)],
            },
            "diff": self.diff,
            "delta_counts": [{"event": k, "recorded": a, "replayed": b} for k, a, b in self.delta_counts],
            "timings": {
                "first_audio_latency_s": {
                    "recorded": then_latency,
                    "replayed": now_latency,
                    "change": None
                    if then_latency is None or now_latency is None
                    else now_latency - then_latency,
                },
                "matched_events": len(self.drifts),
                "max_drift_s": worst[1] if worst else None,
                "max_drift_event": worst[0] if worst else None,
                "events": [
                    {"event": key, "recorded_t": then, "replayed_t": now, "drift_s": now - then / self.speed}
                    for key, then, now in self.drifts
                ],
            },
        }


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


def compare(
    recorded: RecordedSession,
    replayed: RecordedSession,
    *,
    speed: float = 1.0,
    engine: str = "",
    exact_deltas: bool = False,
) -> Comparison:
    old = sequence(recorded, exact_deltas=exact_deltas)
    new = sequence(replayed, exact_deltas=exact_deltas)
    result = Comparison(recorded, replayed, speed, engine or str(replayed.header.get("engine")), exact_deltas)
    old_keys, new_keys = [e.key for e in old], [e.key for e in new]
    result.equal = old_keys == new_keys
    if not result.equal:
        result.diff = list(difflib.unified_diff(old_keys, new_keys, "recorded", "replayed", n=3, lineterm=""))
    matcher = difflib.SequenceMatcher(a=old_keys, b=new_keys, autojunk=False)
    for block in matcher.get_matching_blocks():
        for offset in range(block.size):
            a, b = old[block.a + offset], new[block.b + offset]
            result.drifts.append((a.key, a.t, b.t))
            if a.count != b.count:
                result.delta_counts.append((a.key, a.count, b.count))
    if not recorded.complete:
        result.warnings.append(
            "the recording is incomplete (see its end line): the replay may differ for that"
        )
    return result


# -- running it --------------------------------------------------------------------------------


async def _drive(
    url: str, recorded: RecordedSession, audio: CallerAudio | None, *, speed: float, settle_s: float
) -> None:
    """Play the recorded client frames against ``url`` and end the session as the recording did."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    loop = asyncio.get_running_loop()
    ids = _Ids(recorded)
    expected = sum(1 for record in recorded.server if record.get("sent", True))
    received = 0
    async with connect(url, max_size=None, open_timeout=30, ping_interval=None, compression=None) as ws:
        start = loop.time()
        server_closed = asyncio.Event()

        async def receive() -> None:
            nonlocal received
            try:
                async for message in ws:
                    received += 1
                    if isinstance(message, str):
                        ids.learn(message)
            except ConnectionClosed:
                pass
            finally:
                server_closed.set()

        async def until(deadline: float) -> None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(deadline):
                    await server_closed.wait()

        reader = asyncio.create_task(receive(), name="replay-reader")
        try:
            for record in recorded.client:
                await until(start + float(record.get("t", 0.0)) / speed)
                if server_closed.is_set():
                    break
                frame = rebuild_frame(record, audio, ids.rewrite)
                if frame is None:
                    continue
                try:
                    await ws.send(frame)
                except ConnectionClosed:
                    break
            end = recorded.end
            end_t = float(end.get("t", 0.0)) if end else 0.0
            if end is not None and end.get("reason") in _CLIENT_ENDS:
                await until(start + end_t / speed)
                # A slower run still gets to say what the recorded one said before the client left.
                settle = loop.time() + settle_s
                while received < expected and not server_closed.is_set() and loop.time() < settle:
                    await until(min(settle, loop.time() + 0.05))
                if end.get("reason") == "client_dropped":
                    ws.transport.abort()
                else:
                    code = end.get("code")
                    await ws.close(code=code if isinstance(code, int) and code in (1000, 1001) else 1000)
            else:
                # The gateway ended it (a timeout, an error, a drain): wait for it to do so again.
                await until(max(start + end_t / speed, loop.time()) + settle_s)
                await ws.close()
        finally:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _check_replayable(recorded: RecordedSession) -> None:
    if recorded.header.get("dialect") == "telephony":
        raise ReplayError("this recording is a phone call: replay plays Realtime and duplex sessions only")


def _folders(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if (p / EVENTS_FILE).is_file()) if directory.is_dir() else []


async def _finished_recording(
    directory: Path, timeout_s: float, *, older: Iterable[Path] = ()
) -> RecordedSession:
    """The replayed session's recording once its writer is done (``older``: recordings that were there before)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    skip = set(older)
    while True:
        folders = [folder for folder in _folders(directory) if folder not in skip]
        if folders:
            session = load_recording(folders[-1])
            if session.end is not None:
                return session
        if loop.time() >= deadline:
            if folders:
                return load_recording(folders[-1])
            raise ReplayError("the replayed session left no recording")
        await asyncio.sleep(0.05)


async def replay(
    recorded: RecordedSession,
    *,
    engine: str,
    config: str | Path | None = None,
    speed: float = 1.0,
    settle_s: float = 5.0,
    directory: Path,
) -> RecordedSession:
    """Run a gateway with ``engine`` on loopback, play ``recorded`` against it, return the new recording.

    The gateway records the new run in ``directory``.
    """
    import uvicorn

    from duplex_gateway.config import load_settings
    from duplex_gateway.engine.registry import build_engine
    from duplex_gateway.server.app import create_app

    _check_replayable(recorded)
    endpoint = recorded.header.get("endpoint") or {}
    audio_info = (recorded.header.get("audio") or {}).get("caller") or {}
    audio = CallerAudio(recorded.folder, int(audio_info.get("rate", 24_000))) if audio_info else None
    older = _folders(directory)
    settings = load_settings(
        config,
        **{
            "engine.name": engine,
            "server.host": "127.0.0.1",
            "server.web_demo": False,
            # The replay client holds no key: authentication is not what a replay tests.
            "auth.keys": [],
            "auth.api_keys": [],
            "recording.enabled": True,
            "recording.directory": str(directory),
        },
    )
    gateway_engine = build_engine(settings)
    app = create_app(settings, gateway_engine)
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    port = int(listener.getsockname()[1])
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            ws="websockets-sansio",
            lifespan="on",
            log_config=None,
            log_level="warning",
            ws_max_size=settings.limits.hard_max_message_bytes,
            ws_per_message_deflate=False,
            ws_ping_interval=settings.server.ws_ping_interval_s,
            ws_ping_timeout=settings.server.ws_ping_timeout_s,
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[listener]), name="replay-gateway")
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + _START_TIMEOUT_S
        while not server.started:
            if serving.done() or loop.time() > deadline:
                raise ReplayError(f"the gateway with engine {engine!r} did not start (see the log above)")
            await asyncio.sleep(0.02)
        path = str(endpoint.get("path") or "/v1/realtime")
        query = dict(endpoint.get("query") or {})
        if endpoint.get("beta"):
            query["beta"] = "1"
        url = f"ws://127.0.0.1:{port}{path}" + (f"?{urlencode(query)}" if query else "")
        await _drive(url, recorded, audio, speed=speed, settle_s=settle_s)
        tail = 0.0
        if recorded.end is not None and recorded.client:
            tail = max(0.0, float(recorded.end.get("t", 0.0)) - float(recorded.client[-1].get("t", 0.0)))
        wait_s = settings.limits.engine_timeout_s + tail / speed + settle_s
        return await _finished_recording(directory, wait_s, older=older)
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
        listener.close()


def run(
    recording: str,
    *,
    engine: str | None,
    config: str | None,
    speed: float,
    out: str | None,
    exact_deltas: bool = False,
    settle_s: float = 5.0,
    keep: str | None = None,
) -> int:
    """The ``replay`` command: 0 when the sequences are equal, 1 when they differ, 2 when it cannot run."""
    import sys

    from duplex_gateway.config import ConfigError
    from duplex_gateway.engine.registry import UnknownEngine
    from duplex_gateway.ops.logs import configure_logging

    if speed <= 0:
        print("duplex-gateway replay: --speed must be above 0", file=sys.stderr)
        return 2
    try:
        recorded = load_recording(recording)
        _check_replayable(recorded)
    except ReplayError as exc:
        print(f"duplex-gateway replay: {exc}", file=sys.stderr)
        return 2
    name = engine or str(recorded.header.get("engine") or "")
    configure_logging("warning", "text")
    with contextlib.ExitStack() as stack:
        # Unless asked to keep it, the new run's recording goes once it is compared.
        directory = (
            Path(keep) if keep else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="replay-")))
        )
        try:
            replayed = asyncio.run(
                replay(
                    recorded,
                    engine=name,
                    config=config,
                    speed=speed,
                    settle_s=settle_s,
                    directory=directory,
                )
            )
        except (ReplayError, ConfigError, UnknownEngine) as exc:
            print(f"duplex-gateway replay: {exc}", file=sys.stderr)
            return 2
        result = compare(recorded, replayed, speed=speed, engine=name, exact_deltas=exact_deltas)
        print(result.report())
        if out:
            data = result.as_json()
            if not keep:
                data["replay_recording"] = None
            Path(out).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0 if result.equal else 1
