"""OpenAI Realtime over WebRTC: events on the ``oai-events`` data channel, audio on the media tracks.

Over WebRTC the client gets no ``response.output_audio.delta``: reply audio goes out on the
call's audio track, and the server, not the client, knows what was played. So the gateway
paces the reply in real time (:class:`~duplex_gateway.dialects.live_pacing.LivePlayout`, the
Live dialect's playout), tells the session what the caller heard, truncates an interrupted
item at that point itself (the client sends no ``conversation.item.truncate``), and reports the
track with OpenAI's WebRTC-only events: ``output_audio_buffer.started`` when a reply's audio
starts playing, ``stopped`` when it has played out, ``cleared`` when it was cut short.

The transport (:mod:`duplex_gateway.server.webrtc`) hands this dialect two kinds of frame: text,
the data channel's messages, and bytes, caller audio from the incoming track as PCM16 mono in the
dialect's input format. It takes back text for the data channel and bytes for the outgoing track
in its output format; an empty bytes frame means "drop what the track has not played yet" (a
barge-in stops the track at once, not after the lead already sent). The transport decodes the
tracks (Opus at :data:`MEDIA_RATE`) straight to the engine's own rates, so the session converts
nothing. Pure: no asyncio, no sockets, no clock; time arrives as arguments.
"""

from __future__ import annotations

from dataclasses import replace

from duplex_gateway.dialects import wire_codec
from duplex_gateway.dialects.live_pacing import LivePlayout
from duplex_gateway.dialects.realtime import RealtimeDialect
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import UNSET

__all__ = ["CLEAR_TRACK", "MEDIA_FORMAT", "MEDIA_RATE", "WebRtcRealtimeDialect"]

#: What browsers negotiate for Opus, and what the tracks carry between transport and dialect.
MEDIA_RATE = 48_000
MEDIA_FORMAT = AudioFormat(encoding=Encoding.PCM16, rate=MEDIA_RATE)
#: The frame that tells the transport to drop the reply audio the track holds.
CLEAR_TRACK = b""


class WebRtcRealtimeDialect(RealtimeDialect):
    """The Realtime dialect of a WebRTC call (a :class:`~duplex_gateway.dialects.base.PacedDialect`).

    A reply the engine has finished making can still be playing: the session has no reply to
    interrupt then, so caller speech over it (with ``interrupt_response``) is a barge-in this
    dialect cuts itself, as a WebSocket client would by truncating what it plays.
    """

    def __init__(
        self,
        *,
        session_id: str,
        call_id: str,
        max_message_bytes: int,
        input_format: AudioFormat = MEDIA_FORMAT,
        output_format: AudioFormat = MEDIA_FORMAT,
    ) -> None:
        """``input_format`` / ``output_format``: the PCM16 the transport decodes the caller's track
        to, and takes for the reply's (the session's formats, which a client cannot change)."""
        super().__init__(session_id=session_id, beta=False, duplex=False, max_message_bytes=max_message_bytes)
        #: The call's id (``/v1/realtime/calls/{call_id}``): sideband sockets and hang-ups name it.
        self.call_id = call_id
        self.input_format = input_format
        self.output_format = output_format
        self._playout = LivePlayout(output_format)
        self._now = 0.0
        self._commands: list[cmd.Command] = []
        #: Frames of the dialect's own for the next pump (the WebRTC-only events, a track clear).
        self._own: list[Frame] = []
        self._own_events = 0
        #: Replies the session is still making (a cut of one of those is the session's to decide).
        self._making: set[str] = set()
        #: The reply whose audio the track is playing, announced with ``output_audio_buffer.started``.
        self._started: str | None = None
        self._barge_in = True

    # -- client frames ---------------------------------------------------------------------------

    def parse(self, frame: str | bytes) -> tuple[cmd.Command, ...]:
        if isinstance(frame, bytes):
            # The incoming track, decoded by the transport to the session's input format (the engine's rate).
            if not frame:
                return ()
            fmt = self.input_format
            return (cmd.InputAudioAppend(audio=frame, encoding=fmt.encoding, rate=fmt.rate),)
        return tuple(_on_the_tracks(command) for command in super().parse(frame))

    # -- server events ---------------------------------------------------------------------------

    def render(self, event: ev.ServerEvent, *, seq: int) -> str | None:
        if isinstance(event, ev.AudioDelta):
            fmt = self.output_format
            if event.encoding is not fmt.encoding or event.rate != fmt.rate:
                raise ValueError(
                    f"reply audio of this WebRTC call must be {fmt}, not {event.encoding} {event.rate}"
                )
            self._playout.queue(event.response_id, event.item_id, event.audio)
            return None  # played out on the track by pump()
        if isinstance(event, ev.ResponseCreated):
            self._making.add(event.response_id)
        elif isinstance(event, ev.ResponseDone):
            self._making.discard(event.response_id)
            if event.status == "cancelled":
                self._cut(event.response_id)
        elif isinstance(event, ev.OutputAudioCleared):
            # The client's output_audio_buffer.clear: the track stops. The session's event names
            # the reply it cancelled; one it had finished making, still playing here, is named by the cut.
            self._cut(event.response_id, announce=event.response_id is None)
        elif isinstance(event, ev.SessionCreated | ev.SessionUpdated):
            td = event.config.turn_detection
            self._barge_in = td is not None and td.interrupt_response
        elif isinstance(event, ev.SpeechStarted) and self._barge_in and self._made_reply_playing():
            self._cut(self._playout.playing_reply(self._now))
        elif isinstance(event, ev.OverlapDecision):
            if event.action == "pause":
                self._playout.hold()
            elif event.action == "resume":
                self._playout.release()
        return super().render(event, seq=seq)

    def _made_reply_playing(self) -> bool:
        # A reply still being made is the session's to interrupt: its cancellation cuts it here.
        playing = self._playout.playing_reply(self._now)
        return playing is not None and playing not in self._making

    def _cut(self, response_id: str | None, *, announce: bool = True) -> None:
        """Stop the track now and truncate the reply's item at what the caller heard."""
        cut = self._playout.clear(self._now)
        if cut is None:
            return
        self._own.append(CLEAR_TRACK)
        self._commands.append(
            cmd.ConversationItemTruncate(item_id=cut.item_id, content_index=0, audio_end_ms=cut.played_ms)
        )
        if announce:
            self._own.append(self._event("output_audio_buffer.cleared", response_id or cut.response_id))
        self._started = None

    def _event(self, kind: str, response_id: str) -> str:
        self._own_events += 1
        wire = {"type": kind, "event_id": f"event_rtc_{self._own_events}", "response_id": response_id}
        return wire_codec.dumps(wire)

    # -- the pacing ------------------------------------------------------------------------------

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        """The reply audio due at ``now`` for the track, the WebRTC events, and when to ask again."""
        self._now = now
        frames, self._own = self._own, []
        due, wake = self._playout.due(now)
        for response_id, audio in due:
            if self._started != response_id:
                if self._started is not None:
                    frames.append(self._event("output_audio_buffer.stopped", self._started))
                self._started = response_id
                frames.append(self._event("output_audio_buffer.started", response_id))
            frames.append(audio)
        if self._started is not None:
            if not self._playout.playing(now) and self._started not in self._making:
                frames.append(self._event("output_audio_buffer.stopped", self._started))
                self._started = None
            elif wake is None:
                # All of it is on the track: wake when it has played, to say it stopped.
                end = self._playout.ends_at
                wake = end if end is not None and end > now else None
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
        return bool(self._own)

    def take_commands(self) -> list[cmd.Command]:
        """What the pacing has for the session: playback acks, and the truncation after a cut."""
        out, self._commands = self._commands, []
        return out


def _on_the_tracks(command: cmd.Command) -> cmd.Command:
    """A ``session.update`` without its audio formats: a call's audio is the tracks' (Opus, at 48 kHz).

    The session's formats stay what the transport decodes the tracks to (PCM16 at the engine's
    rates); ``session.updated`` shows them.
    """
    if not isinstance(command, cmd.SessionUpdate):
        return command
    patch = command.session
    if patch.input_format is UNSET and patch.output_format is UNSET:
        return command
    return replace(command, session=replace(patch, input_format=UNSET, output_format=UNSET))
