"""OpenAI's Live API over WebRTC: Live events on the call's data channel, audio on its media tracks.

A Live WebRTC session is started by its ``POST /v1/live/sessions``, whose body carries the
session's startup configuration beside the SDP offer: no ``session.start`` comes on the data
channel. :func:`check_webrtc_session` reads that configuration when the offer is posted (a bad
one refuses the offer); the transport then hands it to the dialect as the session's first client
event, so it applies exactly as ``session.start`` applies on the WebSocket, and a client that
sends ``session.start`` on the channel is told the session has already started.

Over WebRTC the client sends no ``session.input_audio.append`` and gets no
``session.output_audio.delta``: the caller's audio arrives on the incoming track, decoded by the
transport to PCM16 at the engine's input rate, and the reply goes out on the outgoing track, from
PCM16 at the engine's output rate. The reply is paced as over the WebSocket
(:class:`~duplex_gateway.dialects.live_pacing.PacedLiveDialect`: the gateway's clock says what the
caller heard), and a cut (a barge-in) also drops what the track holds
(:data:`~duplex_gateway.dialects.realtime_webrtc.CLEAR_TRACK`), so the track stops at once and the
reply's item is truncated at what was played. The session timeline (``start_ms``, ``end_ms``) is
the track's audio received. Pure: no asyncio, no sockets, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import ClassVar

from duplex_gateway.dialects.live_commands import PARSERS, LiveState, Parser
from duplex_gateway.dialects.live_errors import (
    INVALID_VALUE,
    missing,
    read_object,
    refuse,
    unknown,
    wrong_type,
)
from duplex_gateway.dialects.live_pacing import Heard, PacedLiveDialect
from duplex_gateway.dialects.live_session import LiveSetup, parse_start
from duplex_gateway.dialects.realtime_webrtc import CLEAR_TRACK, MEDIA_FORMAT
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.frames import Frame
from duplex_gateway.vocabulary.session_config import UNSET

__all__ = ["WebRtcLiveDialect", "check_webrtc_session", "opening_event"]


def check_webrtc_session(session: object) -> LiveSetup:
    """A ``POST /v1/live/sessions`` body's ``session``, read as ``session.start`` reads its own.

    Raises the :class:`~duplex_gateway.dialects.live_errors.LiveProtocolError` the WebSocket's
    ``session.start`` would get for it; and ``audio.format``, which only a WebSocket takes (a
    WebRTC call's format is the tracks'), is refused as unknown here.
    """
    if not isinstance(session, dict):
        raise missing("session") if session is None else wrong_type("session", "an object", session)
    audio = read_object(session, "audio", "session")
    if audio is not None and "format" in audio:
        raise unknown("session.audio.format", " WebRTC negotiates its audio format on the media tracks.")
    return parse_start(session)


def opening_event(session: Mapping[str, object]) -> str:
    """The ``session.start`` a Live WebRTC session reads first: what its POST carried."""
    return json.dumps({"type": "session.start", "session": session}, separators=(",", ":"))


def _audio_on_the_track(
    data: Mapping[str, object], event_id: str | None, state: LiveState
) -> tuple[cmd.Command, ...]:
    raise refuse(
        INVALID_VALUE,
        "session.input_audio.append is not taken on a WebRTC session: its audio comes on the call's audio track.",
        param="type",
    )


class WebRtcLiveDialect(PacedLiveDialect):
    """The Live dialect of a WebRTC call (a :class:`~duplex_gateway.dialects.base.PacedDialect`).

    Text frames are the data channel's Live events; bytes in are the caller's track (PCM16 in
    ``input_format``), bytes out the reply's (PCM16 in ``output_format``), and an empty bytes
    frame out tells the transport to drop what the track has not played yet.
    """

    parsers: ClassVar[Mapping[str, Parser]] = {**PARSERS, "session.input_audio.append": _audio_on_the_track}

    def __init__(
        self,
        *,
        session_id: str,
        call_id: str,
        expires_at: int,
        max_message_bytes: int,
        backend: str | None = None,
        input_format: AudioFormat = MEDIA_FORMAT,
        output_format: AudioFormat = MEDIA_FORMAT,
    ) -> None:
        """``input_format`` / ``output_format``: the PCM16 the transport decodes the caller's
        track to, and takes for the reply's (the engine's rates: the session converts nothing)."""
        super().__init__(
            session_id=session_id, expires_at=expires_at, max_message_bytes=max_message_bytes, backend=backend
        )
        #: The call's id: hang-ups and the transport's table name it.
        self.call_id = call_id
        self.input_format = input_format
        self.output_format = output_format

    # -- client frames ---------------------------------------------------------------------------

    def parse(self, frame: Frame) -> tuple[cmd.Command, ...]:
        if isinstance(frame, bytes):
            # The incoming track. Its audio is the session timeline, as appends are on the WebSocket.
            if not frame or self.state.setup is None:
                return ()
            fmt = self.input_format
            self.state.timeline_ms += fmt.duration_ms(len(frame))
            return (cmd.InputAudioAppend(audio=frame, encoding=fmt.encoding, rate=fmt.rate),)
        commands = super().parse(frame)
        setup = self.state.setup
        if setup is not None and setup.audio_format != self.output_format:
            # The reply's audio is timed (the timeline, the playout) in the format the track takes.
            self.state.setup = replace(setup, audio_format=self.output_format)
        return tuple(self._on_the_tracks(command) for command in commands)

    def _on_the_tracks(self, command: cmd.Command) -> cmd.Command:
        """The session's formats are the tracks' as the transport decodes them, whatever ``session.start`` says."""
        if not isinstance(command, cmd.SessionUpdate):
            return command
        patch = command.session
        if patch.input_format is UNSET and patch.output_format is UNSET:
            return command
        tracks = replace(patch, input_format=self.input_format, output_format=self.output_format)
        return replace(command, session=tracks)

    # -- the track -------------------------------------------------------------------------------

    def _audio_frame(self, audio: bytes) -> Frame:
        return audio  # onto the outgoing track, as it is due

    def _cut(self, *, cancelled: str | None = None) -> Heard | None:
        cut = super()._cut(cancelled=cancelled)
        if cut is not None:
            self._own.append(CLEAR_TRACK)  # the lead already on the track goes too: it stops at once
        return cut

    @property
    def wants_pump(self) -> bool:
        return bool(self._own) or super().wants_pump
