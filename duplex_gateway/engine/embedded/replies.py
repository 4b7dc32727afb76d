"""The replies of one embedded-engine session: several at once, each stopped on its own.

A reply asks the engine's brain what to say or call, speaks each sentence with Piper as
soon as it is made (or sends it as text for a text reply), paces the audio to the
listener, and records what it said in the conversation. One reply at a time belongs to
the conversation; replies out of band (``conversation: "none"``) run beside it, stay out
of the history, and survive a barge-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from types import MappingProxyType
from typing import Final, ParamSpec, Protocol, TypeVar

from duplex_gateway.engine import port
from duplex_gateway.engine.embedded.brain import Brain, Call, CallDelta, End, ReplyRequest, Say, new_call_id
from duplex_gateway.engine.embedded.conversation import (
    Entry,
    FunctionCall,
    History,
    Spoken,
    from_context,
    settled,
)
from duplex_gateway.engine.embedded.tts import PiperSynthesizer, quick_start
from duplex_gateway.engine.embedded.workers import Priority
from duplex_gateway.engine.event_queue import EngineEventQueue
from duplex_gateway.vocabulary.session_config import Modality, SessionConfig

__all__ = ["Pacer", "ReplyEngine", "ReplyRun", "SessionReplies"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

#: Out-of-band replies a session runs at once beside its conversation's (the gateway allows 4).
MAX_SIDE_REPLIES: Final = 4
#: Function calls remembered by call id beyond the history (out-of-band ones, old ones), so
#: an output that comes late is still read back with its function's name.
MAX_CALLS: Final = 32
#: Longest a reply waits for its turn's transcription; a turn not transcribed by then counts
#: as unheard (Whisper takes well under a second per turn unless the CPU is swamped).
TRANSCRIPTION_WAIT_S: Final = 60.0
#: Longest wait for one sentence's synthesis (well under a second normally; a pool swamped for
#: this long fails the reply rather than leave the caller in silence with no word why).
SYNTHESIS_WAIT_S: Final = 30.0
#: Longest wait for a stopped reply to wind down (it stops at its next await; closing a
#: model's HTTP stream is the slowest part).
STOP_WAIT_S: Final = 2.0


#: Events of a reply that a stop takes back out of the queue if the reader has not read them.
class Pacer:
    """Releases reply audio at ``pace`` times real time, ``lead_s`` ahead of the listener.

    Pacing keeps a reply in progress while it is heard, so a barge-in finds
    it active and stops what has not been sent. ``pace`` 0 sends at once.
    """

    def __init__(self, pace: float, lead_s: float) -> None:
        self._pace = pace
        self._lead_s = max(0.0, lead_s)
        self._anchor: float | None = None  # loop time at which the listener starts playback
        self._sent_s = 0.0

    async def wait(self) -> None:
        """Wait until the next chunk is due."""
        if self._pace <= 0:
            return
        now = asyncio.get_running_loop().time()
        if self._anchor is None or now - self._anchor > self._sent_s / self._pace:
            # First audio, or synthesis fell behind and the listener ran dry:
            # playback (re)starts now, with a fresh lead.
            self._anchor = now - self._sent_s / self._pace
        delay = self._anchor + (self._sent_s - self._lead_s) / self._pace - now
        if delay > 0:
            await asyncio.sleep(delay)

    def sent(self, seconds: float) -> None:
        """Count ``seconds`` of audio as sent."""
        self._sent_s += seconds

    def played_s(self) -> float | None:
        """Where the listener's playback is now, if pacing tells (None when unpaced)."""
        if self._pace <= 0 or self._anchor is None:
            return None
        return max(0.0, (asyncio.get_running_loop().time() - self._anchor) * self._pace)


@dataclass(slots=True, kw_only=True)
class ReplyRun:
    """The mutable state of one running reply (owned by its session; never shared)."""

    response_id: str
    options: port.ResponseOptions
    pacer: Pacer
    task: asyncio.Task[None] | None = None
    #: (audio start ms, audio end ms, text) of each piece said so far; text replies have no audio.
    pieces: list[tuple[float, float, str]] = field(default_factory=list)
    #: Audio sent so far.
    audio_s: float = 0.0
    #: The piece being sent, paced, while the next one is synthesized.
    playing: asyncio.Task[None] | None = None
    #: The brain's call ids, as this reply sent them (a model's ids may repeat across replies).
    call_ids: dict[str, str] = field(default_factory=dict)

    @property
    def out_of_band(self) -> bool:
        return self.options.out_of_band

    @property
    def text_only(self) -> bool:
        return Modality.AUDIO not in self.options.modalities

    def call_id(self, brain_id: str, taken: set[str]) -> str:
        """The id this reply uses for the brain's call ``brain_id``: the brain's own unless ``taken``."""
        mine = self.call_ids.get(brain_id)
        if mine is None:
            mine = brain_id if brain_id and brain_id not in taken else new_call_id()
            self.call_ids[brain_id] = mine
        return mine

    def spoken(self, *, cut: bool = False, purged_s: float = 0.0) -> Spoken:
        """What the reply said, for the conversation; ``cut``: stopped, heard up to where playback was."""
        heard_ms: float | None = None
        if cut and not self.text_only:
            sent_s = max(0.0, self.audio_s - purged_s)
            played = self.pacer.played_s()
            heard_ms = 1000.0 * (min(sent_s, played) if played is not None else sent_s)
        return Spoken(
            response_id=self.response_id,
            pieces=tuple(self.pieces),
            heard_ms=heard_ms,
            cut=cut,
            audio=not self.text_only,
        )


class _Stages:
    """Where a reply's time went up to its first output, for :class:`port.EngineTimings`."""

    def __init__(self, clock: Callable[[], float], started: float, *, recognised: float) -> None:
        self._clock = clock
        self._started = started
        self._recognised = recognised
        self._replied: float | None = None

    def replied(self) -> None:
        """The brain has its first sentence (later calls change nothing)."""
        if self._replied is None:
            self._replied = self._clock()

    def up_to_reply(self) -> tuple[tuple[str, float], ...]:
        replied = self._replied if self._replied is not None else self._clock()
        return (
            ("recognition", (self._recognised - self._started) * 1000.0),
            ("reply", (replied - self._recognised) * 1000.0),
        )

    def with_speech(self) -> tuple[tuple[str, float], ...]:
        replied = self._replied if self._replied is not None else self._clock()
        return (*self.up_to_reply(), ("speech", (self._clock() - replied) * 1000.0))


class _Voices(Protocol):
    @property
    def voice(self) -> PiperSynthesizer: ...


class ReplyEngine(Protocol):
    """What a session's replies need of the engine (:class:`~.engine.EmbeddedEngine`)."""

    @property
    def brain(self) -> Brain:
        """What decides each reply."""
        ...

    @property
    def models(self) -> _Voices:
        """The loaded models; the replies speak with the voice."""
        ...

    @property
    def capabilities(self) -> port.EngineCapabilities:
        """The engine's capabilities; the replies send audio at their output rate."""
        ...

    @property
    def chunk_ms(self) -> int:
        """Size of the reply audio chunks."""
        ...

    @property
    def pace(self) -> float:
        """Speed of the reply audio relative to real time; 0: as fast as it is synthesized."""
        ...

    @property
    def lead_ms(self) -> int:
        """How far a paced reply runs ahead of real time."""
        ...

    def now(self) -> datetime:
        """The time the brain is told."""
        ...

    async def run(
        self, priority: Priority, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """Run ``fn`` on the engine's inference pool and wait."""
        ...


class SessionReplies:
    """The replies of one session, keyed by response id."""

    def __init__(
        self,
        engine: ReplyEngine,
        session_id: str,
        events: EngineEventQueue,
        history: History,
        config: Callable[[], SessionConfig],
    ) -> None:
        self._engine = engine
        self._session_id = session_id
        self._events = events
        self._history = history
        self._config = config
        self._runs: dict[str, ReplyRun] = {}
        self._calls: OrderedDict[str, FunctionCall] = OrderedDict()

    def __len__(self) -> int:
        return len(self._runs)

    def remember_call(self, call: FunctionCall) -> None:
        """A function call by id, for the output that may follow (bounded: the oldest go)."""
        self._calls[call.call_id] = call
        self._calls.move_to_end(call.call_id)
        while len(self._calls) > MAX_CALLS:
            self._calls.popitem(last=False)

    async def start(
        self, response_id: str, instructions: str | None, options: port.ResponseOptions | None
    ) -> None:
        """Start a reply; one in the conversation first stops the conversation's reply in progress."""
        if options is None:  # a reply the gateway started on a commit: the session's settings
            config = self._config()
            options = port.ResponseOptions(
                modalities=config.output_modalities,
                tools=config.tools,
                tool_choice=config.tool_choice,
                max_output_tokens=config.max_output_tokens,
            )
        if not options.out_of_band:
            await self.stop_all(in_conversation=True)
        elif sum(run.out_of_band for run in self._runs.values()) >= MAX_SIDE_REPLIES:
            message = f"{MAX_SIDE_REPLIES} out-of-band replies are running; wait for one to finish"
            self._events.put_urgent(port.EngineError(code="too_many_replies", message=message))
            self._events.put_urgent(
                port.EngineResponseDone(response_id=response_id, status="failed", reason="engine_error")
            )
            return
        engine = self._engine
        run = ReplyRun(
            response_id=response_id, options=options, pacer=Pacer(engine.pace, engine.lead_ms / 1000.0)
        )
        # The reply answers the conversation as it is now; what is added later is for the next one.
        conversation = self._history.snapshot()
        run.task = asyncio.create_task(
            self._respond(run, instructions, conversation), name=f"embedded:reply:{response_id}"
        )
        self._runs[response_id] = run
        run.task.add_done_callback(lambda _task: self._forget(run))

    async def cancel(self, response_id: str) -> None:
        run = self._runs.get(response_id)
        if run is not None:
            await self._stop(run)

    async def stop_all(self, *, in_conversation: bool | None) -> None:
        """Stop the conversation's reply (True), those out of band (False), or all (None)."""
        for run in list(self._runs.values()):
            if in_conversation is None or run.out_of_band is not in_conversation:
                await self._stop(run)

    # -- one reply -----------------------------------------------------------------------

    async def _respond(
        self, run: ReplyRun, instructions: str | None, conversation: tuple[Entry, ...]
    ) -> None:
        engine = self._engine
        response_id = run.response_id
        options = run.options
        try:
            # Announce the reply at once: the gateway then treats it as active
            # (a barge-in cancels it) while the turn is still being transcribed.
            await self._events.put(port.EngineResponseStarted(response_id=response_id))
            clock = asyncio.get_running_loop().time
            started = clock()
            context = from_context(options.input) if options.input is not None else conversation
            request = ReplyRequest(
                context=await settled(context, TRANSCRIPTION_WAIT_S),
                instructions=self._config().instructions if instructions is None else instructions,
                tools=options.tools,
                tool_choice=options.tool_choice,
                max_output_tokens=options.max_output_tokens,
                now=engine.now(),
                calls=MappingProxyType(dict(self._calls)),
            )
            stages = _Stages(clock, started, recognised=clock())
            end = End()
            async with contextlib.aclosing(engine.brain.reply(request)) as parts:
                try:
                    async for part in parts:
                        if isinstance(part, Say):
                            await self._say(run, part.text, stages)
                        else:
                            await self._played(run)  # what follows a sentence comes after its audio
                            if isinstance(part, CallDelta | Call):
                                await self._call(run, part)
                            else:
                                end = part
                    await self._played(run)
                finally:
                    if run.playing is not None:
                        run.playing.cancel()
            if end.status != "completed" and run.pieces and not run.out_of_band:
                self._history.put_reply(run.spoken(cut=True))  # heard to its end, but it stopped short
            if end.error is not None:
                await self._events.put(port.EngineError(code="reply_failed", message=end.error))
            await self._events.put(
                port.EngineResponseDone(
                    response_id=response_id,
                    status=end.status,
                    reason=end.reason,
                    input_tokens=end.input_tokens,
                    output_tokens=end.output_tokens,
                )
            )
        except asyncio.CancelledError:
            raise  # _stop reports it, also for a reply cancelled before it ran
        except Exception as exc:
            logger.exception("reply %s of session %s failed", response_id, self._session_id)
            self._events.put_urgent(
                port.EngineError(code="reply_failed", message=f"{type(exc).__name__}: {exc}")
            )
            self._events.put_urgent(
                port.EngineResponseDone(response_id=response_id, status="failed", reason="engine_error")
            )

    async def _say(self, run: ReplyRun, sentence: str, stages: _Stages) -> None:
        """One sentence of the reply: spoken (audio and its transcript), or as text for a text reply."""
        engine = self._engine
        response_id = run.response_id
        stages.replied()
        if run.text_only:
            # Nothing to synthesize: the gateway would drop a text reply's audio anyway.
            if not run.pieces:
                await self._events.put(
                    port.EngineTimings(response_id=response_id, stages=stages.up_to_reply())
                )
            delta = sentence if not run.pieces else f" {sentence}"
            run.pieces.append((0.0, 0.0, sentence))
            self._note_said(run)
            await self._events.put(port.EngineText(response_id=response_id, delta=delta))
            return
        # A short opening reaches the caller sooner than a whole first sentence.
        for piece in quick_start([sentence]) if not run.pieces and run.playing is None else [sentence]:
            # Made while the piece before it plays out, so the pacer's lead need not cover a
            # sentence's synthesis: one piece ahead at most. A stop while this awaits abandons
            # the piece: its audio is never sent, and the next is never started.
            async with asyncio.timeout(SYNTHESIS_WAIT_S):
                pcm = await engine.run(
                    Priority.SPEECH, engine.models.voice.synthesize, piece, speed=self._config().speed
                )
            if not run.pieces and run.playing is None:
                await self._events.put(
                    port.EngineTimings(response_id=response_id, stages=stages.with_speech())
                )
            await self._played(run)
            run.playing = asyncio.create_task(
                self._play(run, piece, pcm), name=f"embedded:play:{response_id}"
            )

    async def _played(self, run: ReplyRun) -> None:
        """Wait until the piece playing has all been sent (its last chunk released by the pacer)."""
        playing, run.playing = run.playing, None
        if playing is not None:
            await playing

    async def _play(self, run: ReplyRun, piece: str, pcm: bytes) -> None:
        """One synthesized piece of the reply: its transcript, then its audio, paced for the listener."""
        engine = self._engine
        response_id = run.response_id
        rate = engine.capabilities.output_rate
        chunk_bytes = max(2, rate * engine.chunk_ms // 1000 * 2)
        delta = piece if not run.pieces else f" {piece}"
        start_ms = run.audio_s * 1000.0
        run.pieces.append((start_ms, start_ms + len(pcm) * 500.0 / rate, piece))
        self._note_said(run)
        await self._events.put(port.EngineTranscript(response_id=response_id, delta=delta))
        for offset in range(0, len(pcm), chunk_bytes):
            chunk = pcm[offset : offset + chunk_bytes]
            await run.pacer.wait()
            await self._events.put(port.EngineAudio(response_id=response_id, pcm=chunk))
            run.pacer.sent(len(chunk) / 2 / rate)
            run.audio_s += len(chunk) / 2 / rate

    async def _call(self, run: ReplyRun, part: CallDelta | Call) -> None:
        taken = set(self._calls) | self._history.call_ids()
        call_id = run.call_id(part.call_id, taken)
        response_id = run.response_id
        if isinstance(part, CallDelta):
            await self._events.put(
                port.EngineFunctionCallDelta(
                    response_id=response_id, call_id=call_id, name=part.name, delta=part.delta
                )
            )
            return
        await self._events.put(
            port.EngineFunctionCall(
                response_id=response_id, call_id=call_id, name=part.name, arguments=part.arguments
            )
        )
        call = FunctionCall(item_id=None, call_id=call_id, name=part.name, arguments=part.arguments)
        self.remember_call(call)
        if not run.out_of_band:
            self._history.add(call)

    def _note_said(self, run: ReplyRun) -> None:
        if not run.out_of_band:  # a reply out of band is no part of the conversation
            self._history.put_reply(run.spoken())

    def _forget(self, run: ReplyRun) -> None:
        if self._runs.get(run.response_id) is run:
            del self._runs[run.response_id]

    async def _stop(self, run: ReplyRun) -> None:
        task = run.task
        if task is None or task.done():
            return
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_WAIT_S)
        if task.done() and not task.cancelled():
            return  # it finished before the cancel took, and reported so itself
        if not task.done():
            logger.warning("reply %s of session %s is slow to stop", run.response_id, self._session_id)
        purged_s = self._purge(run.response_id)
        if run.pieces and not run.out_of_band:
            self._history.put_reply(run.spoken(cut=True, purged_s=purged_s))
        self._events.put_urgent(port.EngineResponseDone(response_id=run.response_id, status="cancelled"))

    def _purge(self, response_id: str) -> float:
        """Take a stopped reply's output that the reader has not taken yet back out of the queue;
        the seconds of audio taken back (never sent, so never heard)."""
        purged = 0

        def unwanted(event: port.EngineEvent) -> bool:
            nonlocal purged
            if not isinstance(event, port.REPLY_OUTPUT_EVENTS) or event.response_id != response_id:
                return False
            if isinstance(event, port.EngineAudio):
                purged += len(event.pcm)
            return True

        self._events.discard(unwanted)
        return purged / 2 / self._engine.capabilities.output_rate
