"""The caller's turn: the input since the last commit, the ring before speech, the detector, the idle timer.

:class:`TurnTracker` is the one place inside the session that knows whether the
caller is speaking (:attr:`TurnTracker.speaking`). It holds the caller's input
until a turn is committed or cleared, keeps the audio just before speech onset
so a turn starts at its prefix padding, runs the gateway's turn detector for
engines that find no turns themselves, and keeps the ``idle_timeout_ms``
deadline. It puts committed turns into the conversation, follows the turns an
engine finds itself, and turns the engine's transcripts into the caller's words.
What a turn leads to (a reply, a barge-in) the session decides.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from duplex_gateway.audio.turn_detector import SpeechCandidate, SpeechStop, TurnDetector, TurnEvent
from duplex_gateway.engine import port
from duplex_gateway.session.conversation import Conversation, Item
from duplex_gateway.session.engine_calls import AppendAudio, AssessTurn, CallerPaused, Output, ProcessInput
from duplex_gateway.session.turn_words import WORDS_VETO_MS, sounds_unfinished
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.session_config import TurnDetection, TurnDetectionMode

__all__ = ["PartialTranscripts", "TurnTracker", "process_input"]

#: Audio kept before speech onset so the turn includes its prefix padding,
#: plus room for the detector's confirmation delay.
_RING_SLACK_MS = 400


class TurnTracker:
    """The caller's turn in progress, on the input clock (ms of caller audio since the session began)."""

    def __init__(
        self,
        conversation: Conversation,
        new_id: Callable[[str], str],
        turn_detection: TurnDetection | None,
        *,
        engine: port.EngineCapabilities,
    ) -> None:
        self._conversation = conversation
        self._new_id = new_id
        self._partials = PartialTranscripts()
        self._engine_detects_turns = engine.detects_turns
        self._engine_words_at_pause = engine.words_at_pause
        #: semantic_vad: the turn whose words up to the caller's pause the engine is still making.
        self._pause_words: str | None = None
        self._turn_detection = turn_detection
        self._detector = self._make_detector()
        # Caller input since the last commit/clear, in ms of audio.
        self._buffered_ms = 0.0
        #: Text pushed into the turn in progress (``input.text.append``): a commit has input.
        self._buffered_text = False
        self._input_ms = 0.0
        self._speech_item_id: str | None = None
        #: A turn the engine found the end of, waiting for the engine to commit it.
        self._stopped_item_id: str | None = None
        self._ring: deque[tuple[float, float, bytes]] = deque()
        #: Camera frames waiting for audio to ride to the engine with (the audio they came with
        #: is still in the resampler or the ring); the newest few only.
        self._held_frames: tuple[str, ...] = ()
        # turn_detection.idle_timeout_ms: when the caller's silence after a reply ends
        # their turn for them, and where on the input clock that silence began.
        self._idle_deadline: float | None = None
        self._idle_from_ms = 0.0
        #: semantic_vad: when (the session's clock) a judged silence ends the turn if no audio says
        #: otherwise first: a client that stops streaming after its words must not wait forever.
        self._judged_end: tuple[float, SpeechCandidate] | None = None
        #: semantic_vad: a judgement the model called done that the caller's words alone overruled,
        #: and how long the model took; newer words that sound finished end the turn after all.
        self._vetoed: tuple[AssessTurn, float] | None = None
        #: Speech over a held reply, not yet a turn: the ring keeps the audio from here.
        self._held_from_ms: float | None = None

    def _make_detector(self) -> TurnDetector | None:
        td = self._turn_detection
        if td is None or self._engine_detects_turns:
            return None
        return TurnDetector(td)

    def detect_with(self, turn_detection: TurnDetection | None) -> None:
        """Find turns by ``turn_detection`` from now on (a fresh detector)."""
        self._turn_detection = turn_detection
        self._detector = self._make_detector()

    # -- what the session asks -------------------------------------------------------------

    @property
    def speaking(self) -> bool:
        """The caller is speaking: a turn has started and has not ended."""
        return self._speech_item_id is not None

    @property
    def speech_item_id(self) -> str | None:
        """The item the turn being spoken will be (None when the caller is not speaking)."""
        return self._speech_item_id

    @property
    def stopped_item_id(self) -> str | None:
        """The turn the engine found the end of and has not committed yet."""
        return self._stopped_item_id

    @property
    def holding(self) -> bool:
        """Speech over a held reply is being judged (its audio kept, not yet a turn)."""
        return self._held_from_ms is not None

    @property
    def vad_thresholds(self) -> tuple[float, float] | None:
        """The gateway detector's speech threshold and quiet threshold (None: it finds no turns)."""
        d = self._detector
        return None if d is None else (d.threshold, d.neg_threshold)

    @property
    def input_ms(self) -> float:
        """The input clock: ms of caller audio since the session began."""
        return self._input_ms

    @property
    def has_input(self) -> bool:
        """There is input (audio or text) since the last commit or clear."""
        return self._buffered_ms > 0.0 or self._buffered_text

    # -- the caller's input ------------------------------------------------------------------

    def text_appended(self) -> None:
        """Text went into the turn in progress: committing it commits something."""
        self._buffered_text = True

    def take_audio(
        self,
        pcm: bytes,
        duration_ms: float,
        *,
        is_speech: bool | None,
        hints: Mapping[str, object] | None,
        video_frames: Sequence[str],
    ) -> list[AppendAudio]:
        """Processed caller audio: what goes to the engine now (nothing while the ring holds it)."""
        start_ms = self._input_ms
        self._input_ms += duration_ms
        if video_frames:
            # The newest frames only: vLLM-Omni's models take at most two with one append.
            self._held_frames = (*self._held_frames, *video_frames)[-2:]
        if self._detector is not None and self._speech_item_id is None:
            if pcm:
                self._ring.append((start_ms, self._input_ms, pcm))
            horizon = self._input_ms - self._ring_capacity_ms()
            if self._held_from_ms is not None:
                # Speech over a held reply may yet be a turn: keep it from its prefix padding.
                horizon = min(horizon, self._held_from_ms)
            while self._ring and self._ring[0][1] < horizon:
                self._ring.popleft()
            return []
        self._buffered_ms += duration_ms
        return [self.append(pcm, is_speech=is_speech, hints=hints)] if pcm else []

    def assessed(
        self, call: AssessTurn, probability: float | None, now: float | None = None, model_ms: float = 0.0
    ) -> SpeechStop | None:
        """The end-of-turn model judged ``call``: the turn's end if the caller is done and still quiet.

        ``probability`` None: the model could not judge, and the silence ends the turn as it
        would have without it. Words the engine has recognized so far that end on one a
        sentence cannot end on keep the turn going for a while (:mod:`.turn_words`).
        """
        detector = self._detector
        if detector is None or self._speech_item_id != call.item_id:
            return None
        self._vetoed = None
        if probability is not None:
            silence_ms = call.candidate.audio_end_ms - call.candidate.speech_end_ms
            unfinished = silence_ms < WORDS_VETO_MS and self._words_hold(call.item_id)
            if probability < call.threshold or unfinished:
                # Not done: more speech, a later judgement or the longest wait ends it; the wait runs
                # on the clock too, for a client that stops sending audio after its words.
                wait_ms = WORDS_VETO_MS if probability >= call.threshold else detector.silence_duration_ms
                if probability >= call.threshold:
                    self._vetoed = (call, model_ms)
                if now is not None and detector.awaiting(call.candidate):
                    self._judged_end = (now + max(0, wait_ms - silence_ms) / 1000.0, call.candidate)
                return None
        self._judged_end = None
        return detector.end_turn(call.candidate)

    def words_finished(self) -> tuple[SpeechStop, float] | None:
        """The turn's end, and the model's time, if newer words lift the veto the last ones put on it.

        The engine's words lag the audio, and a rough recognizer's ("close to my" for "close
        tonight") may be bettered moments later (the embedded engine's Whisper words): a turn the
        model called done waits only as long as its words sound unfinished.
        """
        vetoed, detector = self._vetoed, self._detector
        if vetoed is None or detector is None:
            return None
        call, model_ms = vetoed
        if self._speech_item_id != call.item_id or not detector.awaiting(call.candidate):
            self._vetoed = None
            return None
        if self._words_hold(call.item_id):
            return None
        self._vetoed = self._judged_end = None
        stop = detector.end_turn(call.candidate)
        return (stop, model_ms) if stop is not None else None

    def caller_paused(self) -> list[Output]:
        """The caller paused mid-turn: the engine is asked for the words so far (:class:`CallerPaused`)."""
        if self._engine_words_at_pause and self._speech_item_id is not None:
            self._pause_words = self._speech_item_id
        return [CallerPaused()]

    def _words_hold(self, item_id: str) -> bool:
        """The caller's words keep the turn ``item_id`` going: they sound unfinished, or are still coming.

        An engine that makes words at a pause (``words_at_pause``) makes them while the gateway
        waits through the silence; a judgement that comes first would read the rougher words
        from before the pause (pocketsphinx's "what what" for "I would like to speak with").
        """
        return self._pause_words == item_id or self._partials.sound_unfinished(item_id)

    @property
    def judged_end_at(self) -> float | None:
        """When a judged silence ends the turn by the clock (semantic_vad), or None."""
        return self._judged_end[0] if self._judged_end is not None else None

    def judged_end_due(self, now: float) -> SpeechStop | None:
        """The turn's end if its judged silence has run out by ``now`` with the caller still quiet."""
        judged, detector = self._judged_end, self._detector
        if judged is None or now < judged[0]:
            return None
        self._judged_end = self._vetoed = None
        return detector.end_turn(judged[1]) if detector is not None else None

    def assess(self, candidate: SpeechCandidate) -> AssessTurn | None:
        """The judgement to ask of the end-of-turn model for ``candidate`` (None: no turn is being spoken)."""
        if self._detector is None or self._speech_item_id is None:
            return None
        return AssessTurn(
            item_id=self._speech_item_id, candidate=candidate, threshold=self._detector.eagerness.threshold
        )

    def decisions(self, windows: Sequence[tuple[int, float]]) -> list[TurnEvent]:
        """What the detector makes of these VAD windows (nothing where the gateway finds no turns)."""
        if self._detector is None:
            return []
        return self._detector.feed_many(windows)

    def append(
        self, pcm: bytes, *, is_speech: bool | None = None, hints: Mapping[str, object] | None = None
    ) -> AppendAudio:
        """Audio for the engine, with the camera frames that waited for it."""
        frames, self._held_frames = self._held_frames, ()
        return AppendAudio(pcm=pcm, is_speech=is_speech, hints=hints or {}, video_frames=frames)

    def _ring_capacity_ms(self) -> float:
        td = self._turn_detection
        return (td.prefix_padding_ms if td else 0) + _RING_SLACK_MS

    def drop_input(self) -> None:
        """The client cleared (or cancelled) the input: the turn in progress is gone."""
        self._buffered_ms = 0.0
        self._buffered_text = False
        self._ring.clear()
        self._held_from_ms = None
        self._held_frames = ()  # the pictures of the input dropped
        self.end_speech()

    # -- the turn's life ---------------------------------------------------------------------

    def start_speech(self, item_id: str) -> None:
        """The caller started speaking; the turn will be ``item_id``."""
        self._idle_deadline = None
        self._speech_item_id = item_id

    def hold_speech(self, audio_start_ms: int) -> None:
        """Speech over a reply is being judged: keep its audio (from ``audio_start_ms``) in the ring."""
        self._held_from_ms = float(audio_start_ms)

    def dismiss_speech(self, end_ms: int) -> None:
        """The speech being judged was a backchannel, not a turn: the detector is back to silence."""
        self._held_from_ms = None
        if self._detector is not None:
            self._detector.dismiss(end_ms)

    def release_ring(self, audio_start_ms: int) -> list[AppendAudio]:
        """The turn starts at its prefix padding: what the ring holds from there on, for the engine."""
        appends: list[AppendAudio] = []
        for chunk_start, chunk_end, pcm in self._ring:
            if chunk_end > audio_start_ms:
                self._buffered_ms += chunk_end - chunk_start
                appends.append(self.append(pcm))
        self._ring.clear()
        self._held_from_ms = None
        return appends

    def end_speech(self) -> None:
        """The turn being spoken ends uncommitted (cleared, reconfigured); the detector starts over."""
        self._speech_item_id = None
        if self._detector is not None:
            self._detector.reset()

    def take_speech_item(self) -> str | None:
        """The turn being spoken is committed: its item id (None if it had not started)."""
        item_id, self._speech_item_id = self._speech_item_id, None
        return item_id

    def commit(self, item_id: str) -> list[Output]:
        """The caller's turn is ``item_id`` in the conversation from now on; the next turn starts empty."""
        turn_ms, self._buffered_ms = self._buffered_ms, 0.0
        self._buffered_text = False
        item = ev.ConversationItem(id=item_id, role="user", content_type="input_audio")
        previous = self._conversation.append(Item(item=item, produced_ms=turn_ms))
        return [
            ev.InputAudioCommitted(item_id=item_id, previous_item_id=previous),
            ev.ConversationItemAdded(item=item, previous_item_id=previous),
            ev.ConversationItemDone(item=item, previous_item_id=previous),
        ]

    def stopped_by_engine(self, event: port.EngineSpeechStopped) -> list[Output]:
        """The engine found the end of the turn being spoken; it is committed when the engine says so."""
        item_id = self._speech_item_id
        if item_id is None:
            return []
        self._speech_item_id = None
        self._stopped_item_id = item_id
        self._conversation.name_for_engine(event.item_id, item_id)
        return [ev.SpeechStopped(audio_end_ms=event.audio_end_ms, item_id=item_id)]

    def committed_by_engine(self, event: port.EngineTurnCommitted) -> list[Output]:
        """The engine committed a caller turn; one it ended by itself is announced now."""
        engine_item_id, conversation = event.item_id, self._conversation
        if not engine_item_id or engine_item_id in conversation:
            return []  # the gateway committed it, under this very id
        named = conversation.engine_named(engine_item_id)
        if named is not None and named in conversation:
            return []
        item_id = named or self._stopped_item_id or self._speech_item_id or self._new_id("item")
        if item_id == self._speech_item_id:
            self.end_speech()
        self._stopped_item_id = None
        conversation.name_for_engine(engine_item_id, item_id)
        return self.commit(item_id)

    def caller_words(self, event: port.EngineInputTranscript, *, tell_client: bool) -> list[Output]:
        """The engine's transcript of a caller's turn (a running hypothesis, or the final words)."""
        conversation = self._conversation
        item_id = (
            conversation.caller_item(event.item_id)
            or event.item_id
            or self._speech_item_id
            or self._stopped_item_id
            or conversation.last_caller_item()
            or ""
        )
        if not event.final:
            if event.at_pause:
                self._pause_words = None
            # Kept either way: semantic_vad reads them.
            deltas = self._partials.delta(
                item_id, event.text, last_word_confidence=event.last_word_confidence
            )
            return list(deltas) if tell_client else []
        record = conversation.get(item_id)
        if record is not None:
            record.item = replace(record.item, transcript=event.text)
        if not tell_client:
            return []
        audio_ms = record.produced_ms if record is not None else 0.0
        return [ev.InputTranscriptionCompleted(item_id=item_id, transcript=event.text, audio_ms=audio_ms)]

    def caller_words_failed(self, event: port.EngineInputTranscriptFailed) -> list[Output]:
        """The engine could not transcribe a caller's turn."""
        item_id = self._conversation.caller_item(event.item_id) or event.item_id
        return [ev.InputTranscriptionFailed(item_id=item_id, code=event.code, message=event.message)]

    def detection_ms(self, audio_end_ms: int) -> float:
        """How long after the end of the caller's speech the detector ended the turn.

        ``audio_end_ms`` already counts the detector's silence (as OpenAI's does), so
        the speech itself ended ``silence_duration_ms`` before it.
        """
        td, detector = self._turn_detection, self._detector
        if detector is not None and detector.semantic:
            return max(0.0, self._input_ms - detector.last_speech_end_ms)  # the wait the model chose
        silence = td.silence_duration_ms if td is not None else 0
        return max(0.0, self._input_ms - (audio_end_ms - silence))

    # -- the idle timer ----------------------------------------------------------------------

    @property
    def idle_deadline(self) -> float | None:
        """When the caller's silence ends their turn for them (the session's clock), or None."""
        return self._idle_deadline

    @property
    def idle_from_ms(self) -> float:
        """Where on the input clock the silence the idle timer counts began."""
        return self._idle_from_ms

    def cancel_idle(self) -> None:
        """The conversation moved on: no idle timeout is pending."""
        self._idle_deadline = None

    def arm_idle(self, *, first_audio_at: float | None, audio_ms: float, now: float) -> None:
        """A reply finished: the caller's silence counts from when it has finished playing."""
        td = self._turn_detection
        if td is None or td.idle_timeout_ms is None or td.mode is not TurnDetectionMode.SERVER_VAD:
            return
        # Not from when the engine finished making it: a reply made faster than real time is still playing.
        started = first_audio_at if first_audio_at is not None else now
        played_until = max(now, started + audio_ms / 1000.0)
        self._idle_deadline = played_until + td.idle_timeout_ms / 1000.0
        self._idle_from_ms = self._input_ms + (played_until - now) * 1000.0


class PartialTranscripts:
    """An engine's running hypotheses of the caller's words, as append-only deltas.

    A recognizer revises its latest words as it hears more, but a delta cannot be
    taken back: only words two hypotheses in a row agree on are sent, once each.
    The final transcript (``...completed``) is the authority on what was said.
    """

    def __init__(self) -> None:
        # Per caller item: (words already sent as deltas, the engine's last hypothesis).
        self._partials: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        # Per caller item: the recognizer's confidence in the last hypothesis's last word.
        self._confidence: dict[str, float | None] = {}

    def hypothesis(self, item_id: str) -> str:
        """The engine's latest hypothesis of the words of ``item_id`` ("" if none came)."""
        return " ".join(self._partials.get(item_id, ((), ()))[1])

    def sound_unfinished(self, item_id: str) -> bool:
        """Whether the latest words of ``item_id`` read as a sentence not yet over (:mod:`.turn_words`)."""
        return sounds_unfinished(self.hypothesis(item_id), self._confidence.get(item_id))

    def delta(
        self, item_id: str, hypothesis: str, *, last_word_confidence: float | None = None
    ) -> list[ev.InputTranscriptionDelta]:
        """The words of ``hypothesis`` newly agreed on, as a delta (nothing if none)."""
        self._confidence[item_id] = last_word_confidence
        emitted, previous = self._partials.get(item_id, ((), ()))
        words = tuple(hypothesis.split())
        stable = tuple(
            a
            for a, _ in itertools.takewhile(
                lambda pair: pair[0] == pair[1], zip(previous, words, strict=False)
            )
        )
        new: tuple[str, ...] = ()
        if len(stable) > len(emitted) and stable[: len(emitted)] == emitted:
            new = stable[len(emitted) :]
            emitted = stable
        self._partials[item_id] = (emitted, words)
        while len(self._partials) > 4:  # only the turn being spoken matters
            oldest = next(iter(self._partials))
            del self._partials[oldest]
            self._confidence.pop(oldest, None)
        if not new:
            return []
        delta = " ".join(new)
        return [
            ev.InputTranscriptionDelta(
                item_id=item_id, delta=f" {delta}" if len(emitted) > len(new) else delta
            )
        ]


def process_input(command: cmd.InputAudioAppend, session_format: AudioFormat) -> ProcessInput:
    """The caller audio of ``command``, checked, for the host's input stage (with its camera frames)."""
    fmt = _chunk_format(command, session_format)
    if not command.audio:
        raise ProtocolError(ErrorCode.INVALID_VALUE, "audio is empty", param="audio")
    fmt.check_length(len(command.audio))
    return ProcessInput(
        audio=command.audio,
        format=None if fmt == session_format else fmt,
        is_speech=command.is_speech,
        hints=command.hints,
        video_frames=command.video_frames,
    )


def _chunk_format(command: cmd.InputAudioAppend, session: AudioFormat) -> AudioFormat:
    """The format of one chunk: what the client declared for it, ``session``'s for the rest."""
    if command.encoding is None and command.rate is None:
        return session
    encoding = command.encoding or session.encoding
    rate = command.rate
    if rate is None:
        # A telephone codec named without a rate is at its own 8 kHz, as vLLM-Omni reads it.
        rate = 8_000 if encoding.is_g711 and not session.encoding.is_g711 else session.rate
    return AudioFormat(encoding=encoding, rate=rate)
