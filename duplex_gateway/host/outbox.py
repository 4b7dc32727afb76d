"""The way out for a session's server events: numbered, rendered, journaled, watched and recorded.

Every event the session emits comes through :meth:`Outbox.emit`, in order and
without waiting: reply audio is encoded for the client (with the epoch fence), the
event is numbered and rendered through the connection's dialect, kept in the resume
journal, shown to the observers, told to the recorder, and queued on the attached
socket, if one is attached. A detached session's events wait in the journal for a
``session.resume``.
"""

from __future__ import annotations

import asyncio

from duplex_gateway.audio.stage import OutputStage
from duplex_gateway.dialects.base import Dialect
from duplex_gateway.host.observers import Observers
from duplex_gateway.host.pacing import Pacer
from duplex_gateway.host.resumption import Journal
from duplex_gateway.host.transport import Attachment
from duplex_gateway.ops.recording import Recorder
from duplex_gateway.ops.session_stats import SessionStats
from duplex_gateway.session.machine import Session
from duplex_gateway.state.writer import SessionMirror
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.frames import Frame

__all__ = ["Outbox"]


class Outbox:
    """Numbers, renders and delivers one session's server events; owns their sequence numbers."""

    def __init__(
        self,
        session: Session,
        dialect: Dialect,
        *,
        output: OutputStage,
        journal: Journal | None,
        stats: SessionStats,
        recorder: Recorder,
        pacer: Pacer | None,
    ) -> None:
        """``journal``: where events are kept for a resume (None: the session cannot be resumed)."""
        self._session = session
        self._dialect = dialect
        self._output = output
        self._journal = journal
        self._stats = stats
        self._recorder = recorder
        self._pacer = pacer
        self._seq = 0
        #: The socket the session's events go to now (None: detached, or not yet attached).
        self.attachment: Attachment | None = None
        #: Read-only Realtime clients watching the session (made on the first one).
        self.observers: Observers | None = None
        #: The session's copy in the fleet's state store (None: kept in this process only).
        self.mirror: SessionMirror | None = None

    def emit(self, event: ev.ServerEvent) -> None:
        """Send what the session decided: its reply audio encoded for the client, then numbered and sent."""
        self._stats.event(event, asyncio.get_running_loop().time())
        if isinstance(event, ev.AudioDelta):
            self._recorder.assistant_audio(event.audio)  # the engine's PCM16, before client encoding
        session = self._session
        for out in self._output.encode(event, session.config.output_format, session.epoch):
            self.emit_raw(out)
        if isinstance(event, ev.ResponseDone):
            # vLLM-Omni's server follows every response.done with one; clients sequence on it.
            self.emit_raw(ev.RateLimitsUpdated())

    def emit_raw(self, event: ev.ServerEvent, *, observed: bool = True) -> None:
        """Number, render and journal ``event``, then queue it for the attached socket, if any.

        ``observed``: observers (strict Realtime clients) get it too.
        """
        if self.observers is not None and observed:
            self.observers.send(event)
        if self._pacer is not None:
            self._pacer.clock(asyncio.get_running_loop().time())
            self._pacer.pump_soon()  # it may have queued paced frames
        frame = self._dialect.render(event, seq=self._seq + 1)
        self._recorder.server_event(event, frame is not None)
        if frame is None:
            return
        self._seq += 1
        if self._journal is not None:
            self._journal.append(self._seq, frame)
            if self.mirror is not None:
                self.mirror.event(self._seq, frame)
                if isinstance(event, ev.SessionCreated | ev.SessionUpdated) and isinstance(frame, str):
                    self.mirror.configured(frame)
        attachment = self.attachment
        if attachment is None:
            return  # detached: the journal holds it for a resume
        if isinstance(event, ev.AudioDelta):
            # Its write time feeds the chunk-gap and barge-in cut-off histograms.
            attachment.send(frame, on_sent=self._stats.audio_queued(event.response_id))
        else:
            attachment.send(frame)

    def carry_on(self, head: int) -> None:
        """Number from ``head`` on: the session's events up to it were sent by another gateway."""
        self._seq = head

    @property
    def journal(self) -> Journal | None:
        """The events kept for a resume (None: the session cannot be resumed)."""
        return self._journal

    def send_frame(self, frame: Frame) -> None:
        """A frame outside the numbered stream (a paced one) to the attached socket, if any."""
        if self.attachment is not None:
            self.attachment.send(frame)

    def acknowledge(self, seq: int) -> None:
        """The client has every event up to ``seq``; raises ``ProtocolError`` for one never sent."""
        if self._journal is not None:  # nothing kept for a resume: nothing to trim
            self._journal.acknowledge(seq)
            if self.mirror is not None:
                self.mirror.acknowledged(seq)

    def replay(self, attachment: Attachment, last_seq: int) -> None:
        """Queue on ``attachment`` every journaled event after ``last_seq``, oldest first."""
        if self._journal is not None:
            for frame in self._journal.after(last_seq):
                attachment.send(frame)
