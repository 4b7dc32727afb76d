"""Backchannels and interruptions over a reply, on a real gateway with the embedded engine, in real time.

A caller asks for a reply several seconds long (a typed question the offline responder restates),
then, a second into the reply's audio, says one clip of the overlap test set
(:mod:`tests.fixtures.overlap_set`) into the gateway as a microphone would: 20 ms frames of
24 kHz PCM16, each sent once it has been "heard", silence before and after. The client is a
standard Realtime client: it plays the reply's audio in real time from its first delta and stops
playback at ``input_audio_buffer.speech_started`` or at a cancelled ``response.done``.

* Backchannels ("yeah", "uh huh", "mm hmm"): under ``semantic_vad`` (the backchannel policy by
  default) no reply may be cancelled, every one completes, and the short speech starts no turn.
  The same clips under ``server_vad`` (OpenAI's rule: every speech start interrupts) cancel
  nearly every reply, which is what shows they are a test at all.
* Interruptions ("Wait, that's not what I asked."): the reply's audible end (where the client's
  playback stopped: ``speech_started`` arriving, or its buffer running dry) must come at most
  600 ms after the interruption's onset (when its first frame was sent), every time.

Every clip is measured once for the module (under semantic_vad a session for the backchannels and one
for the interruptions, under server_vad one); the tables are
printed (``pytest -s``) with the gateway's own account of the speech over the reply
(``overlap.decision``: where it began and ended on the input clock). The audible end of an
interruption is measured for two clients: one that pauses its playback at the hold
(``overlap.decision`` ``pause``, which a phone call or a Live session gets from the gateway's own
pacing); and one that stops only at ``speech_started``, as OpenAI's SDKs do. The verdict takes
longer than the bound (the longer backchannels are voiced nearly as long as an interruption's
first words), so the second client meets it because the hold stops the reply's audio at the
gateway: what it still plays is the engine's lead (``engine.embedded.lead_ms``, 200 ms).
"""

# ruff: noqa: T201
from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.e2e.helpers import Gateway, GatewayFactory, b64, encode, ws_connect
from tests.fixtures.overlap_set import BACKCHANNELS, INTERRUPTIONS, Overlap

pytestmark = pytest.mark.e2e

RATE = 24_000
FRAME_MS = 20
FRAME_SAMPLES = RATE * FRAME_MS // 1000
#: Reply audio bytes per millisecond (PCM16 at 24 kHz).
BYTES_PER_MS = RATE * 2 // 1000
#: What the caller asks (typed): the offline responder restates it, a reply of about 4 s.
PROMPT = "Please tell me the opening hours of the public library on weekdays."
#: How far into the reply's playback the caller speaks.
INTO_REPLY_MS = 1_000
#: The issue's bounds: no backchannel cancels a reply; every interruption is heard to stop within this.
AUDIBLE_END_BOUND_MS = 600
#: Backchannels server_vad may let through uncancelled and the set still be a test.
SERVER_VAD_SPARED = 2
#: The issue's "over >= 12 backchannels".
MIN_BACKCHANNELS = 12
#: How far a resumed reply's audio may differ from the reply alone (Piper's takes vary by 1-2 %).
AUDIO_TOLERANCE = 0.05
SEMANTIC = {"type": "semantic_vad", "create_response": False}
SERVER = {"type": "server_vad", "create_response": False}
#: The gateway's backchannel rule (``session.backchannels``): its defaults.
BACKCHANNEL_SETTINGS: dict[str, Any] = {}
REPLY_WAIT_S = 20.0
#: The longest wait for the caller's turn to end after speech (semantic_vad's longest wait, and some).
TURN_END_WAIT_S = 8.0
#: Quiet after a trial during which a backchannel must still have started no turn.
SETTLE_S = 0.5


@pytest.fixture(scope="module")
def gateway(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {
            "server": {"web_demo": False},
            "engine": {"name": "embedded"},
            "limits": {"max_sessions": 4},
            "session": {"backchannels": BACKCHANNEL_SETTINGS},
        },
        name="backchannels",
    )


def play_out(
    chunks: list[tuple[float, float]], stop: float | None = None, since: float | None = None
) -> tuple[float | None, float]:
    """A real-time player fed ``chunks`` (arrival, ms), stopped at ``stop``: when it went quiet, and its gaps.

    Playback starts with the first chunk; a chunk that arrives after the buffer ran dry restarts
    it (a gap: silence inside the reply; counted in ms, only where it began at or after ``since``).
    Chunks arriving at or after ``stop`` are never played.
    """
    playing_to: float | None = None
    gaps_ms = 0.0
    for arrival, ms in chunks:
        if stop is not None and arrival >= stop:
            break
        if playing_to is None:
            playing_to = arrival
        elif arrival > playing_to:
            if since is None or playing_to >= since:
                gaps_ms += (arrival - playing_to) * 1000
            playing_to = arrival
        playing_to += ms / 1000
    if playing_to is None or stop is None:
        return playing_to, gaps_ms
    return min(stop, playing_to), gaps_ms


def played_ms(chunks: list[tuple[float, float]], now: float) -> float:
    """How much of ``chunks`` a real-time player has played by ``now``."""
    arrived = [(t, ms) for t, ms in chunks if t <= now]
    end, _ = play_out(arrived)
    if end is None:
        return 0.0
    return sum(ms for _, ms in arrived) - max(0.0, end - now) * 1000


@dataclass(frozen=True)
class Sent:
    """When a frame of the caller's went out (loop time), and where it starts on the input clock (ms)."""

    at: float
    audio_ms: int


@dataclass
class Caller:
    """One Realtime session: a microphone on a fixed 20 ms clock, and every event with its arrival."""

    ws: Any
    name: str
    events: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    #: Frames waiting to go out (silence when none), each with the future its sending settles.
    _pending: collections.deque[tuple[npt.NDArray[np.float32], asyncio.Future[Sent] | None]] = field(
        default_factory=collections.deque
    )
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def read(self) -> None:
        loop = asyncio.get_running_loop()
        async for message in self.ws:
            self.events.append((loop.time(), json.loads(message)))
            self._arrived.set()

    async def microphone(self) -> None:
        """A frame every 20 ms, each sent once its 20 ms have been heard: the caller's speech, else silence."""
        loop = asyncio.get_running_loop()
        silence = np.zeros(FRAME_SAMPLES, dtype=np.float32)
        start, sent = loop.time(), 0
        while True:
            delay = start + (sent + 1) * FRAME_MS / 1000 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            frame, sending = self._pending.popleft() if self._pending else (silence, None)
            message = {"type": "input_audio_buffer.append", "audio": b64(encode(frame))}
            await self.ws.send(json.dumps(message))
            if sending is not None:
                sending.set_result(Sent(loop.time(), sent * FRAME_MS))
            sent += 1

    async def say(self, samples: npt.NDArray[np.float32]) -> tuple[Sent, Sent]:
        """Speak ``samples`` (at :data:`RATE`) from the next frame on: its first frame sent, and its last."""
        loop = asyncio.get_running_loop()
        padded = np.concatenate([samples, np.zeros(-samples.size % FRAME_SAMPLES, dtype=np.float32)])
        frames = list(padded.reshape(-1, FRAME_SAMPLES))
        first: asyncio.Future[Sent] = loop.create_future()
        last: asyncio.Future[Sent] = loop.create_future()
        self._pending.append((frames[0], first))
        self._pending.extend((frame, None) for frame in frames[1:-1])
        self._pending.append((frames[-1], last) if len(frames) > 1 else (np.zeros_like(frames[0]), last))
        return await first, await last

    async def quiet(self, seconds: float) -> None:
        """Let the microphone send silence for ``seconds``."""
        await asyncio.sleep(seconds)

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    def index(self) -> int:
        return len(self.events)

    def first(self, start: int, match: Callable[[dict[str, Any]], bool]) -> int | None:
        return next((i for i in range(start, len(self.events)) if match(self.events[i][1])), None)

    async def wait(
        self, start: int, match: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> int:
        """Index of the first event at or after ``start`` that ``match`` accepts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while (found := self.first(start, match)) is None:
            remaining = deadline - loop.time()
            if remaining <= 0:
                seen = [e.get("type") for _, e in self.events[start:]][-20:]
                raise AssertionError(f"{self.name}: no {what} within {timeout} s; saw {seen}")
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), remaining)
        return found

    def chunks(self, start: int, response_id: str) -> list[tuple[float, float]]:
        """The reply's audio deltas since event ``start``: (arrival, ms)."""
        return [
            (t, len(base64.b64decode(e["delta"])) / BYTES_PER_MS)
            for t, e in self.events[start:]
            if e.get("type") == "response.output_audio.delta" and e.get("response_id") == response_id
        ]

    def of(self, start: int, kind: str) -> list[tuple[float, dict[str, Any]]]:
        """Events of type ``kind`` since event ``start``, with their arrival."""
        return [(t, e) for t, e in self.events[start:] if e.get("type") == kind]

    def errors(self) -> list[dict[str, Any]]:
        return [e for _, e in self.events if e.get("type") == "error"]


@contextlib.asynccontextmanager
async def caller(gateway: Gateway, name: str, turn_detection: dict[str, Any]) -> AsyncIterator[Caller]:
    """A session with ``turn_detection`` that reports its overlap decisions, its microphone running."""
    async with ws_connect(gateway) as ws:
        session = Caller(ws, name)
        reader = asyncio.create_task(session.read())
        microphone: asyncio.Task[None] | None = None
        try:
            await session.wait(0, lambda e: e.get("type") == "session.created", 10, "session.created")
            start = session.index()
            await session.send(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "include": ["overlap.decision"],
                        "audio": {"input": {"turn_detection": turn_detection}},
                    },
                }
            )
            await session.wait(start, lambda e: e.get("type") == "session.updated", 10, "session.updated")
            microphone = asyncio.create_task(session.microphone())
            yield session
            assert not session.errors(), session.errors()
        finally:
            for task in (microphone, reader):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task


@dataclass
class Trial:
    """One reply and the caller's speech over it (none for the reference reply)."""

    clip: Overlap | None
    status: str
    #: Reply audio the client received, all of it.
    audio_ms: float
    #: The caller's speech: its first frame sent and its last (None for the reference reply).
    onset: Sent | None
    said_end: Sent | None
    #: When ``speech_started`` reached the client after the onset (None: it never did).
    speech_started: float | None
    done: float
    #: Where the client's playback went quiet for good, and the silences (ms) inside the reply it
    #: played from the caller's onset on (a hold that outlasts the client's buffer).
    audible_end: float
    gaps_ms: float
    #: The gateway's ``overlap.decision`` events for the reply, and when each arrived.
    decisions: list[dict[str, Any]]
    decided_at: list[float]
    #: The words of the reply's audio (``response.output_audio_transcript.done``; "" if none came).
    transcript: str
    #: Whether the caller's speech started a turn (``speech_started``), and was committed as one,
    #: by the time the trial was over.
    turn: bool = False
    committed: bool = False
    #: How many turns the caller's speech started (a pause inside a clip can end one early).
    turns: int = 0

    @property
    def cancelled(self) -> bool:
        return self.status == "cancelled"

    @property
    def audible_end_ms(self) -> float | None:
        """From the caller's onset (its first frame sent) to the reply's audible end."""
        return None if self.onset is None else (self.audible_end - self.onset.at) * 1000

    @property
    def paused_end_ms(self) -> float | None:
        """From the onset to the audible end for a client that pauses its playback at ``overlap.decision``
        ``pause`` (and resumes it at ``resume``): the hold's first pause, unless the reply resumed before
        the cut (then the last pause: the caller heard it again in between). None: it was never paused."""
        if self.onset is None:
            return None
        pauses = [
            t for t, d in zip(self.decided_at, self.decisions, strict=True) if d.get("action") == "pause"
        ]
        if not pauses:
            return None
        at = pauses[0] if "resume" not in self.actions else pauses[-1]
        return (min(at, self.audible_end) - self.onset.at) * 1000

    def timeline(self) -> str:
        """Where the reply and the caller's speech were, in ms from the speech's first frame."""
        if self.onset is None:
            return f"{self.status}, no speech"
        at = self.onset.at
        return (
            f"{self.status}: {self.audio_ms:.0f} ms of reply audio, heard to {(self.audible_end - at) * 1000:+.0f}, "
            f"done {(self.done - at) * 1000:+.0f}, speech ended {(self.said_end.at - at) * 1000 if self.said_end else 0:+.0f}, "
            f"speech_started {'-' if self.speech_started is None else f'{(self.speech_started - at) * 1000:+.0f}'}, "
            f"turns {self.turns}, committed {self.committed}, decisions {self.decided()}"
        )

    @property
    def actions(self) -> list[str]:
        return [str(d.get("action")) for d in self.decisions]

    def decided(self) -> str:
        """The decisions as ``action[start..end]``, in ms of input from the speech's first frame."""
        base = 0 if self.onset is None else self.onset.audio_ms
        parts = []
        for d in self.decisions:
            start, end = d.get("audio_start_ms"), d.get("audio_end_ms")
            where = "" if start is None else f"{start - base}" + ("" if end is None else f"..{end - base}")
            parts.append(f"{d.get('action')}[{where}]")
        return " ".join(parts) or "-"


async def reply_with(session: Caller, clip: Overlap | None) -> Trial:
    """Ask for the reply; :data:`INTO_REPLY_MS` into its playback say ``clip``; follow the reply to its end."""
    loop = asyncio.get_running_loop()
    start = session.index()
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": PROMPT}]}
    await session.send({"type": "conversation.item.create", "item": item})
    await session.send({"type": "response.create"})
    created = await session.wait(start, lambda e: e.get("type") == "response.created", 10, "response.created")
    response_id = session.events[created][1]["response"]["id"]
    onset = said_end = None
    if clip is not None:
        deadline = loop.time() + REPLY_WAIT_S
        while played_ms(session.chunks(created, response_id), loop.time()) < INTO_REPLY_MS:
            assert loop.time() < deadline, f"{session.name}: the reply never played {INTO_REPLY_MS} ms"
            await asyncio.sleep(0.005)
        onset, said_end = await session.say(clip.load(RATE))
    done = await session.wait(
        created,
        lambda e: e.get("type") == "response.done" and e["response"]["id"] == response_id,
        REPLY_WAIT_S,
        "response.done",
    )
    done_at, done_event = session.events[done]
    status = str(done_event["response"]["status"])
    started = None
    if onset is not None:
        started = next(
            (t for t, _ in session.of(start, "input_audio_buffer.speech_started") if t >= onset.at), None
        )
    # A Realtime client stops its playback at speech_started, or at the reply's cancellation.
    stops = [t for t in (started, done_at if status == "cancelled" else None) if t is not None]
    chunks = session.chunks(created, response_id)
    audible_end, gaps_ms = play_out(
        chunks, min(stops) if stops else None, None if onset is None else onset.at
    )
    assert audible_end is not None, f"{session.name}: the reply sent no audio"
    return Trial(
        clip=clip,
        status=status,
        audio_ms=sum(ms for _, ms in chunks),
        onset=onset,
        said_end=said_end,
        speech_started=started,
        done=done_at,
        audible_end=audible_end,
        gaps_ms=gaps_ms,
        decisions=[
            e for _, e in session.of(start, "overlap.decision") if e.get("response_id") == response_id
        ],
        decided_at=[
            t for t, e in session.of(start, "overlap.decision") if e.get("response_id") == response_id
        ],
        transcript=" ".join(
            str(e["transcript"])
            for _, e in session.of(start, "response.output_audio_transcript.done")
            if e.get("response_id") == response_id
        ),
    )


async def over_replies(session: Caller, clips: tuple[Overlap, ...]) -> tuple[Trial, list[Trial]]:
    """A reference reply with nothing said over it, then one reply per clip, each followed to the turn's end.

    A clip that started a turn is waited on until every turn it started has ended and been
    committed, and the caller has stayed quiet for :data:`SETTLE_S` (so the next clip starts from
    quiet); one that started none must still have started none after :data:`SETTLE_S` of quiet.
    A clip may start more than one turn: semantic_vad can end the turn at a pause inside it
    ("Hang on, ... which address was that?") and the rest is a turn of its own. Moving on after
    the first turn's commit left the second one open: the next clip then only continued it,
    with no speech start to hold or cut the next reply (CI saw three trials in a row end so).
    """
    reference = await reply_with(session, None)
    trials = []
    for clip in clips:
        start = session.index()
        trial = await reply_with(session, clip)
        await settle(session, start)
        trial.turn = bool(session.of(start, "input_audio_buffer.speech_started"))
        trial.committed = bool(session.of(start, "input_audio_buffer.committed"))
        trial.turns = len(session.of(start, "input_audio_buffer.speech_started"))
        trials.append(trial)
    return reference, trials


async def settle(session: Caller, start: int) -> None:
    """Wait until every turn started since event ``start`` has stopped and been committed, then quiet."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + TURN_END_WAIT_S * 2
    while True:
        counts = [
            len(session.of(start, kind))
            for kind in (
                "input_audio_buffer.speech_started",
                "input_audio_buffer.speech_stopped",
                "input_audio_buffer.committed",
            )
        ]
        if counts[1] >= counts[0] and counts[2] >= counts[0]:
            mark = session.index()
            await session.quiet(SETTLE_S)
            if session.first(mark, lambda e: e.get("type") == "input_audio_buffer.speech_started") is None:
                return
            continue
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise AssertionError(
                f"{session.name}: turns started/stopped/committed {counts} after {TURN_END_WAIT_S * 2} s"
            )
        session._arrived.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(session._arrived.wait(), min(remaining, 0.5))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def print_table(title: str, reference: Trial, trials: list[Trial]) -> None:
    """One row per clip: its length, the reply's fate, and what the gateway measured."""
    print(f"\n{title} (the reply alone: {reference.status}, {reference.audio_ms:.0f} ms of audio)")
    print(
        f"{'clip':38} {'ms':>5} {'reply':>9} {'audio':>6} {'turns':>5} {'gaps':>5} {'end':>5} {'pause':>5}  "
        "overlap.decision (input ms from the clip's first frame)"
    )
    for t in trials:
        assert t.clip is not None
        print(
            f"{t.clip.file[:-5] + ' ' + t.clip.text:38.38} {t.clip.duration_ms:5d} {t.status:>9} "
            f"{t.audio_ms:6.0f} {t.turns:5d} {t.gaps_ms:5.0f} {_ms(t.audible_end_ms):>5} {_ms(t.paused_end_ms):>5}  "
            f"{t.decided()}"
        )


@dataclass
class Pass:
    """One session's replies: the reference with nothing said over it, then one per clip."""

    reference: Trial
    trials: list[Trial]


@dataclass
class Measured:
    semantic_backchannels: Pass
    interruptions: Pass
    server_backchannels: Pass


async def _measure(gateway: Gateway) -> Measured:
    # One caller at a time, so no reply's synthesis slows another's. The interruptions get a session
    # of their own: twice in CI (not in eight runs here, one of 55 trials in a session), the last
    # interruptions of a session that had first held 16 backchannels went unheard (no hold, no
    # speech start, the reply played on); the cause is open (see the trial's timeline when it fails).
    async with caller(gateway, "semantic", SEMANTIC) as semantic:
        semantic_backchannels = Pass(*await over_replies(semantic, BACKCHANNELS))
    async with caller(gateway, "interruptions", SEMANTIC) as semantic:
        interruptions = Pass(*await over_replies(semantic, INTERRUPTIONS))
    async with caller(gateway, "server", SERVER) as server:
        server_backchannels = Pass(*await over_replies(server, BACKCHANNELS))
    return Measured(semantic_backchannels, interruptions, server_backchannels)


@pytest.fixture(scope="module")
def measured(gateway: Gateway) -> Measured:
    """Every clip over a reply, measured once for the module's tests; the tables printed."""
    result = asyncio.run(_measure(gateway))
    print_table("backchannels under semantic_vad", *vars(result.semantic_backchannels).values())
    print_table("interruptions under semantic_vad", *vars(result.interruptions).values())
    print_table("backchannels under server_vad", *vars(result.server_backchannels).values())
    cut = [t for t in result.semantic_backchannels.trials if t.cancelled]
    ends = [t.audible_end_ms or 0.0 for t in result.interruptions.trials]
    paused = [t.paused_end_ms or 0.0 for t in result.interruptions.trials]
    print(
        f"semantic_vad: {len(cut)}/{len(BACKCHANNELS)} backchannels cancelled the reply; interruptions' "
        f"audible end {min(ends):.0f}-{max(ends):.0f} ms after their onset "
        f"({sum(e > AUDIBLE_END_BOUND_MS for e in ends)}/{len(ends)} over {AUDIBLE_END_BOUND_MS} ms; "
        f"{min(paused):.0f}-{max(paused):.0f} ms for a client that pauses at the hold); "
        f"server_vad: {sum(t.cancelled for t in result.server_backchannels.trials)}/{len(BACKCHANNELS)} "
        "backchannels cancelled the reply; "
        f"{sum(t.turns > 1 for t in result.interruptions.trials)}/{len(INTERRUPTIONS)} interruptions were "
        "split into more than one turn"
    )
    return result


def test_server_vad_cancels_the_reply_at_a_backchannel(measured: Measured) -> None:
    """OpenAI's rule cuts the reply at every speech start: the clips are long enough to be heard as speech."""
    trials = measured.server_backchannels.trials
    spared = [t.clip.text for t in trials if t.clip is not None and not t.cancelled]
    assert len(spared) <= SERVER_VAD_SPARED, spared


def test_a_resumed_reply_loses_nothing(measured: Measured) -> None:
    """Where the gateway judged the speech a backchannel, the reply went on to its end and no turn began."""
    reference = measured.semantic_backchannels.reference
    assert reference.status == "completed", reference
    resumed = [t for t in measured.semantic_backchannels.trials if t.actions == ["pause", "resume"]]
    assert resumed, "no backchannel was judged one"
    for trial in resumed:
        assert trial.clip is not None
        assert trial.status == "completed", (trial.clip.text, trial.status)
        assert not trial.turn and not trial.committed, (trial.clip.text, "started a turn")
        assert trial.transcript == reference.transcript, (trial.clip.text, trial.transcript)
        # Piper's timing varies by a few per cent a take; a held chunk lost is 100 ms.
        assert abs(trial.audio_ms - reference.audio_ms) <= AUDIO_TOLERANCE * reference.audio_ms, (
            trial.clip.text,
            trial.audio_ms,
            reference.audio_ms,
        )


def test_no_backchannel_cancels_a_semantic_vad_reply(measured: Measured) -> None:
    """The issue's bound: 0 replies cancelled over the backchannels."""
    trials = measured.semantic_backchannels.trials
    assert len(trials) >= MIN_BACKCHANNELS
    cut = [(t.clip.text, t.decided()) for t in trials if t.clip is not None and t.cancelled]
    assert not cut, cut


def test_every_interruption_cancels_the_reply(measured: Measured) -> None:
    for trial in measured.interruptions.trials:
        assert trial.clip is not None
        assert trial.cancelled and trial.speech_started is not None, (trial.clip.text, trial.timeline())
        assert trial.actions[-1] == "barge_in", (trial.clip.text, trial.decided())


def test_every_interruption_is_heard_to_stop_within_600_ms_by_a_client_that_pauses(
    measured: Measured,
) -> None:
    """The issue's bound, for a client that follows the hold (``overlap.decision``; as paced phone calls and
    the Live API do by themselves): its playback pauses at the hold and never resumes before the cut."""
    late = [
        (t.clip.text, None if t.paused_end_ms is None else round(t.paused_end_ms), t.timeline())
        for t in measured.interruptions.trials
        if t.clip is not None and (t.paused_end_ms is None or t.paused_end_ms > AUDIBLE_END_BOUND_MS)
    ]
    assert not late, late


def test_every_interruption_ends_the_reply_within_600_ms(measured: Measured) -> None:
    """The issue's bound, for a client that stops its playback at ``speech_started``, every time."""
    late = [
        (t.clip.text, round(t.audible_end_ms or 0), t.decided())
        for t in measured.interruptions.trials
        if t.clip is not None and (t.audible_end_ms is None or t.audible_end_ms > AUDIBLE_END_BOUND_MS)
    ]
    assert not late, late
