"""What a :class:`~duplex_gateway.session.machine.Session` asks its host to do: engine calls and reports.

Frozen values the session returns beside its server events; the I/O layer
(:mod:`duplex_gateway.host.connection`, :mod:`duplex_gateway.host.engine_link`) carries them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from duplex_gateway.audio.turn_detector import SpeechCandidate
from duplex_gateway.engine import port
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import CloseCode
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.session_config import SessionConfig

__all__ = [
    "AckPlayback",
    "AcknowledgeEvents",
    "AddFunctionCall",
    "AddFunctionOutput",
    "AddItem",
    "AppendAudio",
    "AppendText",
    "AssessTurn",
    "BargeInEngine",
    "CallerPaused",
    "CancelInput",
    "CancelResponse",
    "ClearInput",
    "CloseSession",
    "CommitInput",
    "DeleteItem",
    "EngineCall",
    "OpenEngine",
    "Output",
    "ProcessInput",
    "ReportLatency",
    "SignalTurn",
    "StartResponse",
    "TruncateReply",
    "UpdateEngine",
]


# -- what the session asks the I/O layer to do ------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCall:
    """Base of the calls the session asks to be made on the engine session."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenEngine(EngineCall):
    config: SessionConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class AssessTurn(EngineCall):
    """``semantic_vad``: have the end-of-turn model judge the caller's turn so far, then call
    :meth:`Session.turn_assessed` with its probability that the caller is done.

    The audio judged is the caller's most recent, up to now (``candidate``'s end).
    """

    item_id: str
    candidate: SpeechCandidate
    #: The probability at or above which the turn ends (the session's eagerness).
    threshold: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessInput(EngineCall):
    """Decode, resample and VAD-scan caller audio, then call :meth:`Session.input_processed`.

    ``format`` is the audio's (the session's input format when None); ``is_speech``,
    ``hints`` and ``video_frames`` go back to :meth:`Session.input_processed` with the
    result (the frames with the chunk's last slice: they were taken while it was spoken).
    """

    audio: bytes
    format: AudioFormat | None = None
    is_speech: bool | None = None
    hints: Mapping[str, object] = field(default_factory=dict)
    video_frames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AcknowledgeEvents(EngineCall):
    """The client has every server event up to ``server_event_seq``: trim the resume journal."""

    server_event_seq: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendAudio(EngineCall):
    pcm: bytes
    #: The client's per-chunk hints (see :meth:`~duplex_gateway.engine.port.EngineSession.append_audio`).
    is_speech: bool | None = None
    hints: Mapping[str, object] = field(default_factory=dict)
    #: Camera frames taken while this audio was spoken (only to engines with ``video_input``).
    video_frames: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class CommitInput(EngineCall):
    """The caller's turn ``item_id`` is complete; the engine replies as ``response_id`` if set.

    ``engine_decides``: no reply was asked for; the engine's own turn-taking decides.
    """

    item_id: str
    response_id: str | None
    final: bool = True
    engine_decides: bool = False
    #: The client's word on the turn (``is_speech: false``: silence), for the engine's turn-taking.
    is_speech: bool | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ClearInput(EngineCall):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelInput(EngineCall):
    """The caller abandoned the turn in progress (``input.cancel``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AppendText(EngineCall):
    """Text pushed into the caller's live turn."""

    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalTurn(EngineCall):
    """A client's turn signal for the engine's own turn-taking."""

    event: str
    payload: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class CallerPaused(EngineCall):
    """Hint: the caller went quiet mid-turn; the turn may end after the silence duration."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AddItem(EngineCall):
    item_id: str
    role: str
    text: str
    #: Where it goes: after this item, at the start for ``"root"``, last when None.
    previous_item_id: str | None = None
    #: A user message's pictures, as data URLs (only to engines with ``image_input``).
    images: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class AddFunctionCall(EngineCall):
    """A function call the client put into the conversation (replayed history)."""

    item_id: str
    call_id: str
    name: str
    arguments: str
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AddFunctionOutput(EngineCall):
    """What the client's function returned, for the engine's next reply."""

    item_id: str
    call_id: str
    output: str
    previous_item_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeleteItem(EngineCall):
    item_id: str
    #: The reply that made the item, and the call's id for a function call it made (None: the client's item).
    response_id: str | None = None
    call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StartResponse(EngineCall):
    response_id: str
    instructions: str | None
    #: The reply's own options (``response.create``); None: the session's settings.
    options: port.ResponseOptions | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelResponse(EngineCall):
    response_id: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BargeInEngine(EngineCall):
    pass


@dataclass(frozen=True, slots=True, kw_only=True)
class AckPlayback(EngineCall):
    response_id: str
    played_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TruncateReply(EngineCall):
    """The caller heard only ``audio_end_ms`` of the reply: the model's history keeps only that."""

    response_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class UpdateEngine(EngineCall):
    """Give the engine ``config``; report the outcome with :meth:`Session.engine_updated` /
    :meth:`Session.engine_update_refused` (``session.updated`` waits for the engine)."""

    config: SessionConfig
    #: The configuration before this update, kept if the engine refuses it.
    previous: SessionConfig
    #: The client's ``session.update`` event id, echoed on a refusal.
    event_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CloseSession(EngineCall):
    """End the session: release the engine session and close the socket with ``code``."""

    reason: str
    code: CloseCode


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportLatency(EngineCall):
    """A reply's first audio is out: where its time went, for the host to record (metrics, logs).

    Made for every reply whether the client asked for ``turn.latency`` or not; the
    event in ``latency`` goes to the client only when it asked (``session.include``).
    """

    latency: ev.TurnLatency
    #: From the reply's request (its turn's commit, or ``response.create``) to its first audio.
    first_audio_ms: float
    #: From the end of the caller's speech to the first audio: ``latency.total_ms`` when
    #: the gateway's turn detection found that end, else None.
    speech_end_ms: float | None


#: What one step of the session returns: events for the client, calls for the host and the engine.
Output = ev.ServerEvent | EngineCall
