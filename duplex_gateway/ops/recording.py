"""Session recordings: the caller's and the assistant's audio as FLAC, and every event as JSONL.

A recorded session is one folder, ``<UTC start>_<session id>``, under ``recording.directory``:

* ``caller.flac``: the caller's audio after decoding and resampling to the engine's input rate
  (mono PCM16): what the engine was given, and, on the same timeline, what the gateway's turn
  detection held back from it (silence between turns), so the track is the caller's whole stream.
  The format the client sent it in is in the log (each append's ``$audio`` reference), so
  ``duplex-gateway replay`` can convert it back; with PCM16 at the engine's rate the track holds
  the client's bytes exactly.
* ``assistant.flac``: the reply audio as the engine produced it (mono PCM16 at the engine's output
  rate), before it is encoded for the client, as the session passed it on (a cancelled reply's
  audio stops where the session cut it). Replies follow each other with no silence between them;
  the log says when each piece went out.

A track with no audio at all (a session that never spoke) has no file.
* ``events.jsonl``: a ``session`` header (engine, dialect, endpoint, key, starting configuration),
  every client frame (``dir: in``, with the commands it carried) and every server event
  (``dir: out``) with ``t``, seconds since the session started (a monotonic clock), audio replaced
  by ``{"$audio": {"track", "bytes", "offset", ...}}`` (``offset``: in samples into the track's
  FLAC), ``gap`` lines where items were dropped, and an ``end`` line: close reason and code, the
  final configuration, ``complete`` and the problems that made it incomplete. A log without an
  ``end`` line is incomplete too (the process died, or the disk was full).

Nothing here may slow a session down: every hook only puts an item on a bounded queue that one
writer thread per recording drains, and a full queue or a full disk costs the recording (a log
line once, the recording marked incomplete), never the session.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import dataclasses
import enum
import errno
import json
import logging
import queue
import re
import shutil
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import soundfile as sf

from duplex_gateway.config import GatewaySettings, RecordingSettings
from duplex_gateway.engine.port import EngineCapabilities
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.commands import Command, InputAudioAppend
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import SessionConfig

if TYPE_CHECKING:
    from duplex_gateway.auth.principal import Principal

__all__ = [
    "ASSISTANT_FILE",
    "CALLER_FILE",
    "EVENTS_FILE",
    "FORMAT_VERSION",
    "MAX_QUEUED_BYTES",
    "NO_RECORDER",
    "Recorder",
    "Recording",
    "Recordings",
    "jsonable",
    "sweep",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION: Final = 1
CALLER_FILE: Final = "caller.flac"
ASSISTANT_FILE: Final = "assistant.flac"
EVENTS_FILE: Final = "events.jsonl"
#: Bytes (audio and frames) one recording may have waiting for its writer, whatever ``queue_size``
#: says: a session may send 15 MiB appends, and a stalled disk must not hold many of them.
MAX_QUEUED_BYTES: Final = 64 << 20
#: A recording folder's name: its start (UTC, microseconds) and session id, so names sort by age.
_FOLDER = re.compile(r"^(\d{8}T\d{6}\.\d{6})Z_[A-Za-z0-9_.-]{1,128}$")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
#: A client text frame that is not JSON is kept up to this many characters.
_MAX_RAW_TEXT: Final = 4096
#: Queue items the writer handles before it flushes the log.
_BATCH: Final = 256
_PCM16: Final = np.dtype("<i2")
#: What a full disk (or a folder that cannot be written) raises: the OS's error, or libsndfile's.
_WRITE_ERRORS: Final = (OSError, sf.LibsndfileError)


class Recorder(Protocol):
    """What :class:`~duplex_gateway.host.connection.Connection` tells a recording. Every call returns at once."""

    def client_command(self, frame: Frame, commands: Sequence[Command], input_format: AudioFormat) -> None:
        """A client frame, the commands parsed from it (none: it was refused), the session's input format."""
        ...

    def server_event(self, event: ev.ServerEvent, sent: bool) -> None:
        """An event for the client, as encoded for it; ``sent``: the dialect had a frame for it."""
        ...

    def caller_audio(self, pcm: bytes) -> None:
        """Caller audio converted to the engine's input format (PCM16 at its input rate)."""
        ...

    def assistant_audio(self, pcm: bytes) -> None:
        """Reply audio as the engine produced it (PCM16 at its output rate), before client encoding."""
        ...

    def closed(self, reason: str, code: int | None, config: SessionConfig) -> None:
        """The session ended: write the rest, close the files. Later calls are ignored."""
        ...


class _NoRecorder:
    """The recorder of a session nobody records: every hook does nothing."""

    def client_command(self, frame: Frame, commands: Sequence[Command], input_format: AudioFormat) -> None:
        return None

    def server_event(self, event: ev.ServerEvent, sent: bool) -> None:
        return None

    def caller_audio(self, pcm: bytes) -> None:
        return None

    def assistant_audio(self, pcm: bytes) -> None:
        return None

    def closed(self, reason: str, code: int | None, config: SessionConfig) -> None:
        return None


NO_RECORDER: Final[Recorder] = _NoRecorder()


def jsonable(value: object) -> Any:
    """``value`` (events, commands, configurations: frozen dataclasses) as plain JSON values.

    Bytes become ``{"$bytes": length}``: the log never holds a payload.
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value.value if isinstance(value, enum.Enum) else value
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bytes | bytearray | memoryview):
        return {"$bytes": len(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, set | frozenset):
        return sorted((jsonable(item) for item in value), key=str)
    if isinstance(value, list | tuple):
        return [jsonable(item) for item in value]
    return str(value)


def _folder_name(session_id: str, started: datetime) -> str:
    return f"{started:%Y%m%dT%H%M%S.%f}Z_{_UNSAFE.sub('_', session_id)[:128]}"


def _folder_started(name: str) -> float | None:
    """The Unix time a recording folder's name says it started (None: not a recording's name)."""
    match = _FOLDER.match(name)
    if match is None:
        return None
    return datetime.strptime(match.group(1), "%Y%m%dT%H%M%S.%f").replace(tzinfo=UTC).timestamp()


def _folder_bytes(folder: Path) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for entry in folder.iterdir():
            with contextlib.suppress(OSError):
                total += entry.stat().st_size
    return total


def sweep(
    directory: Path,
    *,
    max_recordings: int | None,
    max_bytes: int | None,
    max_age_s: float | None,
    keep: frozenset[str] = frozenset(),
    now: float | None = None,
) -> list[Path]:
    """Delete the oldest recordings in ``directory`` until every limit holds; returns what was deleted.

    Only folders named like a recording are counted or touched; those in ``keep`` (recordings
    still being written) count but are never deleted.
    """
    if max_recordings is None and max_bytes is None and max_age_s is None:
        return []
    try:
        folders = sorted(
            (entry for entry in directory.iterdir() if _FOLDER.match(entry.name) and entry.is_dir()),
            key=lambda entry: entry.name,
        )
    except OSError:
        return []
    now = time.time() if now is None else now
    sizes = {folder.name: _folder_bytes(folder) for folder in folders} if max_bytes is not None else {}
    count, total = len(folders), sum(sizes.values())
    deleted: list[Path] = []
    for folder in folders:
        if folder.name in keep:
            continue
        started = _folder_started(folder.name)
        too_old = max_age_s is not None and started is not None and now - started > max_age_s
        too_many = max_recordings is not None and count > max_recordings
        too_big = max_bytes is not None and total > max_bytes
        if not (too_old or too_many or too_big):
            break  # oldest first: every later one is younger, and the totals hold
        shutil.rmtree(folder, ignore_errors=True)
        count -= 1
        total -= sizes.get(folder.name, 0)
        deleted.append(folder)
    return deleted


# -- one recording ----------------------------------------------------------------------------


class _Item(enum.Enum):
    CLIENT = "in"
    SERVER = "out"
    CALLER = "caller"
    ASSISTANT = "assistant"
    GAP = "gap"
    END = "end"


@dataclasses.dataclass(slots=True)
class _Dropped:
    """What a full queue cost the recording since the last ``gap`` line."""

    items: int = 0
    caller_bytes: int = 0
    assistant_bytes: int = 0

    def __bool__(self) -> bool:
        return self.items > 0


class _Track:
    """One FLAC file, opened on its first audio: a track without any has no file (libsndfile reads no empty FLAC)."""

    def __init__(self, path: Path, rate: int) -> None:
        self.path = path
        self.rate = rate
        self.samples = 0
        self._file: sf.SoundFile | None = None
        self._odd = b""  # half a PCM16 sample, for the next chunk

    def write(self, pcm: bytes) -> None:
        if self._odd:
            pcm, self._odd = self._odd + pcm, b""
        if len(pcm) % 2:
            pcm, self._odd = pcm[:-1], pcm[-1:]
        if not pcm:
            return
        if self._file is None:
            self._open()
        assert self._file is not None
        samples = np.frombuffer(pcm, dtype=_PCM16)
        try:
            self._file.write(samples)
        except AssertionError:  # soundfile's check that every frame went out: a short write
            raise OSError(errno.EIO, f"{self.path.name}: the disk took only part of the audio") from None
        self.samples += samples.size

    def silence(self, samples: int) -> None:
        """Hold ``samples`` of the timeline that a full queue dropped."""
        if samples > 0:
            self.write(bytes(2 * samples))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()

    def abandon(self) -> None:
        if self._file is not None:
            with contextlib.suppress(Exception):
                self._file.close()

    def _open(self) -> None:
        self._file = sf.SoundFile(
            self.path, mode="w", samplerate=self.rate, channels=1, format="FLAC", subtype="PCM_16"
        )


#: Recordings still being written, so the process can let their writers finish as it exits.
_LIVE: weakref.WeakSet[Recording] = weakref.WeakSet()
_EXIT_WAIT_S: Final = 5.0


@atexit.register
def _finish_live() -> None:
    deadline = time.monotonic() + _EXIT_WAIT_S
    for recording in list(_LIVE):
        recording.interrupt("gateway_exited")
        recording.wait(max(0.0, deadline - time.monotonic()))


class Recording:
    """One session's recording: the hooks queue; a writer thread writes the folder.

    ``on_done`` runs on the writer thread once everything is written (or given up).
    """

    def __init__(
        self,
        folder: Path,
        *,
        header: Mapping[str, object],
        input_rate: int,
        output_rate: int,
        queue_size: int = 4096,
        max_queued_bytes: int = MAX_QUEUED_BYTES,
        on_done: Callable[[Recording], None] | None = None,
    ) -> None:
        self.folder = folder
        self.session_id = str(header.get("session_id", ""))
        self._header = dict(header)
        self._input_rate = input_rate
        self._output_rate = output_rate
        self._queue: queue.Queue[tuple[_Item, float, Any]] = queue.Queue(queue_size)
        self._max_bytes = max_queued_bytes
        self._queued_bytes = 0
        self._lock = threading.Lock()
        self._dropped = _Dropped()
        self._dropped_total = _Dropped()
        self._overflowed = False
        self._end: tuple[float, str, int | None, SessionConfig | None] | None = None
        #: Set by the writer when it cannot write: the hooks stop queuing.
        self._failed: str | None = None
        self._started = time.monotonic()
        self._on_done = on_done
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"recording:{self.session_id}", daemon=True)
        _LIVE.add(self)
        self._thread.start()

    # -- the hooks (event loop) -----------------------------------------------------------------

    def client_command(self, frame: Frame, commands: Sequence[Command], input_format: AudioFormat) -> None:
        self._put(_Item.CLIENT, (frame, tuple(commands), input_format), len(frame))

    def server_event(self, event: ev.ServerEvent, sent: bool) -> None:
        size = len(event.audio) if isinstance(event, ev.AudioDelta) else 0
        self._put(_Item.SERVER, (event, sent), size)

    def caller_audio(self, pcm: bytes) -> None:
        if pcm:
            self._put(_Item.CALLER, pcm, len(pcm))

    def assistant_audio(self, pcm: bytes) -> None:
        if pcm:
            self._put(_Item.ASSISTANT, pcm, len(pcm))

    def closed(self, reason: str, code: int | None, config: SessionConfig) -> None:
        if self._end is not None:
            return
        self._end = (self._now(), reason, code, config)
        # The writer also looks for the end whenever the queue runs dry, so a full queue
        # cannot keep it from finishing.
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait((_Item.END, 0.0, None))

    def interrupt(self, reason: str) -> None:
        """End a recording whose session never said it ended (the process is exiting)."""
        if self._end is None:
            self._end = (self._now(), reason, None, None)

    # -- for tests and the process's exit -----------------------------------------------------------

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the writer has finished; False if it has not within ``timeout``."""
        return self._done.wait(timeout)

    # -- queuing --------------------------------------------------------------------------

    def _now(self) -> float:
        return time.monotonic() - self._started

    def _put(self, kind: _Item, payload: object, size: int) -> None:
        if self._end is not None or self._failed is not None:
            return
        now = self._now()
        with self._lock:
            if self._dropped:
                # What was dropped goes on record (silence in the tracks) before anything after it.
                if not self._try_put(_Item.GAP, now, dataclasses.replace(self._dropped), 0):
                    self._drop(kind, payload)
                    return
                self._dropped = _Dropped()
            if not self._try_put(kind, now, payload, size):
                self._drop(kind, payload)

    def _try_put(self, kind: _Item, now: float, payload: object, size: int) -> bool:
        if self._queued_bytes + size > self._max_bytes and self._queued_bytes > 0:
            return False
        try:
            self._queue.put_nowait((kind, now, payload))
        except queue.Full:
            return False
        self._queued_bytes += size
        return True

    def _drop(self, kind: _Item, payload: object) -> None:
        for tally in (self._dropped, self._dropped_total):
            tally.items += 1
            if kind is _Item.CALLER and isinstance(payload, bytes):
                tally.caller_bytes += len(payload)
            elif kind is _Item.ASSISTANT and isinstance(payload, bytes):
                tally.assistant_bytes += len(payload)
        if not self._overflowed:
            self._overflowed = True
            logger.warning(
                "recording of session %s: its writer fell behind (%d items or %d bytes waiting); dropping "
                "what does not fit, and the recording is marked incomplete",
                self.session_id,
                self._queue.maxsize,
                self._max_bytes,
            )

    # -- the writer thread ------------------------------------------------------------------------

    def _run(self) -> None:
        writer: _Writer | None = None
        try:
            writer = _Writer(self.folder, self._header, self._input_rate, self._output_rate)
            self._drain(writer)
        except _WRITE_ERRORS as exc:
            self._fail(exc)
            self._discard_queue()
        except Exception:  # a bug must cost this recording only, never the gateway
            logger.exception("recording of session %s failed", self.session_id)
            self._failed = "internal error"
            self._discard_queue()
        finally:
            try:
                self._finish(writer)
            except Exception:
                logger.exception("finishing the recording of session %s failed", self.session_id)
            self._done.set()
            _LIVE.discard(self)
            if self._on_done is not None:
                try:
                    self._on_done(self)
                except Exception:
                    logger.exception("after the recording of session %s", self.session_id)

    def _drain(self, writer: _Writer) -> None:
        # The hooks and closed() all run on the event loop's thread, in order: once the end is
        # set, everything queued before it is in the queue, and nothing more is added.
        unflushed = 0
        while True:
            try:
                kind, now, payload = self._queue.get(timeout=1.0)
            except queue.Empty:
                if self._end is not None:
                    return
                continue
            if kind is not _Item.END:  # the end itself is read from self._end
                self._release(kind, payload)
                writer.handle(kind, now, payload)
            unflushed += 1
            if unflushed >= _BATCH or self._queue.empty():
                writer.flush()
                unflushed = 0
                if self._end is not None and self._queue.empty():
                    return

    def _release(self, kind: _Item, payload: object) -> None:
        size = 0
        if kind in (_Item.CALLER, _Item.ASSISTANT) and isinstance(payload, bytes):
            size = len(payload)
        elif kind is _Item.CLIENT and isinstance(payload, tuple):
            size = len(payload[0])
        elif kind is _Item.SERVER and isinstance(payload, tuple) and isinstance(payload[0], ev.AudioDelta):
            size = len(payload[0].audio)
        if size:
            with self._lock:
                self._queued_bytes -= size

    def _discard_queue(self) -> None:
        """After a failure: let queued items go (the hooks stop adding) until the session ends."""
        while self._end is None:
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=1.0)
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()

    def _fail(self, exc: Exception) -> None:
        self._failed = (exc.strerror if isinstance(exc, OSError) else None) or str(exc) or type(exc).__name__
        logger.error(
            "recording of session %s stopped: cannot write %s: %s; the recording is incomplete",
            self.session_id,
            self.folder,
            self._failed,
        )

    def _finish(self, writer: _Writer | None) -> None:
        with self._lock:
            dropped = self._dropped_total
        problems: list[str] = []
        if dropped:
            problems.append("queue_overflow")
        if self._failed is not None:
            problems.append(f"write_failed: {self._failed}")
        end = self._end
        record: dict[str, object] = {
            "kind": "end",
            "t": round(end[0], 6) if end else round(self._now(), 6),
            "reason": end[1] if end else "recording_stopped",
            "code": end[2] if end else None,
            "complete": not problems,
            "problems": problems,
            "dropped": dataclasses.asdict(dropped),
            "config": jsonable(end[3]) if end and end[3] is not None else None,
        }
        if writer is None:
            return
        try:
            writer.finish(record, failed=self._failed is not None)
        except _WRITE_ERRORS as exc:
            if self._failed is None:
                # Closing a track flushes what libsndfile held: the disk may fill only now.
                self._fail(exc)
                record.update(complete=False, problems=[*problems, f"write_failed: {self._failed}"])
                with contextlib.suppress(*_WRITE_ERRORS, ValueError):
                    writer.finish(record, failed=True)
            writer.abandon()


class _Writer:
    """The writer thread's side: the folder's three files, and where each track stands."""

    def __init__(self, folder: Path, header: Mapping[str, object], input_rate: int, output_rate: int) -> None:
        folder.mkdir(parents=True, exist_ok=False)
        self.caller = _Track(folder / CALLER_FILE, input_rate)
        self.assistant = _Track(folder / ASSISTANT_FILE, output_rate)
        self._log: IO[str] = open(folder / EVENTS_FILE, "w", encoding="utf-8")  # noqa: SIM115 - closed in finish()
        #: Where in the assistant track the reply audio the next audio event carries begins.
        self._assistant_mark: int | None = None
        self._write({**header, "kind": "session", "version": FORMAT_VERSION})

    def handle(self, kind: _Item, now: float, payload: Any) -> None:
        t = round(now, 6)
        if kind is _Item.CALLER:
            self.caller.write(payload)
        elif kind is _Item.ASSISTANT:
            if self._assistant_mark is None:
                self._assistant_mark = self.assistant.samples
            self.assistant.write(payload)
        elif kind is _Item.CLIENT:
            frame, commands, input_format = payload
            self._write(
                {"kind": "client", "dir": "in", "t": t, **self._client(frame, commands, input_format)}
            )
        elif kind is _Item.SERVER:
            event, sent = payload
            record: dict[str, object] = {"kind": "server", "dir": "out", "t": t, "type": event.type}
            record["event"] = self._server(event)
            if not sent:
                record["sent"] = False
            self._write(record)
        elif kind is _Item.GAP:
            dropped: _Dropped = payload
            # Silence where dropped audio was keeps both tracks on the session's timeline.
            self.caller.silence(dropped.caller_bytes // 2)
            self.assistant.silence(dropped.assistant_bytes // 2)
            self._write({"kind": "gap", "t": t, "dropped": dataclasses.asdict(dropped)})

    def flush(self) -> None:
        self._log.flush()

    def finish(self, end: Mapping[str, object], *, failed: bool) -> None:
        if failed:
            # The log may still take its end line where a track could not take audio.
            self.caller.abandon()
            self.assistant.abandon()
            self._write(end)
        else:
            self.caller.close()
            self.assistant.close()
            self._write(
                {**end, "caller_samples": self.caller.samples, "assistant_samples": self.assistant.samples}
            )
        self._log.close()

    def abandon(self) -> None:
        self.caller.abandon()
        self.assistant.abandon()
        if self._log.closed:
            return
        with contextlib.suppress(OSError):
            self._log.close()

    def _write(self, record: Mapping[str, object]) -> None:
        self._log.write(json.dumps(record, separators=(",", ":"), ensure_ascii=False) + "\n")

    def _server(self, event: ev.ServerEvent) -> Any:
        if not isinstance(event, ev.AudioDelta):
            return jsonable(event)
        mark, self._assistant_mark = self._assistant_mark, None
        body = jsonable(event)
        body["audio"] = {
            "$audio": {
                "track": "assistant",
                "bytes": len(event.audio),
                # A reply's last few ms come out of the client's resampler with no new engine audio.
                "offset": self.assistant.samples if mark is None else mark,
            }
        }
        return body

    def _client(
        self, frame: Frame, commands: tuple[Command, ...], input_format: AudioFormat
    ) -> dict[str, Any]:
        out: dict[str, Any] = {"commands": [command.type for command in commands]}
        refs: list[tuple[bytes, dict[str, object]]] = []
        offset = self.caller.samples
        for command in commands:
            if isinstance(command, InputAudioAppend):
                encoding = command.encoding or input_format.encoding
                rate = command.rate or input_format.rate
                ref = {
                    "track": "caller",
                    "bytes": len(command.audio),
                    "offset": offset,
                    "encoding": str(encoding),
                    "rate": rate,
                }
                refs.append((command.audio, {"$audio": ref}))
                # Several appends in one frame (a carrier's): each starts where the one before ends.
                width = encoding.bytes_per_sample
                offset += len(command.audio) // width * self.caller.rate // max(rate, 1)
        if isinstance(frame, bytes | bytearray):
            out["binary"] = refs[0][1] if refs else {"$bytes": len(frame)}
            return out
        # The payload comes out of the text before it is parsed: an append may hold 20 MB of base64,
        # and this thread shares the interpreter with the event loop.
        text, placeholders = frame, {}
        for index, (audio, ref) in enumerate(refs):
            payload, mark = f'"{base64.b64encode(audio).decode("ascii")}"', f"\x00audio{index}"
            if audio and payload in text:
                text = text.replace(payload, json.dumps(mark), 1)
                placeholders[mark] = ref
        try:
            data = json.loads(text)
        except ValueError:
            out["text"] = frame[:_MAX_RAW_TEXT]
            if len(frame) > _MAX_RAW_TEXT:
                out["text_chars"] = len(frame)
            return out
        if placeholders:
            data = _elide(data, placeholders)
        if refs and isinstance(data, dict) and isinstance(data.get("audio"), str) and data["audio"]:
            # A client that wrote its base64 its own way (line breaks, escaped slashes): still the payload.
            data["audio"] = refs[0][1]
        out["frame"] = data
        return out


def _elide(data: Any, payloads: Mapping[str, object]) -> Any:
    """``data`` with every string that is one of ``payloads``' keys replaced by its value."""
    if isinstance(data, str):
        return payloads.get(data, data)
    if isinstance(data, dict):
        return {key: _elide(value, payloads) for key, value in data.items()}
    if isinstance(data, list):
        return [_elide(value, payloads) for value in data]
    return data


# -- the gateway's recordings ----------------------------------------------------------------------


class Recordings:
    """Which sessions are recorded, where, and for how long they are kept (the ``recording:`` section).

    Nothing is created or deleted unless some session is to be recorded: ``recording.enabled``,
    or an API key with ``record: true``.
    """

    def __init__(self, settings: RecordingSettings, *, keys_record: bool = False) -> None:
        self.settings = settings
        self.directory = Path(settings.directory)
        #: Some session may be recorded (recording is on, or some key asks for it).
        self.active = settings.enabled or keys_record
        self._lock = threading.Lock()
        self._writing: set[str] = set()

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Recordings:
        return cls(settings.recording, keys_record=any(key.record for key in settings.auth.keys))

    def wants(self, principal: Principal | None) -> bool:
        """Whether a session of ``principal`` is recorded."""
        if not self.active:
            return False
        return self.settings.enabled or (principal is not None and principal.record)

    def start(
        self,
        session_id: str,
        *,
        principal: Principal | None,
        engine: EngineCapabilities,
        dialect: str,
        config: SessionConfig,
        endpoint: Mapping[str, object] | None = None,
    ) -> Recorder:
        """The recorder for a new session: a :class:`Recording`, or :data:`NO_RECORDER`."""
        if not self.wants(principal):
            return NO_RECORDER
        started = datetime.now(UTC)
        name = _folder_name(session_id, started)
        header = {
            "session_id": session_id,
            "started_at": started.isoformat().replace("+00:00", "Z"),
            "engine": engine.name,
            "engine_capabilities": jsonable(dict(engine.as_pairs())),
            "dialect": dialect,
            "endpoint": dict(endpoint or {}),
            "key": principal.name if principal is not None else None,
            "config": jsonable(config),
            "audio": {
                "caller": {"file": CALLER_FILE, "encoding": "pcm16", "rate": engine.input_rate},
                "assistant": {"file": ASSISTANT_FILE, "encoding": "pcm16", "rate": engine.output_rate},
            },
        }
        with self._lock:
            self._writing.add(name)
        return Recording(
            self.directory / name,
            header=header,
            input_rate=engine.input_rate,
            output_rate=engine.output_rate,
            queue_size=self.settings.queue_size,
            on_done=self._done,
        )

    def sweep(self) -> list[Path]:
        """Apply the retention limits now (the writers do after every recording)."""
        retention = self.settings.retention
        with self._lock:
            keep = frozenset(self._writing)
        deleted = sweep(
            self.directory,
            max_recordings=retention.max_recordings,
            max_bytes=retention.max_bytes,
            max_age_s=retention.max_age_s,
            keep=keep,
        )
        if deleted:
            logger.info("recording retention: deleted %d old recordings", len(deleted))
        return deleted

    def _done(self, recording: Recording) -> None:
        with self._lock:
            self._writing.discard(recording.folder.name)
        # One sweep at a time: two writers finishing together must not count each other's deletions.
        with _SWEEP_LOCK:
            self.sweep()


_SWEEP_LOCK = threading.Lock()
