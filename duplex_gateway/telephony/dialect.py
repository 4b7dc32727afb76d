"""A phone call as a :class:`~duplex_gateway.dialects.base.Dialect`: carrier messages in, commands out.

The carrier's start message opens the session (its codec becomes the session's
input and output format; the number called can choose instructions and voice);
caller audio is appended as it comes; DTMF reaches the session as OpenAI's SIP
event; the end of the call closes the session.

Reply audio goes to the carrier through :class:`~duplex_gateway.telephony.playout.Playout`:
the connection asks :meth:`CallDialect.pump` for what is due, so the carrier never
holds more than the lead. When the caller speaks over the reply (or the reply is
cancelled) the carrier's clear goes out at once, and the reply is truncated to the
last mark the caller heard: the dialect hands the session a
``conversation.item.truncate`` of its own (:meth:`CallDialect.take_commands`), as a
Realtime client would send it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from duplex_gateway.audio import codec
from duplex_gateway.telephony import carrier as call
from duplex_gateway.telephony.echo import EchoSuppressor
from duplex_gateway.telephony.playout import Playout
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import InputTranscription, SessionPatch

__all__ = ["CallDialect", "CallProfile", "CallSetup"]

logger = logging.getLogger(__name__)

#: A carrier's start the gateway cannot serve (its codec or rate).
_CANNOT_SERVE = frozenset({ErrorCode.UNSUPPORTED_AUDIO_FORMAT, ErrorCode.UNSUPPORTED_SAMPLE_RATE})


@dataclass(frozen=True, slots=True, kw_only=True)
class CallProfile:
    """What a call to one number (or carrier parameter) sets in its session."""

    instructions: str | None = None
    voice: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSetup:
    """How calls are set up: the playout lead, and profiles by the number called."""

    lead_ms: float = 100.0
    #: Cancel the reply's echo from the caller's audio (speakerphones) before turn detection hears it.
    echo_suppression: bool = True
    #: Profiles by called number (E.164, as the carrier writes it) or by a ``profile`` start parameter.
    profiles: Mapping[str, CallProfile] = field(default_factory=dict)


class CallDialect:
    """One call's carrier protocol, spoken for the session."""

    def __init__(
        self,
        carrier: call.Carrier,
        setup: CallSetup | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.carrier = carrier
        self.setup = setup or CallSetup()
        self.start: call.CallStart | None = None
        self.ended = False
        self._wall_clock = wall_clock
        self._playout: Playout | None = None
        self.echo: EchoSuppressor | None = None
        self._commands: list[cmd.Command] = []
        self._outgoing: list[Frame] = []
        #: The turn detection of the session: a caller's speech cuts the reply off only with interrupt_response.
        self._interrupts = True
        self._now = 0.0
        #: Something changed that may let paced audio go out (the carrier resumed its flow).
        self._wake = False

    # -- carrier -> session ----------------------------------------------------------------

    def parse(self, frame: Frame) -> Sequence[cmd.Command]:
        try:
            events = self.carrier.parse(frame)
        except ProtocolError as exc:
            if self.start is None and exc.code in _CANNOT_SERVE:
                # A call in a format the gateway cannot take: end it rather than hold a silent line.
                logger.warning("%s call refused: %s", self.carrier.name, exc.message)
                self.ended = True
                return [cmd.SessionClose(reason="unsupported_call_format")]
            raise
        commands: list[cmd.Command] = []
        for event in events:
            commands.extend(self._command(event))
        return commands

    def _command(self, event: call.CallEvent) -> list[cmd.Command]:
        if isinstance(event, call.CallAudio):
            if not event.audio or self.start is None:
                return []
            return [cmd.InputAudioAppend(audio=self._without_echo(event.audio))]
        if isinstance(event, call.MarkPlayed):
            heard = self._playout.played(event.name) if self._playout is not None else None
            if heard is None:
                return []
            return [
                cmd.PlaybackAck(
                    response_id=heard.response_id, item_id=heard.item_id, played_ms=heard.played_ms
                )
            ]
        if isinstance(event, call.CallStart):
            return self._started(event)
        if isinstance(event, call.Dtmf):
            return [cmd.CallDtmf(digit=event.digit, received_at=int(self._wall_clock()))]
        if isinstance(event, call.CallEnded):
            self.ended = True
            return [cmd.SessionClose(reason=f"call_ended:{event.reason}")]
        if isinstance(event, call.FlowPaused | call.FlowResumed):
            if self._playout is not None:
                self._playout.paused = isinstance(event, call.FlowPaused)
                self._wake = True
            return []
        if isinstance(event, call.CarrierError):
            logger.warning("%s reported an error: %s: %s", self.carrier.name, event.code, event.message)
        return []

    def _started(self, start: call.CallStart) -> list[cmd.Command]:
        if self.start is not None:
            return []  # a repeated start changes nothing
        self.start = start
        self._playout = Playout(
            start.output_format,
            self.carrier.framing,
            lead_ms=self.setup.lead_ms,
            marks=self.carrier.has_marks,
        )
        if self.setup.echo_suppression and start.input_format.rate == start.output_format.rate:
            self.echo = EchoSuppressor(start.input_format.rate)
        profile = self.profile or CallProfile()
        patch = SessionPatch(
            input_format=start.input_format,
            output_format=start.output_format,
            # Observers of the call read what the caller said.
            input_transcription=InputTranscription(),
            # A caller's "mm-hm" while the assistant talks must not cost them the answer.
            hold_for_backchannels=True,
        )
        if profile.instructions is not None:
            patch = replace(patch, instructions=profile.instructions)
        if profile.voice is not None:
            patch = replace(patch, voice=profile.voice)
        return [cmd.SessionUpdate(session=patch)]

    @property
    def profile(self) -> CallProfile | None:
        """The profile this call picked: by its ``profile`` parameter, else by the number called."""
        start, profiles = self.start, self.setup.profiles
        if start is None:
            return None
        named = start.parameters.get("profile")
        if named is not None and named in profiles:
            return profiles[named]
        return profiles.get(start.callee or "")

    # -- session -> carrier ----------------------------------------------------------------

    def render(self, event: ev.ServerEvent, *, seq: int) -> Frame | None:
        playout = self._playout
        if isinstance(event, ev.AudioDelta):
            if playout is not None:
                playout.queue(event.response_id, event.item_id, event.audio)
            return None  # sent by pump(), at the carrier's pace
        if isinstance(event, ev.AudioDone | ev.ResponseDone) and playout is not None:
            playout.finish(event.response_id)
            if isinstance(event, ev.ResponseDone) and event.status == "cancelled":
                return self._clear()
            return None
        if isinstance(event, ev.SpeechStarted) and self._interrupts:
            return self._clear()
        if isinstance(event, ev.OverlapDecision) and event.response_id is not None and playout is not None:
            return self._overlap(event.action, playout)
        if isinstance(event, ev.OutputAudioCleared):
            return self._clear()
        if isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            td = event.config.turn_detection
            self._interrupts = td is None or td.interrupt_response
            return None
        if isinstance(event, ev.SessionClosed):
            return None if self.ended else self.carrier.hangup()
        if isinstance(event, ev.ErrorEvent):
            logger.warning("call %s: %s: %s", self._call_id, event.code.value, event.message)
        return None

    def render_unsequenced(self, event: ev.ServerEvent) -> Frame:
        raise NotImplementedError("phone calls are not resumed")

    def _overlap(self, action: str | None, playout: Playout) -> Frame | None:
        """The session holds the reply while caller speech over it is judged, then resumes or cuts it.

        A hold clears the carrier's buffer at once (the caller hears no more of the reply) and
        takes back what it had not played (a carrier with no buffer to clear plays the lead it
        was sent, and nothing is taken back); a resume sends on from there, so the caller hears a
        gap and nothing twice; a cut follows as the turn's ``speech_started``.
        """
        if action == "pause":
            clear = self.carrier.clear()
            if clear is None:  # a carrier with no buffer to clear plays what it got: stop sending only
                playout.hold(self._now, reclaim=False)
                return None
            return clear if playout.hold(self._now) else None
        if action == "resume":
            playout.release()
            self._wake = True
        return None  # a barge-in's speech_started clears what the hold kept

    def _clear(self) -> Frame | None:
        playout = self._playout
        if playout is None or not playout.pending(self._now):
            return None
        cut = playout.clear(self._now)
        if cut is not None:
            # What the caller heard of the reply is all the conversation keeps of it.
            self._commands.append(
                cmd.ConversationItemTruncate(
                    item_id=cut.item_id, content_index=0, audio_end_ms=cut.audio_end_ms
                )
            )
        return self.carrier.clear()

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        """The carrier frames due at ``now`` (reply audio and its marks), and when to ask again."""
        self._now = now
        self._wake = False
        playout = self._playout
        if playout is None:
            return [], None
        frames: list[Frame] = []
        outgoing, wake = playout.due(now)
        for piece in outgoing:
            if self.echo is not None and self.start is not None:
                self.echo.played(piece.ends_at, codec.decode(piece.audio, self.start.output_format.encoding))
            frames.extend(self.carrier.media(piece.audio))
            if piece.mark is not None:
                mark = self.carrier.mark(piece.mark)
                if mark is not None:
                    frames.append(mark)
        return frames, wake

    def _without_echo(self, audio: bytes) -> bytes:
        echo, start = self.echo, self.start
        if echo is None or start is None:
            return audio
        encoding = start.input_format.encoding
        if len(audio) % encoding.bytes_per_sample:
            return audio  # a partial sample: the session refuses it as it is
        samples = codec.decode(audio, encoding)
        cleaned = echo.process(self._now, samples)
        return audio if cleaned is samples else codec.encode(cleaned, encoding)

    def tick(self, now: float) -> None:
        """The time the next :meth:`render` happens at (clears compute what was heard by then)."""
        self._now = now

    @property
    def wants_pump(self) -> bool:
        """A carrier message changed what may be sent (the connection pumps after parsing)."""
        return self._wake

    def take_commands(self) -> list[cmd.Command]:
        """Commands the call itself has for the session (the truncation after a clear)."""
        out, self._commands = self._commands, []
        return out

    @property
    def _call_id(self) -> str:
        return (self.start.call_id if self.start else None) or "?"
