"""The Live dialect with its reply audio played out in real time: what the caller heard, by the clock.

A Live client plays the audio it gets as it gets it and sends no playback acks, so the gateway is
the one who knows what was heard. :class:`PacedLiveDialect`, the dialect the gateway serves, sends
reply audio no faster than it plays (:class:`LivePlayout`: a small lead ahead, so a late packet
leaves no gap), tells the session what its clock says was played, and drops what is queued when a
reply is cut short. Time arrives as arguments. Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from duplex_gateway.dialects import wire_codec
from duplex_gateway.dialects.live import LiveDialect
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import context_events as ctx
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame

__all__ = [
    "ACK_EVERY_MS",
    "CHUNK_MS",
    "LEAD_MS",
    "RESPONSES_HERE",
    "Heard",
    "LivePlayout",
    "PacedLiveDialect",
    "responses_backend_notice",
]


#: How far ahead of real time reply audio is sent: enough for network jitter, little to cut short.
LEAD_MS = 100.0
#: The most audio one paced frame carries.
CHUNK_MS = 40.0
#: How often, in played audio, the session hears how much of the reply the caller has heard.
ACK_EVERY_MS = 200


@dataclass(frozen=True, slots=True)
class Heard:
    """The caller has heard ``played_ms`` of reply ``response_id`` (its item ``item_id``)."""

    response_id: str
    item_id: str
    played_ms: int


class LivePlayout:
    """Paces one session's reply audio and keeps, by the clock, how much of it was played."""

    def __init__(self, fmt: AudioFormat, *, lead_ms: float = LEAD_MS, chunk_ms: float = CHUNK_MS) -> None:
        self.format = fmt
        self._lead_s = lead_ms / 1000.0
        width = fmt.encoding.bytes_per_sample
        chunk = max(fmt.byte_count(chunk_ms), width)
        self._chunk = chunk - chunk % width
        self._width = width
        #: Reply audio not sent yet: (response, item, bytes), in order.
        self._queue: deque[tuple[str, str, bytearray]] = deque()
        #: When everything sent so far will have played (None: nothing is playing).
        self._ends_at: float | None = None
        #: The reply whose audio went out last, and how much of it went (ms).
        self._current: tuple[str, str] | None = None
        self._sent_ms = 0.0
        #: Sending is held while caller speech over the reply is judged (a backchannel, or a barge-in).
        self._held = False
        #: The reply and played ms the session was last told of (:meth:`acknowledge`).
        self._acked: tuple[str, int] | None = None

    def queue(self, response_id: str, item_id: str, audio: bytes) -> None:
        """Reply audio (in the session's output format) to play after what is queued."""
        if self._queue and self._queue[-1][:2] == (response_id, item_id):
            self._queue[-1][2].extend(audio)
        else:
            self._queue.append((response_id, item_id, bytearray(audio)))

    def due(self, now: float) -> tuple[list[tuple[str, bytes]], float | None]:
        """The audio to send at ``now`` (each with its reply's id), and when to ask again (None: on more audio)."""
        out: list[tuple[str, bytes]] = []
        while self._queue and not self._held:
            # (a microsecond of slack, so float rounding at the wake-up time does not defer it again)
            if self._ends_at is not None and self._ends_at - now > self._lead_s + 1e-6:
                return out, self._ends_at - self._lead_s
            response_id, item_id, audio = self._queue[0]
            size = min(len(audio), self._chunk)
            size -= size % self._width
            if size == 0:  # a partial sample waits for the rest; another reply's audio goes first
                if len(self._queue) == 1:
                    return out, None
                self._queue.popleft()
                continue
            take = bytes(audio[:size])
            del audio[:size]
            if not audio:
                self._queue.popleft()
            if self._current != (response_id, item_id):
                self._current, self._sent_ms = (response_id, item_id), 0.0
            duration_ms = self.format.duration_ms(len(take))
            self._sent_ms += duration_ms
            start = now if self._ends_at is None or self._ends_at < now else self._ends_at
            self._ends_at = start + duration_ms / 1000.0
            out.append((response_id, take))
        return out, None

    def hold(self) -> None:
        """Send no more until :meth:`release`: the caller hears only the lead already sent.

        What is queued stays queued, so a backchannel's resume goes on where the reply paused
        (a short gap, nothing lost, nothing twice), and a cut measures what was heard before it.
        """
        self._held = True

    def release(self) -> None:
        """Send again from where :meth:`hold` stopped (the next :meth:`due` starts the clock anew)."""
        self._held = False

    def heard(self, now: float) -> Heard | None:
        """How much of the reply playing (or played last) the caller has heard by ``now``."""
        if self._current is None:
            return None
        unplayed_ms = max(0.0, (self._ends_at or now) - now) * 1000.0
        response_id, item_id = self._current
        return Heard(response_id, item_id, max(0, round(self._sent_ms - unplayed_ms)))

    def acknowledge(self, now: float) -> Heard | None:
        """What the caller has heard by ``now``, when the session is due to be told (None: not yet).

        Due every :data:`ACK_EVERY_MS` of a reply's playout, and at once for a reply not told of
        before: often enough for a cut to land where the caller is, few enough to cost nothing.
        """
        heard = self.heard(now)
        if heard is None:
            return None
        acked = self._acked[1] if self._acked and self._acked[0] == heard.response_id else -ACK_EVERY_MS
        if heard.played_ms - acked < ACK_EVERY_MS:
            return None
        self._acked = (heard.response_id, heard.played_ms)
        return heard

    @property
    def ends_at(self) -> float | None:
        """When everything sent so far will have played (None: nothing sent since the last clear)."""
        return self._ends_at

    def playing(self, now: float) -> bool:
        """Reply audio is queued, or sent and not played yet."""
        return bool(self._queue) or (self._ends_at is not None and self._ends_at > now)

    def playing_reply(self, now: float) -> str | None:
        """The reply the caller hears at ``now``, or hears next (None: nothing is playing)."""
        if self._current is not None and self._ends_at is not None and self._ends_at > now:
            return self._current[0]
        return self._queue[0][0] if self._queue else None

    def clear(self, now: float) -> Heard | None:
        """Drop what is queued: what the caller heard of the reply cut short (None: nothing was playing)."""
        cut = self.heard(now) if self.playing(now) else None
        self._queue.clear()
        self._ends_at = None
        self._current, self._sent_ms = None, 0.0
        self._held = False
        return cut


#: What a session started with Responses delegation is told: the gateway hands no work to a backend.
RESPONSES_HERE = ctx.Notice(
    code="responses_delegation_local",
    message=(
        "Responses delegation: this gateway has no Responses backend, so its voice engine answers by "
        "itself and calls the session's function tools itself; hosted tools are not run."
    ),
)


def responses_backend_notice(backend: str) -> ctx.Notice:
    """What a session started with Responses delegation is told when a backend model does the work."""
    return ctx.Notice(
        code="responses_delegation_backend",
        message=(
            f"Responses delegation: the voice engine hands work to this gateway's backend model ({backend}), "
            "which calls the session's function tools; hosted tools are not run."
        ),
    )


class PacedLiveDialect(LiveDialect):
    """The Live dialect with its reply audio paced in real time (a :class:`~duplex_gateway.dialects.base.PacedDialect`).

    Reply audio goes out through :class:`LivePlayout`; the session hears what was played as
    playback acks, and a reply cut short (a barge-in, a cleared output) as a truncation at
    what the caller heard, so that is what the conversation keeps of it.

    A reply the engine has finished making can still be playing (a fast engine makes it long
    before it plays): the session has no reply to interrupt then, so a caller who speaks over
    it (with ``interrupt_response``) is a barge-in the dialect cuts itself, as a Realtime
    client truncates the audio it is playing.
    """

    def __init__(
        self, *, session_id: str, expires_at: int, max_message_bytes: int, backend: str | None = None
    ) -> None:
        super().__init__(
            session_id=session_id, expires_at=expires_at, max_message_bytes=max_message_bytes, backend=backend
        )
        self._playout: LivePlayout | None = None
        self._now = 0.0
        self._commands: list[cmd.Command] = []
        self._audio_frames = 0
        #: Frames of the dialect's own to go out with the next pump (an ``info`` after ``session.started``).
        self._own: list[Frame] = []
        #: The session's turn detection stops a reply the caller speaks over (``interrupt_response``).
        self._barge_in = False

    def render(self, event: ev.ServerEvent, *, seq: int) -> str | None:
        setup = self.state.setup
        if isinstance(event, ev.AudioDelta) and setup is not None:
            self._audio(event)  # its place on the session timeline, as if sent now
            if self._playout is None:
                self._playout = LivePlayout(setup.audio_format)
            self._playout.queue(event.response_id, event.item_id, event.audio)
            return None  # sent by pump(), in real time
        if isinstance(event, ev.ResponseDone) and event.status == "cancelled":
            self._cut(cancelled=event.response_id)
        elif isinstance(event, ev.OutputAudioCleared):
            self._cut()
        elif isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            td = event.config.turn_detection
            self._barge_in = td is not None and td.interrupt_response
        elif isinstance(event, ev.SpeechStarted) and self._barge_in and self._made_reply_playing():
            self._cut()
        elif isinstance(event, ev.OverlapDecision) and self._playout is not None:
            self._overlap(event.action, self._playout)
        frame = super().render(event, seq=seq)
        if (
            isinstance(event, ev.SessionCreated)
            and frame is not None
            and self.state.delegation.target == "responses"
        ):
            said = RESPONSES_HERE if self.backend is None else responses_backend_notice(self.backend)
            notice = self._render(said, f"event_{seq}_info")
            if notice is not None:
                self._own.append(notice)
        return frame

    def _overlap(self, action: str | None, playout: LivePlayout) -> None:
        """The session holds the reply while caller speech over it is judged, then resumes or cuts it.

        A hold stops sending at once (the lead already sent plays out); a resume sends on from
        where it stopped; a barge-in's cancellation then cuts the reply at what was heard.
        """
        if action == "pause":
            playout.hold()
        elif action == "resume":
            playout.release()

    def _made_reply_playing(self) -> bool:
        # A reply still being made is the session's to interrupt: its cancellation cuts it here.
        playing = self._playout.playing_reply(self._now) if self._playout is not None else None
        return playing is not None and playing not in self._view.replies

    def _cut(self, *, cancelled: str | None = None) -> Heard | None:
        """Drop the reply audio not sent yet; truncate the reply's item at what the caller heard.

        ``cancelled``: the reply the session cancelled, whose item is truncated even when none of
        it is playing any more: a reply held while the caller's speech over it was judged has
        played out its lead by the time the verdict cancels it, and the session is yet to hear
        how much of it was played since the last acknowledgement.
        """
        playout = self._playout
        if playout is None:
            return None
        heard = playout.heard(self._now)
        cut = playout.clear(self._now)
        if cut is None and heard is not None and heard.response_id == cancelled:
            cut = heard
        if cut is not None:
            self._commands.append(
                cmd.ConversationItemTruncate(item_id=cut.item_id, content_index=0, audio_end_ms=cut.played_ms)
            )
        return cut

    def _audio_frame(self, audio: bytes) -> Frame:
        """A piece of reply audio due now, as the client gets it: a ``session.output_audio.delta``."""
        self._audio_frames += 1
        wire = {
            "type": "session.output_audio.delta",
            "event_id": f"event_audio_{self._audio_frames}",
            "delta": wire_codec.b64encode(audio),
        }
        return wire_codec.dumps(wire)

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        """The reply audio due at ``now`` (see :meth:`_audio_frame`), and when to ask again."""
        self._now = now
        frames, self._own = self._own, []
        frames.extend(self.own_frames())
        if self._playout is None:
            return frames, None
        due, wake = self._playout.due(now)
        frames.extend(self._audio_frame(audio) for _, audio in due)
        heard = self._playout.acknowledge(now)
        if heard is not None:
            self._commands.append(
                cmd.PlaybackAck(
                    response_id=heard.response_id, item_id=heard.item_id, played_ms=heard.played_ms
                )
            )
        return frames, wake

    def tick(self, now: float) -> None:
        """The time of the next :meth:`render` or :meth:`parse` (a cut measures what was heard by it)."""
        self._now = now

    @property
    def wants_pump(self) -> bool:
        """A client event made frames of the dialect's own (a backend round resumed)."""
        return bool(self.state.outbox)

    def take_commands(self) -> list[cmd.Command]:
        """What the pacing has for the session: playback acks, and the truncation after a cut."""
        out, self._commands = self._commands, []
        out.extend(self.take_backend_commands())
        return out
