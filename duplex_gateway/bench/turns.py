"""The bench's turn-taking part: ``server_vad`` against ``semantic_vad`` on the embedded engine.

Two callers, one per mode, talk in real time to one gateway with the ``embedded`` engine, each
with an open microphone (a 20 ms frame every 20 ms, silence between sentences), and say the
turn-taking test set (``tests/fixtures/turns/``, read from the checkout as
:func:`~duplex_gateway.bench.audio.default_speech_path` reads its recording):

* **Paused sentences**, both callers at once, replies off: a sentence with a 0.8-1.0 s pause
  after a word no sentence ends on. A turn that ends before the sentence does cut the caller off.
* **Complete sentences**, the two callers taking turns (one reply in the making at a time),
  after one untimed reply each: from the end of the caller's speech (the frame holding its last
  sample, sent) to the reply's first audio at the client; the reply is then cancelled. Each
  reply's ``turn.latency`` names the silence the gateway chose to wait (``turn_detection``) and
  the end-of-turn model's time for the judgement that ended the turn (``turn_model``).

:func:`measure` returns per-sentence results as plain data; :func:`summarize_turns` turns them
into the numbers the report prints and checks against issue 23's goals (:data:`GOALS`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from duplex_gateway.bench.audio import FRAME_MS, _append
from duplex_gateway.bench.metrics import LoopLag, percentile, summarize
from duplex_gateway.bench.targets import Target, TargetUnavailable, start

__all__ = [
    "GOALS",
    "MODES",
    "TURN_TAKING",
    "Sentence",
    "default_turns_dir",
    "find_pause",
    "load_turn_set",
    "measure",
    "summarize_turns",
]

#: The name that selects this part (``--targets``).
TURN_TAKING: Final = "turn-taking"
#: The two modes compared, as each caller's ``turn_detection`` says them (issue 23's settings).
MODES: Final[Mapping[str, Mapping[str, Any]]] = {
    "server_vad": {"type": "server_vad", "silence_duration_ms": 500},
    "semantic_vad": {"type": "semantic_vad", "eagerness": "auto"},
}
RATE: Final = 24_000
#: Silence before each sentence, so that every turn starts from quiet.
LEAD_MS: Final = 600
#: How long a caller stays quiet for its turn to end after a sentence: semantic_vad's longest
#: wait at auto (4 s) and some.
END_WAIT_S: Final = 5.5
#: How long a caller waits for a reply (its creation, its first audio, its end after the cancel).
REPLY_WAIT_S: Final = 15.0
_SETUP_TIMEOUT_S: Final = 30.0
#: The files' sample rate (mono PCM16 FLAC).
_FILE_RATE: Final = 16_000
#: The shortest run of digital silence that counts as a sentence's stretched pause.
_MIN_PAUSE_MS: Final = 300

#: Issue 23's bounds.
MAX_RATIO: Final = 0.75
MAX_SEMANTIC_P50_MS: Final = 450.0

TARGET: Final = Target(
    TURN_TAKING,
    "gateway, engine embedded: server_vad (500 ms) and semantic_vad (auto)",
    "realtime",
    "vad",
    RATE,
    (len(MODES),),
    0.0,
    ready_timeout_s=180.0,
    engine="embedded",
)


def default_turns_dir() -> Path:
    """The turn-taking test set committed with the tests, when the bench runs from a checkout."""
    return Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "turns"


@dataclass(frozen=True)
class Sentence:
    """One recorded sentence as ready-to-send append messages at :data:`RATE` (PCM16, 20 ms each)."""

    name: str
    #: ``paused`` or ``complete``.
    kind: str
    frames: tuple[str, ...]
    #: The recording's length: where the caller's speech ends.
    duration_ms: int
    #: The pause's digital silence, from the start (paused sentences only).
    pause_ms: tuple[int, int] | None = None


def find_pause(pcm: np.ndarray[Any, np.dtype[np.int16]], rate: int) -> tuple[int, int] | None:
    """The longest run of digital silence (exact zeros) in ``pcm``, in ms; None if under 300 ms.

    The set's paused sentences had their pause replaced by digital silence, which nothing else
    in a recording holds for more than a few milliseconds.
    """
    quiet = np.concatenate([[0], (pcm == 0).astype(np.int8), [0]])
    edges = np.diff(quiet)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    if starts.size == 0:
        return None
    longest = int(np.argmax(ends - starts))
    begin, end = int(starts[longest]), int(ends[longest])
    if (end - begin) * 1000 < _MIN_PAUSE_MS * rate:
        return None
    return round(begin * 1000 / rate), round(end * 1000 / rate)


def _sentence(path: Path, kind: str) -> Sentence:
    import soundfile as sf
    import soxr

    pcm, native = sf.read(path, dtype="int16", always_2d=False)
    if native != _FILE_RATE or pcm.ndim != 1:
        raise ValueError(f"{path}: expected mono {_FILE_RATE} Hz, got {native} Hz, shape {pcm.shape}")
    pause = find_pause(pcm, native) if kind == "paused" else None
    if kind == "paused" and pause is None:
        raise ValueError(f"{path}: no pause of digital silence in a paused sentence")
    samples = soxr.resample(pcm.astype(np.float32) / 32768.0, native, RATE, quality="HQ")
    out = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    step = RATE * FRAME_MS // 1000
    out = np.concatenate([out, np.zeros((-len(out)) % step, dtype="<i2")])
    return Sentence(
        name=path.stem,
        kind=kind,
        frames=tuple(_append(out[i : i + step].tobytes()) for i in range(0, len(out), step)),
        duration_ms=round(len(pcm) * 1000 / native),
        pause_ms=pause,
    )


def load_turn_set(
    directory: Path | None = None, *, limit: int | None = None
) -> tuple[list[Sentence], list[Sentence]]:
    """The paused and the complete sentences of the set in ``directory`` (``paused_*.flac``, ``complete_*.flac``)."""
    folder = directory or default_turns_dir()
    sets = []
    for kind in ("paused", "complete"):
        paths = sorted(folder.glob(f"{kind}_*.flac"))[:limit]
        if not paths:
            raise TargetUnavailable(f"no {kind}_*.flac in {folder} (the bench runs from a checkout)")
        sets.append([_sentence(p, kind) for p in paths])
    return sets[0], sets[1]


# -- one caller ----------------------------------------------------------------------------------


@dataclass
class _Clip:
    frames: deque[str]
    #: The session's input clock (ms) when the clip's first speech frame went out.
    start_ms: int | None = None
    lead: int = 0
    done: asyncio.Future[float] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class _Caller:
    """One session with an open microphone: a frame every 20 ms, and every event with its arrival."""

    def __init__(self, url: str, mode: str) -> None:
        self.url = url
        self.mode = mode
        self.events: list[tuple[float, dict[str, Any]]] = []
        #: Audio sent: the gateway's input clock.
        self.input_ms = 0
        self.frames = 0
        self.late_frames = 0
        self.errors: Counter[str] = Counter()
        self._ws: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._arrived = asyncio.Event()
        self._clip: _Clip | None = None
        self._silence = _append(bytes(RATE * FRAME_MS // 1000 * 2))

    async def open(self, turn_detection: Mapping[str, Any]) -> None:
        from websockets.asyncio.client import connect

        self._ws = await asyncio.wait_for(
            connect(self.url, max_size=None, ping_interval=None, compression=None), _SETUP_TIMEOUT_S
        )
        self._tasks.append(asyncio.create_task(self._read(), name=f"bench:turns-reader:{self.mode}"))
        if await self.wait("session.created", 0, _SETUP_TIMEOUT_S) is None:
            raise TargetUnavailable(f"{self.mode}: no session.created; errors {dict(self.errors)}")
        mark = self.index()
        session = {
            "type": "realtime",
            "include": ["turn.latency"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": RATE},
                    "turn_detection": dict(turn_detection),
                    "transcription": {"model": "whisper-1"},
                },
                "output": {"format": {"type": "audio/pcm", "rate": RATE}},
            },
        }
        await self.send({"type": "session.update", "session": session})
        if await self.wait("session.updated", mark, _SETUP_TIMEOUT_S) is None:
            raise TargetUnavailable(f"{self.mode}: no session.updated; errors {dict(self.errors)}")
        self._tasks.append(asyncio.create_task(self._microphone(), name=f"bench:turns-mic:{self.mode}"))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._ws.close(), 5)

    async def send(self, event: dict[str, Any]) -> None:
        await self._ws.send(json.dumps(event))

    async def _read(self) -> None:
        # perf_counter, not loop.time(): uvloop's clock ticks in whole milliseconds.
        try:
            async for message in self._ws:
                event = json.loads(message)
                if not isinstance(event, dict):
                    continue
                if event.get("type") == "error":
                    error = event.get("error") or {}
                    code = str(error.get("code") or error.get("type") or "error")
                    # A cancel that crossed the reply's own end on the wire is a race, not a fault.
                    if code != "response_cancel_not_active":
                        self.errors[code] += 1
                self.events.append((time.perf_counter(), event))
                self._arrived.set()
        except Exception as exc:  # noqa: BLE001 - a dropped connection is a result
            self.errors[f"connection:{type(exc).__name__}"] += 1
        self._arrived.set()

    async def _microphone(self) -> None:
        # Each frame goes out once its 20 ms have been "heard", on a fixed schedule: a late
        # frame is sent at once, so the input clock never drifts from the wall clock.
        clock = time.perf_counter
        due = clock()
        while True:
            due += FRAME_MS / 1000.0
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            elif -delay * 1000.0 > FRAME_MS:
                self.late_frames += 1
            clip = self._clip
            frame = clip.frames.popleft() if clip is not None and clip.frames else self._silence
            if clip is not None and clip.start_ms is None and clip.lead == 0:
                clip.start_ms = self.input_ms
            elif clip is not None and clip.lead:
                clip.lead -= 1
            try:
                await self._ws.send(frame)
            except Exception as exc:  # noqa: BLE001 - the caller waiting on the clip is told
                self.errors[f"connection:{type(exc).__name__}"] += 1
                if clip is not None and not clip.done.done():
                    clip.done.set_exception(
                        TargetUnavailable(f"{self.mode}: the connection dropped ({exc!r})")
                    )
                return
            self.input_ms += FRAME_MS
            self.frames += 1
            if clip is not None and not clip.frames:
                self._clip = None
                if not clip.done.done():
                    clip.done.set_result(clock())

    async def say(self, sentence: Sentence) -> tuple[int, float]:
        """Say ``sentence`` after :data:`LEAD_MS` of silence: where it started on the input clock,
        and when (``perf_counter``) the frame holding its last sample went out."""
        lead = [self._silence] * (LEAD_MS // FRAME_MS)
        clip = _Clip(frames=deque([*lead, *sentence.frames]), lead=len(lead))
        mic = self._tasks[-1]
        if mic.done():
            raise TargetUnavailable(f"{self.mode}: the connection dropped")
        self._clip = clip
        spoken_at = await clip.done
        assert clip.start_ms is not None
        return clip.start_ms, spoken_at

    def index(self) -> int:
        return len(self.events)

    def find(
        self, kind: str, start: int, where: Callable[[dict[str, Any]], bool] = lambda e: True
    ) -> int | None:
        for i in range(start, len(self.events)):
            event = self.events[i][1]
            if event.get("type") == kind and where(event):
                return i
        return None

    async def wait(
        self,
        kind: str,
        start: int,
        within_s: float,
        where: Callable[[dict[str, Any]], bool] = lambda e: True,
    ) -> int | None:
        """Index of the first ``kind`` event from ``start`` that satisfies ``where``; None after ``within_s``."""
        deadline = time.perf_counter() + within_s
        while (found := self.find(kind, start, where)) is None:
            left = deadline - time.perf_counter()
            if left <= 0 or (self._tasks and self._tasks[0].done()):
                return None
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)
        return found

    def stops(self, start: int) -> list[int]:
        """``audio_end_ms`` of every turn that ended since event ``start``."""
        return [
            int(e["audio_end_ms"])
            for _, e in self.events[start:]
            if e.get("type") == "input_audio_buffer.speech_stopped"
        ]


# -- the two sets --------------------------------------------------------------------------------


async def _paused(
    caller: _Caller, sentences: Sequence[Sentence], tick: Callable[[], None]
) -> list[dict[str, Any]]:
    results = []
    for sentence in sentences:
        assert sentence.pause_ms is not None
        mark = caller.index()
        start_ms, _ = await caller.say(sentence)
        end_ms = start_ms + sentence.duration_ms
        await caller.wait(
            "input_audio_buffer.speech_stopped",
            mark,
            END_WAIT_S,
            lambda e: e["audio_end_ms"] > end_ms,  # noqa: B023 - awaited within the iteration
        )
        stops = caller.stops(mark)
        pause_at = start_ms + sentence.pause_ms[0]
        results.append(
            {
                "sentence": sentence.name,
                "pause_ms": list(sentence.pause_ms),
                # Where each turn that ended inside the sentence ended, from the pause's start.
                "early_stops_ms": [ms - pause_at for ms in stops if ms <= end_ms],
                # Where the turn ended after the sentence, from its end; None: it never did.
                "end_ms": next((ms - end_ms for ms in stops if ms > end_ms), None),
            }
        )
        tick()
    return results


async def _answer(caller: _Caller, sentence: Sentence) -> dict[str, Any]:
    mark = caller.index()
    start_ms, spoken_at = await caller.say(sentence)
    end_ms = start_ms + sentence.duration_ms
    stopped = await caller.wait(
        "input_audio_buffer.speech_stopped", mark, END_WAIT_S, lambda e: e["audio_end_ms"] > end_ms
    )
    # Turns that ended inside the sentence: a complete one has no pause, so this should be none.
    result: dict[str, Any] = {
        "sentence": sentence.name,
        "early_stops": sum(ms <= end_ms for ms in caller.stops(mark)),
    }
    if stopped is None:
        return {**result, "failed": "no turn end"}
    created = await caller.wait("response.created", stopped, REPLY_WAIT_S)
    if created is None:
        return {**result, "failed": "no reply"}
    rid = caller.events[created][1]["response"]["id"]
    first = await caller.wait(
        "response.output_audio.delta", created, REPLY_WAIT_S, lambda e: e.get("response_id") == rid
    )
    if first is None:
        return {**result, "failed": "no reply audio"}
    await caller.send({"type": "response.cancel", "response_id": rid})
    done = await caller.wait("response.done", created, REPLY_WAIT_S, lambda e: e["response"]["id"] == rid)
    latency = caller.find("turn.latency", created, lambda e: e.get("response_id") == rid)
    stages: dict[str, float] = {}
    if latency is not None:
        event = caller.events[latency][1]
        stages = {str(s["name"]): float(s["ms"]) for s in event["stages"]}
        stages["total"] = float(event["total_ms"])
    return {
        **result,
        "failed": None if done is not None else "no response.done after the cancel",
        # Where the turn ended on the input clock, after the speech (server_vad: its silence and the VAD's lag).
        "judged_ms": int(caller.events[stopped][1]["audio_end_ms"]) - end_ms,
        "turn_end_ms": round((caller.events[stopped][0] - spoken_at) * 1000.0, 1),
        "first_audio_ms": round((caller.events[first][0] - spoken_at) * 1000.0, 1),
        "stages": stages,
    }


async def measure(
    workdir: Path,
    *,
    limit: int | None = None,
    directory: Path | None = None,
    progress: Callable[[str], None] = lambda text: None,
) -> dict[str, Any]:
    """Start a gateway with the embedded engine, run both sets in real time; the raw results.

    Raises :class:`~duplex_gateway.bench.targets.TargetUnavailable` when the gateway or the
    test set is not there.
    """
    paused, complete = load_turn_set(directory, limit=limit)
    started = time.monotonic()
    lag = LoopLag()
    errors: dict[str, Counter[str]] = {mode: Counter() for mode in MODES}
    frames = late = 0
    # Room for both sets' sessions: those of the paused set may linger a moment after they close.
    with start(TARGET, workdir, max_callers=2 * len(MODES)) as server:

        @contextlib.asynccontextmanager
        async def callers(create_response: bool) -> AsyncIterator[dict[str, _Caller]]:
            nonlocal frames, late
            group = {mode: _Caller(server.ws_url, mode) for mode in MODES}
            try:
                for mode, caller in group.items():
                    await caller.open({**MODES[mode], "create_response": create_response})
                yield group
            finally:
                for mode, caller in group.items():
                    await caller.close()
                    errors[mode].update(caller.errors)
                    frames, late = frames + caller.frames, late + caller.late_frames

        done = Counter[str]()

        def tick(kind: str, total: int) -> Callable[[], None]:
            def step() -> None:
                done[kind] += 1
                progress(f"[bench] {TURN_TAKING}: {kind} {done[kind]}/{total}")

            return step

        lag.start()
        try:
            step = tick("paused sentences", len(paused) * len(MODES))
            async with callers(create_response=False) as group:
                by_mode = await asyncio.gather(*(_paused(c, paused, step) for c in group.values()))
            paused_results = dict(zip(group, by_mode, strict=True))
            complete_results: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
            step = tick("complete sentences", len(complete) * len(MODES))
            async with callers(create_response=True) as group:
                # One untimed reply each first: a session's first reply pays for warming up what the
                # paused set did not use (speech synthesis), whichever mode goes first.
                for caller in group.values():
                    await _answer(caller, complete[0])
                # Turn about: one reply in the making at a time, so neither caller's reply slows the other's.
                for sentence in complete:
                    for mode, caller in group.items():
                        complete_results[mode].append(await _answer(caller, sentence))
                        step()
        finally:
            await lag.stop()
        if not server.alive():
            raise TargetUnavailable(f"exited during the run:\n{server.log_tail()}")
    return {
        "target": TURN_TAKING,
        "title": TARGET.title,
        "modes": {mode: dict(td) for mode, td in MODES.items()},
        "lead_ms": LEAD_MS,
        "input_rate": RATE,
        "paused": paused_results,
        "complete": complete_results,
        "errors": {mode: dict(counts) for mode, counts in errors.items()},
        "frames": frames,
        "late_frames": late,
        "client_loop_lag_ms": summarize(lag.samples_ms),
        "wall_s": round(time.monotonic() - started, 1),
    }


# -- what the numbers say ------------------------------------------------------------------------


def _p(values: Sequence[float], q: float) -> float | None:
    value = percentile(values, q)
    return None if value is None else round(value, 1)


def _spread(values: Sequence[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": _p(values, 50), "p90": _p(values, 90)}


def _engine_ms(stages: Mapping[str, float]) -> float | None:
    # What the reply took after the turn's commit: the total less the gateway's wait and judgement.
    if "total" not in stages:
        return None
    return stages["total"] - stages.get("turn_detection", 0.0) - stages.get("turn_model", 0.0)


def _mode_summary(
    paused: Sequence[Mapping[str, Any]], complete: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    answered = [r for r in complete if not r.get("failed") and r.get("first_audio_ms") is not None]
    stages = [r["stages"] for r in answered if r.get("stages")]
    # ``turn_detection`` is the silence the gateway waited for (the judgement that ended the turn
    # came after it); ``turn_model`` is that judgement's time, reported apart.
    waits = [s["turn_detection"] for s in stages if "turn_detection" in s]
    engine = [v for s in stages if (v := _engine_ms(s)) is not None]
    return {
        "paused": len(paused),
        "paused_cut": [r["sentence"] for r in paused if r["early_stops_ms"]],
        "paused_unended": [r["sentence"] for r in paused if r["end_ms"] is None],
        "complete": len(complete),
        "complete_cut": [r["sentence"] for r in complete if r.get("early_stops")],
        "complete_failed": {r["sentence"]: r["failed"] for r in complete if r.get("failed")},
        "first_audio_ms": _spread([r["first_audio_ms"] for r in answered]),
        "turn_end_ms": _spread([r["turn_end_ms"] for r in answered]),
        "wait_ms": _spread(waits),
        "turn_model_ms": _spread([s["turn_model"] for s in stages if "turn_model" in s]),
        "engine_ms": _spread(engine),
    }


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else round(a / b, 2)


#: Issue 23's goals: (what, check of the summary -> (this run, met; None: not measured)).
GOALS: Final[list[tuple[str, Callable[[Mapping[str, Any]], tuple[str, bool | None]]]]] = []


def _goal(what: str) -> Callable[[Any], Any]:
    def register(fn: Any) -> Any:
        GOALS.append((what, fn))
        return fn

    return register


@_goal("semantic_vad (auto) cuts no paused sentence in its pause")
def _no_cut(summary: Mapping[str, Any]) -> tuple[str, bool | None]:
    mode = summary["modes"].get("semantic_vad")
    if not mode or not mode["paused"]:
        return "not measured", None
    cut = len(mode["paused_cut"])
    return f"{cut} of {mode['paused']} cut", cut == 0


@_goal(f"complete sentences: first reply audio p50, semantic_vad / server_vad ≤ {MAX_RATIO}")
def _faster(summary: Mapping[str, Any]) -> tuple[str, bool | None]:
    ratio = summary["ratio"]["first_audio_p50"]
    if ratio is None:
        return "not measured", None
    return f"{ratio:.2f}×", ratio <= MAX_RATIO


@_goal(f"engine embedded, semantic_vad: first reply audio p50 ≤ {MAX_SEMANTIC_P50_MS:.0f} ms")
def _fast(summary: Mapping[str, Any]) -> tuple[str, bool | None]:
    mode = summary["modes"].get("semantic_vad")
    p50 = mode["first_audio_ms"]["p50"] if mode else None
    if p50 is None:
        return "not measured", None
    return f"{p50:.0f} ms", p50 <= MAX_SEMANTIC_P50_MS


def summarize_turns(data: Mapping[str, Any]) -> dict[str, Any]:
    """Per mode: paused sentences cut and the spreads of the complete ones; the ratios; the goals."""
    modes = {
        mode: _mode_summary(data["paused"].get(mode, []), data["complete"].get(mode, []))
        for mode in data["modes"]
        if mode in data["paused"] or mode in data["complete"]
    }
    sem, srv = modes.get("semantic_vad"), modes.get("server_vad")
    summary: dict[str, Any] = {
        "modes": modes,
        "ratio": {
            q: _ratio(
                sem["first_audio_ms"][k] if sem else None,
                srv["first_audio_ms"][k] if srv else None,
            )
            for q, k in (("first_audio_p50", "p50"), ("first_audio_p90", "p90"))
        },
    }
    summary["goals"] = [(what, *check(summary)) for what, check in GOALS]
    return summary
