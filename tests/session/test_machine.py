"""The session state machine, driven without a socket, a task or a clock."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import pytest

from duplex_gateway.engine import port
from duplex_gateway.session import machine as session_module
from duplex_gateway.session.machine import (
    AcknowledgeEvents,
    AckPlayback,
    AppendAudio,
    BargeInEngine,
    CancelResponse,
    ClearInput,
    CloseSession,
    CommitInput,
    DeleteItem,
    Handshake,
    OpenEngine,
    Output,
    ProcessInput,
    ReportLatency,
    Session,
    StartResponse,
    TruncateReply,
    UpdateEngine,
)
from duplex_gateway.vocabulary import commands as cmd
from duplex_gateway.vocabulary import events as ev
from duplex_gateway.vocabulary.errors import CloseCode, ErrorCode
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    OVERLAP_EVENT,
    FunctionTool,
    InputTranscription,
    SessionConfig,
    SessionKind,
    SessionPatch,
    ToolChoice,
    ToolChoiceMode,
    TurnDetection,
)
from tests.typed import narrow, only

RATE = 24_000
CAPS = port.EngineCapabilities(name="test", input_rate=RATE, output_rate=RATE)
MANUAL = SessionConfig(turn_detection=None)
VAD = SessionConfig(turn_detection=TurnDetection(prefix_padding_ms=100, silence_duration_ms=200))


def make(config: SessionConfig = MANUAL, handshake: Handshake = Handshake.REALTIME, **kw: Any) -> Session:
    return Session(session_id="sess_1", capabilities=CAPS, defaults=config, handshake=handshake, **kw)


def types(outputs: Sequence[object]) -> list[str]:
    return [o.type if isinstance(o, ev.ServerEvent) else type(o).__name__ for o in outputs]


def pcm(ms: int) -> bytes:
    return bytes(RATE * ms // 1000 * 2)


def start_response(s: Session, response_id: str = "resp_1") -> list[Output]:
    return s.engine_event(port.EngineResponseStarted(response_id=response_id))


def audio(s: Session, ms: int, response_id: str = "resp_1") -> list[Output]:
    return s.engine_event(port.EngineAudio(response_id=response_id, pcm=pcm(ms)))


# -- purity ----------------------------------------------------------------------------


def test_session_module_imports_no_io() -> None:
    tree = ast.parse(inspect.getsource(session_module))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"asyncio", "socket", "time", "threading", "websockets", "starlette"}


# -- handshake -------------------------------------------------------------------------


def test_realtime_handshake_announces_session_at_once() -> None:
    s = make()
    out = s.start()
    assert types(out) == ["session.created"]
    assert dict(narrow(out[0], ev.SessionCreated).capabilities)["engine"] == "test"


def test_duplex_handshake_requires_session_update_first() -> None:
    s = make(handshake=Handshake.DUPLEX)
    assert s.start() == []
    out = s.receive(cmd.InputAudioAppend(audio=pcm(20), event_id="e1"), now=0)
    assert types(out) == ["error"]
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.SESSION_NOT_CONFIGURED
        and narrow(out[0], ev.ErrorEvent).event_id == "e1"
    )
    fmt = AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    out = s.receive(cmd.SessionUpdate(session=SessionPatch(input_format=fmt)), now=0)
    assert types(out) == ["OpenEngine"]
    assert narrow(out[0], OpenEngine).config.input_format == fmt
    created = s.engine_opened()
    assert types(created) == ["session.created"]
    assert s.receive(cmd.InputAudioAppend(audio=bytes(640)), now=0) == [ProcessInput(audio=bytes(640))]


@pytest.mark.parametrize("handshake", list(Handshake))
def test_a_session_carried_on_from_another_gateway_is_open_and_says_nothing(handshake: Handshake) -> None:
    """Its client was told session.created on the gateway it came from: no second one, no update needed."""
    s = make(handshake=handshake)
    s.carried_on()
    assert s.configured
    assert s.receive(cmd.InputAudioAppend(audio=bytes(640)), now=0) == [ProcessInput(audio=bytes(640))]


def test_event_ack_is_answered_by_nothing_and_trims_the_resume_journal() -> None:
    s = make(handshake=Handshake.DUPLEX)
    # No event back (DuplexClient acks every event: an answer would loop), but the journal
    # no longer keeps what the client has acknowledged, as vLLM-Omni's does not.
    assert s.receive(cmd.SessionEventAck(server_event_seq=3), now=0) == [
        AcknowledgeEvents(server_event_seq=3)
    ]


def test_resumed_event_names_the_new_token_and_the_socket_generation() -> None:
    s = make(handshake=Handshake.DUPLEX)
    s.resume_token = "tok2"
    resumed = s.resumed(3)
    assert resumed.type == "session.resumed" and resumed.resume_token == "tok2"
    assert resumed.attachment_generation == 3 and resumed.session_id == "sess_1"


def test_heartbeat_works_before_configuration() -> None:
    s = make(handshake=Handshake.DUPLEX)
    assert types(s.receive(cmd.SessionHeartbeat(), now=0)) == ["session.heartbeat_ack"]


# -- input -----------------------------------------------------------------------------


JPEG = "/9j/4AAQ"  # a JPEG signature, base64


def test_video_frames_reach_an_engine_that_sees_with_their_audio() -> None:
    s = Session(
        session_id="sess_1",
        capabilities=replace(CAPS, video_input=True),
        defaults=MANUAL,
        handshake=Handshake.REALTIME,
    )
    out = s.receive(cmd.InputAudioAppend(audio=pcm(200), video_frames=(JPEG,)), now=0)
    assert out == [ProcessInput(audio=pcm(200), video_frames=(JPEG,))]
    appended = s.input_processed(pcm(200), 200.0, video_frames=(JPEG,))
    assert appended == [AppendAudio(pcm=pcm(200), video_frames=(JPEG,))]
    # Frames whose audio is still in the resampler wait for the next audio, which takes them.
    assert s.input_processed(b"", 0.0, video_frames=(JPEG,)) == []
    assert s.input_processed(pcm(20), 20.0) == [AppendAudio(pcm=pcm(20), video_frames=(JPEG,))]
    assert s.input_processed(pcm(20), 20.0) == [AppendAudio(pcm=pcm(20))]
    # Input the client clears takes its waiting frames with it.
    assert s.input_processed(b"", 0.0, video_frames=(JPEG,)) == []
    s.receive(cmd.InputAudioClear(), now=0)
    assert s.input_processed(pcm(20), 20.0) == [AppendAudio(pcm=pcm(20))]


def duplex_session() -> Session:
    """A session opened with vLLM-Omni's duplex handshake, as its benchmark clients open one."""
    s = make(handshake=Handshake.DUPLEX)
    assert types(s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)) == ["OpenEngine"]
    s.engine_opened()
    return s


def test_video_frames_an_engine_does_not_use_cost_one_notice_never_the_audio() -> None:
    s = duplex_session()
    out = s.receive(cmd.InputAudioAppend(audio=pcm(200), video_frames=(JPEG,)), now=0)
    assert out[0] == ProcessInput(audio=pcm(200))
    assert types(out) == ["ProcessInput", "input.ignored"]
    notice = out[1]
    assert isinstance(notice, ev.InputIgnored) and (notice.input, notice.engine) == ("video_frames", "test")
    # Said once per session: later frames go unmentioned, their audio still counts.
    for _ in range(3):
        assert s.receive(cmd.InputAudioAppend(audio=pcm(200), video_frames=(JPEG,)), now=0) == [
            ProcessInput(audio=pcm(200))
        ]
    # Pictures in messages are another kind of input: told of once, on their own.
    picture = "data:image/jpeg;base64," + JPEG
    out = s.receive(
        cmd.ConversationItemCreate(item_id=None, role="user", text="hi", images=(picture,)), now=0
    )
    assert types(out)[:2] == ["input.ignored", "AddItem"]
    assert narrow(out[0], ev.InputIgnored).input == "input_image"
    assert (
        narrow(out[1], session_module.AddItem).images == ()
        and narrow(out[1], session_module.AddItem).text == "hi"
    )
    out = s.receive(cmd.ConversationItemCreate(item_id=None, role="user", text="", images=(picture,)), now=0)
    assert "input.ignored" not in types(out)


def test_a_realtime_client_is_told_of_unused_pictures_only_if_it_asked() -> None:
    # OpenAI defines no such event and strict clients (openai-agents) refuse unknown ones.
    picture = "data:image/jpeg;base64," + JPEG
    item = cmd.ConversationItemCreate(item_id=None, role="user", text="hi", images=(picture,))
    plain = make()
    assert "input.ignored" not in types(plain.receive(item, now=0))
    assert plain.receive(cmd.InputAudioAppend(audio=pcm(20), video_frames=(JPEG,)), now=0) == [
        ProcessInput(audio=pcm(20))
    ]
    asked = make(replace(MANUAL, include=("input.ignored",)))
    assert types(asked.receive(item, now=0))[0] == "input.ignored"


def test_pictures_reach_an_engine_that_takes_them() -> None:
    s = Session(
        session_id="sess_1",
        capabilities=replace(CAPS, image_input=True),
        defaults=MANUAL,
        handshake=Handshake.REALTIME,
    )
    picture = "data:image/png;base64,iVBORw0K"
    out = s.receive(cmd.ConversationItemCreate(item_id="i1", role="user", text="", images=(picture,)), now=0)
    assert types(out) == ["AddItem", "conversation.item.added", "conversation.item.done"]
    assert narrow(out[0], session_module.AddItem).images == (picture,)
    assert narrow(out[1], ev.ConversationItemAdded).item.images == 1


def test_bad_video_frames_are_reported_and_their_audio_kept() -> None:
    s = make()
    out = s.receive(cmd.InputAudioAppend(audio=pcm(20), event_id="a1", video_error="not a picture"), now=0)
    assert out[0] == ProcessInput(audio=pcm(20))
    error = out[1]
    assert isinstance(error, ev.ErrorEvent) and (error.param, error.event_id) == ("video_frames", "a1")
    assert "audio was kept" in error.message


def test_append_validates_whole_samples_and_emptiness() -> None:
    s = make()
    out = s.receive(cmd.InputAudioAppend(audio=b"\x00\x01\x02"), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.INVALID_AUDIO_LENGTH
    out = s.receive(cmd.InputAudioAppend(audio=b""), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.INVALID_VALUE


def test_manual_commit_and_empty_commit() -> None:
    s = make()
    out = s.receive(cmd.InputAudioCommit(event_id="c0"), now=0)
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.INPUT_AUDIO_BUFFER_EMPTY
        and narrow(out[0], ev.ErrorEvent).event_id == "c0"
    )
    assert s.input_processed(pcm(200), 200.0) == [AppendAudio(pcm=pcm(200))]
    out = s.receive(cmd.InputAudioCommit(), now=0)
    assert types(out) == [
        "CommitInput",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    commit = out[0]
    assert isinstance(commit, CommitInput) and commit.response_id is None
    assert narrow(out[1], ev.InputAudioCommitted).item_id == commit.item_id


def test_commit_may_ask_for_the_reply_itself() -> None:
    s = make()
    s.input_processed(pcm(200), 200.0)
    out = s.receive(cmd.InputAudioCommit(create_response=True), now=0)
    commit = out[0]
    assert isinstance(commit, CommitInput) and commit.response_id is not None
    # The reply is the session's from the commit on: announced at once, under the id the engine is given.
    assert (
        types(out)[-1] == "response.created"
        and narrow(out[-1], ev.ResponseCreated).response_id == commit.response_id
    )
    start_response(s, commit.response_id)
    s.input_processed(pcm(200), 200.0)
    out = s.receive(cmd.InputAudioCommit(create_response=True, event_id="c2"), now=0)
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.RESPONSE_ALREADY_ACTIVE
        and narrow(out[0], ev.ErrorEvent).event_id == "c2"
    )


AUTO = SessionConfig(turn_detection=None, auto_response=True)


def _commit(s: Session, **kw: Any) -> CommitInput:
    s.input_processed(pcm(200), 200.0)
    out = s.receive(cmd.InputAudioCommit(**kw), now=0)
    assert isinstance(out[0], CommitInput), out
    return out[0]


def test_auto_response_answers_a_bare_commit_as_vllm_omni_does() -> None:
    # vLLM-Omni's DuplexClient defaults: extra_body.auto_response and no turn detection.
    s = make(AUTO)
    commit = _commit(s)
    assert commit.response_id is not None
    # Without it, a bare commit with no turn detection asks for nothing (OpenAI's rule).
    assert _commit(make(MANUAL)).response_id is None


def test_auto_response_answers_even_a_commit_that_says_response_create_false() -> None:
    # vLLM-Omni's runner: should_create_response = response_create or auto_responds.
    assert _commit(make(AUTO), create_response=False).response_id is not None
    assert _commit(make(MANUAL), create_response=False).response_id is None


def test_auto_response_asks_no_second_reply_while_one_is_in_progress() -> None:
    s = make(AUTO)
    first = _commit(s)
    assert first.response_id is not None
    start_response(s, first.response_id)
    out = s.receive(cmd.InputAudioCommit(), now=0)  # nothing buffered since: still an error
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.INPUT_AUDIO_BUFFER_EMPTY
    second = _commit(s)
    assert second.response_id is None and s.response_active


def test_a_non_final_commit_is_not_auto_answered() -> None:
    assert _commit(make(AUTO), final=False).response_id is None
    # Unless the client asks for the reply itself.
    assert _commit(make(AUTO), final=False, create_response=True).response_id is not None


def test_a_commit_of_declared_silence_with_nothing_buffered_is_no_error() -> None:
    s = make(AUTO)
    assert s.receive(cmd.InputAudioCommit(is_speech=False), now=0) == []
    # Declared silence with audio buffered is a turn like any other (vLLM-Omni answers it).
    assert _commit(s, is_speech=False).response_id is not None


def test_auto_response_never_answers_a_transcription_session() -> None:
    s = make(replace(AUTO, kind=SessionKind.TRANSCRIPTION))
    assert _commit(s).response_id is None


def test_clear_drops_buffer() -> None:
    s = make()
    s.input_processed(pcm(200), 200.0)
    assert types(s.receive(cmd.InputAudioClear(), now=0)) == ["ClearInput", "input_audio_buffer.cleared"]
    assert (
        narrow(s.receive(cmd.InputAudioCommit(), now=0)[0], ev.ErrorEvent).code
        is ErrorCode.INPUT_AUDIO_BUFFER_EMPTY
    )


# -- server VAD ------------------------------------------------------------------------


def feed(s: Session, start_ms: int, ms: int, prob: float) -> list[Output]:
    """``ms`` of audio starting at ``start_ms`` whose 32 ms windows all score ``prob``."""
    windows = [(end, prob) for end in range(start_ms + 32, start_ms + ms + 1, 32)]
    return s.input_processed(pcm(ms), float(ms), windows)


def test_server_vad_turn_starts_with_prefix_padding_and_commits_after_silence() -> None:
    s = make(VAD)
    out = feed(s, 0, 960, 0.01)
    assert out == []  # silence only fills the prefix ring; the engine gets nothing
    out = feed(s, 960, 320, 0.95)
    assert types(out)[0] == "input_audio_buffer.speech_started"
    started = narrow(out[0], ev.SpeechStarted)
    assert started.audio_start_ms == 960 - 100
    # The ring's audio from the padding onward, plus this chunk, go to the engine.
    assert only(out, AppendAudio)
    out = feed(s, 1280, 320, 0.01)
    assert "input_audio_buffer.speech_stopped" in types(out)
    # The engine hears of the pause first, so it can start on the turn before it ends.
    assert types(out).index("CallerPaused") < types(out).index("input_audio_buffer.speech_stopped")
    assert types(out)[-5:] == [
        "CommitInput",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
        "response.created",
    ]
    stopped = only(out, ev.SpeechStopped)[0]
    assert stopped.item_id == started.item_id
    assert only(out, CommitInput)[0].response_id == narrow(out[-1], ev.ResponseCreated).response_id


def test_speech_during_reply_barges_in_and_fences_stale_audio() -> None:
    s = make(VAD)
    start_response(s)
    audio(s, 100)
    out = feed(s, 0, 320, 0.95)
    names = types(out)
    # Ordering: the caller's speech is announced first, then the reply is closed out.
    assert names[0] == "input_audio_buffer.speech_started"
    assert names.index("response.done") > 0
    assert "BargeInEngine" in names
    done = only(out, ev.ResponseDone)[0]
    assert done.status == "cancelled" and done.reason == "turn_detected"
    # Anything the engine still sends for the old reply is dropped.
    assert audio(s, 100) == []
    assert s.engine_event(port.EngineTranscript(response_id="resp_1", delta="late")) == []
    assert s.engine_event(port.EngineResponseDone(response_id="resp_1", status="completed")) == []
    assert s.epoch == 1


def test_interrupt_response_false_keeps_the_reply() -> None:
    s = make(SessionConfig(turn_detection=TurnDetection(interrupt_response=False)))
    start_response(s)
    out = feed(s, 0, 320, 0.95)
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert "response.done" not in types(out)
    assert types(audio(s, 20)) == ["response.output_audio.delta"]


# -- responses -------------------------------------------------------------------------


def test_response_lifecycle_event_order() -> None:
    s = make()
    out = s.receive(cmd.ResponseCreate(), now=0)
    assert isinstance(out[0], StartResponse)
    rid = out[0].response_id
    assert (
        types(out) == ["StartResponse", "response.created"]
        and narrow(out[1], ev.ResponseCreated).response_id == rid
    )
    out = start_response(s, rid)
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.content_part.added",
    ]
    assert types(audio(s, 40, rid)) == ["response.output_audio.delta"]
    assert types(s.engine_event(port.EngineTranscript(response_id=rid, delta="hi"))) == [
        "response.output_audio_transcript.delta"
    ]
    out = s.engine_event(port.EngineResponseDone(response_id=rid))
    assert types(out) == [
        "response.output_audio.done",
        "response.output_audio_transcript.done",
        "response.content_part.done",
        "response.output_item.done",
        "conversation.item.done",
        "response.done",
    ]
    done = narrow(out[-1], ev.ResponseDone)
    assert done.status == "completed" and done.audio_ms == 40 and done.output[0].transcript == "hi"


def test_a_finished_reply_announced_again_by_the_engine_stays_finished() -> None:
    # Found by tests/properties: an engine that started a reply it had already finished
    # (a late or replayed start) opened a second reply under the same id, done twice.
    s = make()
    rid = narrow(s.receive(cmd.ResponseCreate(), now=0)[0], StartResponse).response_id
    start_response(s, rid)
    audio(s, 40, rid)
    s.engine_event(port.EngineResponseDone(response_id=rid))
    assert start_response(s, rid) == []
    assert audio(s, 40, rid) == []
    assert s.engine_event(port.EngineResponseDone(response_id=rid)) == []
    assert not s.response_active


def test_text_modality_response() -> None:
    s = make(SessionConfig(turn_detection=None, output_modalities=(session_module.Modality.TEXT,)))
    rid = narrow(s.receive(cmd.ResponseCreate(), now=0)[0], StartResponse).response_id
    out = start_response(s, rid)
    assert narrow(out[-1], ev.ContentPartAdded).part_type == "text"
    assert audio(s, 20, rid) == []
    assert types(s.engine_event(port.EngineText(response_id=rid, delta="hello"))) == [
        "response.output_text.delta"
    ]
    out = s.engine_event(port.EngineResponseDone(response_id=rid))
    assert types(out)[0] == "response.output_text.done" and narrow(out[0], ev.TextDone).text == "hello"


def test_second_response_create_while_active_is_refused() -> None:
    s = make()
    s.receive(cmd.ResponseCreate(), now=0)
    out = s.receive(cmd.ResponseCreate(event_id="x"), now=0)
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.RESPONSE_ALREADY_ACTIVE
        and narrow(out[0], ev.ErrorEvent).event_id == "x"
    )


def test_cancel_without_response_is_an_error() -> None:
    s = make()
    out = s.receive(cmd.ResponseCancel(), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.RESPONSE_NOT_ACTIVE


def test_cancel_of_another_response_id_is_an_error() -> None:
    s = make()
    start_response(s)
    out = s.receive(cmd.ResponseCancel(response_id="resp_other"), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.RESPONSE_NOT_ACTIVE


def test_cancel_closes_out_and_fences() -> None:
    s = make()
    start_response(s)
    audio(s, 100)
    out = s.receive(cmd.ResponseCancel(response_id="resp_1"), now=0)
    assert out[0] == CancelResponse(response_id="resp_1")
    assert types(out)[-1] == "response.done" and narrow(out[-1], ev.ResponseDone).status == "cancelled"
    assert narrow(out[-1], ev.ResponseDone).output[0].status == "incomplete"
    assert audio(s, 100) == []


def test_cancel_before_engine_started_fences_the_late_start() -> None:
    s = make()
    rid = narrow(s.receive(cmd.ResponseCreate(), now=0)[0], StartResponse).response_id
    out = s.receive(cmd.ResponseCancel(), now=0)
    assert out[0] == CancelResponse(response_id=rid)
    assert narrow(out[-1], ev.ResponseDone).status == "cancelled"
    assert start_response(s, rid) == []
    assert audio(s, 20, rid) == []


def test_barge_in_command_without_reply_still_reaches_engine() -> None:
    s = make()
    assert s.receive(cmd.BargeIn(), now=0) == [BargeInEngine()]


def test_output_audio_clear_cancels_and_reports() -> None:
    s = make()
    start_response(s)
    out = s.receive(cmd.OutputAudioClear(), now=0)
    assert types(out)[-2:] == ["response.done", "output_audio_buffer.cleared"]
    assert narrow(out[-1], ev.OutputAudioCleared).response_id == "resp_1"


def test_engine_starting_a_new_response_closes_the_old_one() -> None:
    s = make()
    start_response(s, "a")
    out = start_response(s, "b")
    # The reply left behind is stopped in the engine too, not only closed out here.
    assert out[0] == CancelResponse(response_id="a")
    assert types(out)[6:8] == ["response.done", "response.created"]
    assert types(audio(s, 20, "b")) == ["response.output_audio.delta"]
    assert audio(s, 20, "a") == []


# -- playback cursor -------------------------------------------------------------------


def finished_reply(s: Session, ms: int = 500) -> str:
    start_response(s)
    audio(s, ms)
    out = s.engine_event(port.EngineResponseDone(response_id="resp_1"))
    return only(out, ev.ResponseDone)[0].output[0].id


def test_playback_ack_is_clamped_to_produced_audio() -> None:
    s = make()
    finished_reply(s, 500)
    out = s.receive(cmd.PlaybackAck(response_id="resp_1", item_id=None, played_ms=9000), now=0)
    assert out[0] == AckPlayback(response_id="resp_1", played_ms=500)
    assert (
        narrow(out[1], ev.PlaybackAcknowledged).played_ms == 500
        and narrow(out[1], ev.PlaybackAcknowledged).produced_ms == 500
    )


def test_playback_ack_naming_the_reply_item_as_vllm_omni_does() -> None:
    # vLLM-Omni calls a reply's item ``item_<response_id>`` and its clients send that name back.
    s = make()
    item_id = finished_reply(s, 500)
    assert item_id != "item_resp_1"
    for response_id in ("resp_1", None):
        out = s.receive(cmd.PlaybackAck(response_id=response_id, item_id="item_resp_1", played_ms=300), now=0)
        assert out[0] == AckPlayback(response_id="resp_1", played_ms=300)
        assert types(out) == ["AckPlayback", "playback.acknowledged"]
    # The name still has to match: another reply's, or one naming another response, is not found.
    for response_id, item in (("resp_1", "item_resp_2"), (None, "item_resp_9")):
        out = s.receive(cmd.PlaybackAck(response_id=response_id, item_id=item, played_ms=1), now=0)
        assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.ITEM_NOT_FOUND


def test_playback_ack_for_unknown_response() -> None:
    s = make()
    out = s.receive(cmd.PlaybackAck(response_id="nope", item_id=None, played_ms=1), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.ITEM_NOT_FOUND


def test_truncate_within_and_beyond_produced_audio() -> None:
    s = make()
    item_id = finished_reply(s, 500)
    out = s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=300), now=0)
    # The engine is told to cut the reply there, not merely that it was heard.
    assert out == [
        TruncateReply(response_id="resp_1", audio_end_ms=300),
        ev.ConversationItemTruncated(item_id=item_id, content_index=0, audio_end_ms=300),
    ]
    # Beyond the audio produced: clamped to all of it, as OpenAI does.
    out = s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=800), now=0)
    assert out == [
        TruncateReply(response_id="resp_1", audio_end_ms=500),
        ev.ConversationItemTruncated(item_id=item_id, content_index=0, audio_end_ms=500),
    ]
    out = s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=-1), now=0)
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.AUDIO_END_OUT_OF_RANGE
        and narrow(out[0], ev.ErrorEvent).param == "audio_end_ms"
    )
    out = s.receive(cmd.ConversationItemTruncate(item_id="missing", content_index=0, audio_end_ms=1), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.ITEM_TRUNCATE_INVALID_ITEM_ID


def test_truncate_of_the_playing_reply_cancels_it() -> None:
    s = make()
    out = start_response(s)
    item_id = narrow(out[1], ev.OutputItemAdded).item.id
    audio(s, 400)
    out = s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=250), now=0)
    assert "response.done" in types(out) and types(out)[-1] == "conversation.item.truncated"
    assert audio(s, 100) == []


# -- items -----------------------------------------------------------------------------


def test_item_create_retrieve_delete() -> None:
    s = make()
    out = s.receive(cmd.ConversationItemCreate(item_id="i1", role="user", text="hello"), now=0)
    assert types(out) == ["AddItem", "conversation.item.added", "conversation.item.done"]
    out = s.receive(cmd.ConversationItemRetrieve(item_id="i1"), now=0)
    assert narrow(out[0], ev.ConversationItemRetrieved).item.text == "hello"
    assert types(s.receive(cmd.ConversationItemDelete(item_id="i1"), now=0)) == [
        "DeleteItem",
        "conversation.item.deleted",
    ]
    assert (
        narrow(s.receive(cmd.ConversationItemDelete(item_id="i1"), now=0)[0], ev.ErrorEvent).code
        is ErrorCode.ITEM_DELETE_INVALID_ITEM_ID
    )
    dup = s.receive(cmd.ConversationItemCreate(item_id=None, role="robot", text="x"), now=0)
    assert narrow(dup[0], ev.ErrorEvent).code is ErrorCode.INVALID_VALUE


def test_item_history_is_bounded() -> None:
    s = make()
    for i in range(session_module.MAX_ITEMS + 10):
        s.receive(cmd.ConversationItemCreate(item_id=f"i{i}", role="user", text="x"), now=0)
    assert (
        narrow(s.receive(cmd.ConversationItemRetrieve(item_id="i0"), now=0)[0], ev.ErrorEvent).code
        is ErrorCode.ITEM_RETRIEVE_INVALID_ITEM_ID
    )


# -- engine-side turns, transcripts, errors, close --------------------------------------


def test_engine_detected_turns_and_transcripts() -> None:
    caps = port.EngineCapabilities(name="vad-engine", input_rate=RATE, output_rate=RATE, detects_turns=True)
    config = replace(VAD, input_transcription=InputTranscription())
    s = Session(session_id="s", capabilities=caps, defaults=config, handshake=Handshake.REALTIME)
    assert not s.gateway_vad
    # With engine-side turn detection every chunk goes straight to the engine.
    assert s.input_processed(pcm(20), 20.0, [(32, 0.99)]) == [AppendAudio(pcm=pcm(20))]
    out = s.engine_event(port.EngineSpeechStarted(audio_start_ms=10))
    item_id = narrow(out[0], ev.SpeechStarted).item_id
    assert s.engine_event(port.EngineInputTranscript(item_id="", text="hello")) == []
    partial = s.engine_event(port.EngineInputTranscript(item_id="", text="hello there"))
    assert partial == [ev.InputTranscriptionDelta(item_id=item_id, delta="hello")]
    out = s.engine_event(port.EngineSpeechStopped(audio_end_ms=900))
    assert out == [ev.SpeechStopped(audio_end_ms=900, item_id=item_id)]
    final = s.engine_event(port.EngineInputTranscript(item_id=item_id, text="hello", final=True))
    assert final == [ev.InputTranscriptionCompleted(item_id=item_id, transcript="hello")]


def test_partial_hypotheses_become_append_only_deltas() -> None:
    s = make(replace(MANUAL, input_transcription=InputTranscription()))

    def partial(text: str) -> list[str]:
        out = s.engine_event(port.EngineInputTranscript(item_id="item_p", text=text))
        return [narrow(o, ev.InputTranscriptionDelta).delta for o in out]

    assert partial("east") == []
    assert partial("please send") == []  # the first word was revised: nothing agreed yet
    assert partial("please send me") == ["please send"]
    assert partial("please send me the weather") == [" me"]
    assert partial("please send me the whether report") == [" the"]
    assert partial("please sent me") == []  # a revision of words already sent: wait for the final
    assert partial("please sent me the weather report") == []
    final = s.engine_event(port.EngineInputTranscript(item_id="item_p", text="Please send me.", final=True))
    assert final == [ev.InputTranscriptionCompleted(item_id="item_p", transcript="Please send me.")]


def test_engine_error_non_fatal_and_fatal() -> None:
    s = make()
    out = s.engine_event(port.EngineError(code="oops", message="hiccup"))
    assert types(out) == ["error"] and not s.closed
    out = s.engine_event(port.EngineError(code="dead", message="gone", fatal=True))
    assert types(out)[-2:] == ["session.closed", "CloseSession"]
    assert narrow(out[-1], CloseSession).code is CloseCode.ENGINE_FAILED
    assert s.receive(cmd.SessionHeartbeat(), now=0) == []


def test_client_close_cancels_reply_and_closes_normally() -> None:
    s = make()
    start_response(s)
    out = s.receive(cmd.SessionClose(), now=0)
    assert types(out)[-3:] == ["response.done", "session.closed", "CloseSession"]
    assert out[-1] == CloseSession(reason="client_close", code=CloseCode.NORMAL)
    assert audio(s, 20) == []


def test_expire_reports_why() -> None:
    s = make()
    out = s.expire("idle", CloseCode.IDLE_TIMEOUT, "no message for 1 s")
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.IDLE_TIMEOUT
    assert narrow(out[-1], CloseSession).code is CloseCode.IDLE_TIMEOUT
    assert s.expire("idle", CloseCode.IDLE_TIMEOUT, "again") == []


def test_session_update_reaches_engine_and_switches_turn_detection() -> None:
    s = make(VAD)
    assert s.gateway_vad
    out = s.receive(cmd.SessionUpdate(session=SessionPatch(turn_detection=None)), now=0)
    (update,) = out
    assert isinstance(update, UpdateEngine) and update.config.turn_detection is None
    assert not s.gateway_vad
    assert s.input_processed(pcm(20), 20.0) == [AppendAudio(pcm=pcm(20))]
    assert types(s.engine_updated(update)) == ["session.updated"]


def test_session_updated_waits_for_the_engine_and_a_refusal_takes_the_update_back() -> None:
    s = make(VAD)
    before = s.config
    patch = SessionPatch(voice="nova", temperature=0.7, extra_body={"force_listen_count": 2})
    out = s.receive(cmd.SessionUpdate(session=patch, event_id="evt_1"), now=0)
    # Only the engine call: the client hears of the update when the engine took it.
    (update,) = out
    assert isinstance(update, UpdateEngine) and update.previous is before and update.event_id == "evt_1"
    assert update.config.temperature == 0.7 and update.config.extra_body == {"force_listen_count": 2}
    accepted = s.engine_updated(update)
    assert (
        types(accepted) == ["session.updated"]
        and narrow(accepted[0], ev.SessionUpdated).config is update.config
    )

    # A refused update: an error naming the client's event, no session.updated, the old config back.
    update2 = only(
        s.receive(cmd.SessionUpdate(session=SessionPatch(voice="alloy"), event_id="evt_2"), now=0),
        UpdateEngine,
    )[0]
    assert s.config.voice == "alloy"
    out = s.engine_update_refused(update2, code="voice_update_after_audio_unsupported", message="no")
    (error,) = out
    assert isinstance(error, ev.ErrorEvent) and error.event_id == "evt_2"
    assert "voice_update_after_audio_unsupported" in error.message
    assert s.config is update.config and s.config.voice == "nova"


@pytest.mark.parametrize("command", [cmd.InputAudioClear(), cmd.BargeIn(), cmd.SessionHeartbeat()])
def test_commands_after_close_are_ignored(command: cmd.Command) -> None:
    s = make()
    s.receive(cmd.SessionClose(), now=0)
    assert s.receive(command, now=0) == []


def test_open_engine_twice_while_opening_is_refused() -> None:
    s = make(handshake=Handshake.DUPLEX)
    assert isinstance(s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)[0], OpenEngine)
    out = s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.SESSION_NOT_CONFIGURED


def test_clear_input_during_speech_resets_the_turn() -> None:
    s = make(VAD)
    feed(s, 0, 320, 0.95)
    out = s.receive(cmd.InputAudioClear(), now=0)
    assert out[0] == ClearInput()
    # Silence afterwards does not produce a stop for the dropped turn.
    assert "input_audio_buffer.speech_stopped" not in types(feed(s, 320, 640, 0.01))


def test_chunks_the_resampler_held_back_still_move_the_clock() -> None:
    s = make(VAD)
    # A resampler filling its filter returns no audio for a chunk; its time and VAD windows still count.
    assert s.input_processed(b"", 20.0, [(32, 0.01)]) == []
    assert s.input_processed(b"", 20.0, []) == []
    out = feed(s, 40, 320, 0.95)
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert s.input_processed(b"", 20.0, []) == []  # no empty AppendAudio in speech either


def test_shutdown_closes_with_going_away() -> None:
    s = make()
    start_response(s)
    out = s.shut_down()
    assert types(out)[-3:] == ["response.done", "session.closed", "CloseSession"]
    assert narrow(out[-1], CloseSession).code is CloseCode.GOING_AWAY
    assert s.shut_down() == []


# -- a reply is the session's from the moment it is requested ---------------------------


def requested_by_vad_turn(s: Session) -> str:
    """Speak one VAD turn; returns the id of the reply its end requested."""
    feed(s, 0, 320, 0.95)
    out = feed(s, 320, 320, 0.01)
    created = only(out, ev.ResponseCreated)
    assert len(created) == 1 and only(out, CommitInput)[0].response_id == created[0].response_id
    return created[0].response_id


def test_cancel_of_a_requested_reply_before_the_engine_starts_it() -> None:
    s = make(VAD)
    rid = requested_by_vad_turn(s)
    out = s.receive(cmd.ResponseCancel(), now=0)
    assert out[0] == CancelResponse(response_id=rid)
    assert types(out)[1:] == ["response.done"] and narrow(out[1], ev.ResponseDone).status == "cancelled"
    assert narrow(out[1], ev.ResponseDone).output == ()
    # Whatever the engine still announces for it stays out.
    assert start_response(s, rid) == [] and audio(s, 20, rid) == []


def test_output_audio_clear_cancels_a_requested_reply() -> None:
    s = make(VAD)
    rid = requested_by_vad_turn(s)
    out = s.receive(cmd.OutputAudioClear(), now=0)
    assert out[0] == CancelResponse(response_id=rid)
    assert types(out)[1:] == ["response.done", "output_audio_buffer.cleared"]
    assert narrow(out[-1], ev.OutputAudioCleared).response_id == rid


def test_caller_speech_interrupts_a_requested_reply() -> None:
    s = make(VAD)
    rid = requested_by_vad_turn(s)
    out = feed(s, 640, 320, 0.95)
    assert types(out)[0] == "input_audio_buffer.speech_started"
    assert CancelResponse(response_id=rid) in out and BargeInEngine() in out
    assert only(out, ev.ResponseDone)[0].reason == "turn_detected"
    assert start_response(s, rid) == []


def test_second_turn_while_a_reply_is_requested_asks_for_no_second_reply() -> None:
    s = make(
        SessionConfig(
            turn_detection=TurnDetection(
                prefix_padding_ms=100,
                silence_duration_ms=200,
                interrupt_response=False,
            )
        )
    )
    rid = requested_by_vad_turn(s)
    feed(s, 640, 320, 0.95)
    out = feed(s, 960, 320, 0.01)
    assert only(out, CommitInput)[0].response_id is None
    assert only(out, ev.ResponseCreated) == [] and only(out, ev.ResponseDone) == []
    # The first reply is still the one in progress.
    assert types(start_response(s, rid))[0] == "response.output_item.added"


def test_every_response_done_follows_its_response_created() -> None:
    s = make(VAD)
    created: set[str] = set()
    outputs: list[object] = []
    outputs += feed(s, 0, 320, 0.95) + feed(s, 320, 320, 0.01)
    outputs += s.receive(cmd.ResponseCancel(), now=0)
    outputs += s.receive(cmd.ResponseCreate(), now=0)
    outputs += s.receive(cmd.OutputAudioClear(), now=0)
    outputs += s.receive(cmd.ResponseCreate(), now=0)
    outputs += feed(s, 640, 320, 0.95)
    for event in outputs:
        if isinstance(event, ev.ResponseCreated):
            created.add(event.response_id)
        elif isinstance(event, ev.ResponseDone):
            assert event.response_id in created
    assert len(only(outputs, ev.ResponseDone)) == 3


# -- items: delete, placement -------------------------------------------------------------


def test_deleting_the_assistant_item_mid_reply_cancels_it_and_the_session_lives() -> None:
    s = make()
    out = start_response(s)
    item_id = narrow(out[1], ev.OutputItemAdded).item.id
    audio(s, 100)
    out = s.receive(cmd.ConversationItemDelete(item_id=item_id), now=0)
    assert out[0] == CancelResponse(response_id="resp_1")
    assert types(out)[-3:] == ["response.done", "DeleteItem", "conversation.item.deleted"]
    assert audio(s, 100) == [] and not s.closed
    assert s.engine_event(port.EngineResponseDone(response_id="resp_1")) == []
    rid = narrow(s.receive(cmd.ResponseCreate(), now=0)[0], StartResponse).response_id
    start_response(s, rid)
    assert types(audio(s, 20, rid)) == ["response.output_audio.delta"]


def test_deleting_a_replys_items_names_the_reply_and_the_call_to_the_engine() -> None:
    s = tool_session()
    rid = only(s.receive(cmd.ResponseCreate(), now=0), ev.ResponseCreated)[0].response_id
    start_response(s, rid)
    out = s.engine_event(
        port.EngineFunctionCall(response_id=rid, call_id="c1", name="get_weather", arguments="{}")
    )
    call_item = only(out, ev.FunctionCallArgumentsDone)[0].item_id
    message_item = only(audio(s, 20, rid), ev.OutputItemAdded)[0].item.id
    s.engine_event(port.EngineResponseDone(response_id=rid))
    out = s.receive(cmd.ConversationItemDelete(item_id=call_item), now=1)
    assert only(out, DeleteItem) == [DeleteItem(item_id=call_item, response_id=rid, call_id="c1")]
    out = s.receive(cmd.ConversationItemDelete(item_id=message_item), now=1)
    assert only(out, DeleteItem) == [DeleteItem(item_id=message_item, response_id=rid, call_id=None)]
    # The client's own items are named by their ids alone.
    s.receive(
        cmd.ConversationItemCreate(
            item_id="out_1", role="tool", text="", kind="function_call_output", call_id="c1", output="{}"
        ),
        now=2,
    )
    out = s.receive(cmd.ConversationItemDelete(item_id="out_1"), now=2)
    assert only(out, DeleteItem) == [DeleteItem(item_id="out_1")]


def test_item_create_honours_previous_item_id() -> None:
    s = make()
    s.receive(cmd.ConversationItemCreate(item_id="a", role="user", text="one"), now=0)
    s.receive(cmd.ConversationItemCreate(item_id="c", role="user", text="three"), now=0)
    out = s.receive(
        cmd.ConversationItemCreate(item_id="b", role="user", text="two", previous_item_id="a"), now=0
    )
    assert out[0] == session_module.AddItem(item_id="b", role="user", text="two", previous_item_id="a")
    assert narrow(out[1], ev.ConversationItemAdded).previous_item_id == "a"
    out = s.receive(
        cmd.ConversationItemCreate(item_id="z", role="system", text="zero", previous_item_id="root"), now=0
    )
    assert narrow(out[1], ev.ConversationItemAdded).previous_item_id is None
    out = s.receive(
        cmd.ConversationItemCreate(item_id="x", role="user", text="?", previous_item_id="nope"), now=0
    )
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.ITEM_NOT_FOUND
        and narrow(out[0], ev.ErrorEvent).param == "previous_item_id"
    )
    # A new item without placement still goes last, after "c".
    out = s.receive(cmd.ConversationItemCreate(item_id="d", role="user", text="four"), now=0)
    assert narrow(out[1], ev.ConversationItemAdded).previous_item_id == "c"


def test_assistant_item_knows_the_item_before_it() -> None:
    s = make()
    s.receive(cmd.ConversationItemCreate(item_id="u1", role="user", text="hi"), now=0)
    rid = narrow(s.receive(cmd.ResponseCreate(), now=0)[0], StartResponse).response_id
    out = start_response(s, rid)
    assert only(out, ev.ConversationItemAdded)[0].previous_item_id == "u1"
    out = s.engine_event(port.EngineResponseDone(response_id=rid))
    assert only(out, ev.ConversationItemDone)[0].previous_item_id == "u1"


def test_truncate_keeps_the_transcript_the_caller_heard() -> None:
    s = make()
    item_id = narrow(start_response(s)[1], ev.OutputItemAdded).item.id
    s.engine_event(port.EngineTranscript(response_id="resp_1", delta="Hello there."))
    audio(s, 400)
    s.engine_event(port.EngineTranscript(response_id="resp_1", delta=" It is noon."))
    audio(s, 400)
    s.engine_event(port.EngineResponseDone(response_id="resp_1"))
    s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=300), now=0)
    assert (
        narrow(
            s.receive(cmd.ConversationItemRetrieve(item_id=item_id), now=0)[0], ev.ConversationItemRetrieved
        ).item.transcript
        == "Hello there."
    )


def test_truncating_the_playing_reply_ends_it_with_the_heard_transcript() -> None:
    s = make()
    item_id = narrow(start_response(s)[1], ev.OutputItemAdded).item.id
    s.engine_event(port.EngineTranscript(response_id="resp_1", delta="One."))
    audio(s, 400)
    s.engine_event(port.EngineTranscript(response_id="resp_1", delta=" Two."))
    audio(s, 400)
    out = s.receive(cmd.ConversationItemTruncate(item_id=item_id, content_index=0, audio_end_ms=9_000), now=0)
    assert only(out, ev.ResponseDone)[0].output[0].transcript == "One. Two."
    assert only(out, TruncateReply) == [TruncateReply(response_id="resp_1", audio_end_ms=800)]
    assert only(out, AckPlayback) == []


# -- caller transcripts ------------------------------------------------------------------


def test_a_realtime_client_gets_transcripts_only_when_it_asked() -> None:
    s = make()
    assert s.engine_event(port.EngineInputTranscript(item_id="i", text="hello there")) == []
    assert s.engine_event(port.EngineInputTranscript(item_id="i", text="hello there", final=True)) == []
    failed = port.EngineInputTranscriptFailed(item_id="i", code="transcription_failed", message="boom")
    assert s.engine_event(failed) == []
    s.receive(cmd.SessionUpdate(session=SessionPatch(input_transcription=InputTranscription())), now=0)
    out = s.engine_event(port.EngineInputTranscript(item_id="i", text="hello", final=True))
    assert types(out) == ["conversation.item.input_audio_transcription.completed"]


def test_a_duplex_client_gets_transcripts_as_vllm_omni_sends_them() -> None:
    s = make(handshake=Handshake.DUPLEX)
    s.receive(cmd.SessionUpdate(session=SessionPatch()), now=0)
    s.engine_opened()
    out = s.engine_event(port.EngineInputTranscript(item_id="i", text="hello", final=True))
    assert types(out) == ["conversation.item.input_audio_transcription.completed"]


def test_failed_recognition_is_reported_and_the_session_goes_on() -> None:
    s = make(replace(MANUAL, input_transcription=InputTranscription()))
    failed = port.EngineInputTranscriptFailed(item_id="i", code="transcription_failed", message="boom")
    out = s.engine_event(failed)
    assert out == [ev.InputTranscriptionFailed(item_id="i", code="transcription_failed", message="boom")]
    assert not s.closed


# -- turn_detection.idle_timeout_ms ------------------------------------------------------

IDLE = SessionConfig(
    turn_detection=TurnDetection(prefix_padding_ms=100, silence_duration_ms=200, idle_timeout_ms=2000)
)


def played_reply(s: Session, rid: str, *, at: float, audio_ms: int) -> None:
    """The engine makes a reply of ``audio_ms`` in no time at ``at``."""
    start_response(s, rid)
    s.engine_event(port.EngineAudio(response_id=rid, pcm=pcm(audio_ms)), now=at)
    s.engine_event(port.EngineResponseDone(response_id=rid), now=at)


def test_idle_timeout_counts_from_the_end_of_playback_then_commits_and_replies() -> None:
    s = make(IDLE)
    rid = requested_by_vad_turn(s)
    played_reply(s, rid, at=10.0, audio_ms=1500)
    # The reply plays until 11.5 s; the caller's silence may last until 13.5 s.
    assert s.next_timer == pytest.approx(13.5)
    assert s.tick(13.4) == []
    out = s.tick(13.5)
    assert types(out)[:5] == [
        "input_audio_buffer.timeout_triggered",
        "CommitInput",
        "input_audio_buffer.committed",
        "conversation.item.added",
        "conversation.item.done",
    ]
    assert types(out)[-1] == "response.created"
    triggered = out[0]
    assert isinstance(triggered, ev.InputAudioTimeoutTriggered)
    assert only(out, CommitInput)[0].item_id == triggered.item_id
    assert only(out, CommitInput)[0].response_id == narrow(out[-1], ev.ResponseCreated).response_id
    assert s.next_timer is None and s.tick(100.0) == []


def test_idle_timeout_is_disarmed_by_caller_speech_and_off_without_the_setting() -> None:
    s = make(IDLE)
    rid = requested_by_vad_turn(s)
    played_reply(s, rid, at=0.0, audio_ms=100)
    assert s.next_timer is not None
    feed(s, 640, 320, 0.95)  # the caller speaks up before the timeout
    assert s.next_timer is None and s.tick(1_000.0) == []

    plain = make(VAD)
    rid = requested_by_vad_turn(plain)
    played_reply(plain, rid, at=0.0, audio_ms=100)
    assert plain.next_timer is None


def test_idle_timeout_does_not_fire_over_a_reply_in_progress() -> None:
    s = make(IDLE)
    rid = requested_by_vad_turn(s)
    played_reply(s, rid, at=0.0, audio_ms=100)
    s.receive(cmd.ResponseCreate(), now=0.5)
    assert s.next_timer is None and s.tick(10.0) == []


# -- transcription sessions ------------------------------------------------------------------

TRANSCRIBING_CAPS = port.EngineCapabilities(
    name="asr", input_rate=RATE, output_rate=RATE, input_transcription=True
)
TRANSCRIPTION = SessionConfig(
    kind=SessionKind.TRANSCRIPTION,
    turn_detection=TurnDetection(prefix_padding_ms=100, silence_duration_ms=200),
)


def test_a_transcription_session_transcribes_turns_and_never_replies() -> None:
    s = Session(
        session_id="t", capabilities=TRANSCRIBING_CAPS, defaults=TRANSCRIPTION, handshake=Handshake.REALTIME
    )
    assert types(s.start()) == ["session.created"]
    feed(s, 0, 320, 0.95)
    out = feed(s, 320, 320, 0.01)
    commit = only(out, CommitInput)[0]
    assert commit.response_id is None and only(out, ev.ResponseCreated) == []
    # Asked or not, the caller's words are what a transcription session is for.
    out = s.engine_event(port.EngineInputTranscript(item_id=commit.item_id, text="hello", final=True))
    assert types(out) == ["conversation.item.input_audio_transcription.completed"]
    feed(s, 640, 320, 0.95)  # the caller speaks again
    for command in (
        cmd.ResponseCreate(event_id="r"),
        cmd.InputAudioCommit(create_response=True, event_id="r"),
    ):
        error = s.receive(command, now=0)[0]
        assert (
            isinstance(error, ev.ErrorEvent)
            and error.code is ErrorCode.INVALID_EVENT
            and error.event_id == "r"
        )
    # A plain commit is fine and asks for nothing.
    assert only(s.receive(cmd.InputAudioCommit(), now=0), CommitInput)[0].response_id is None


def test_session_type_cannot_change() -> None:
    s = make()
    out = s.receive(cmd.SessionUpdate(session=SessionPatch(kind=SessionKind.TRANSCRIPTION)), now=0)
    assert (
        narrow(out[0], ev.ErrorEvent).code is ErrorCode.INVALID_VALUE
        and narrow(out[0], ev.ErrorEvent).param == "session.type"
    )
    assert s.config.kind is SessionKind.REALTIME
    assert types(s.receive(cmd.SessionUpdate(session=SessionPatch(kind=SessionKind.REALTIME)), now=0)) == [
        "UpdateEngine",
    ]


def test_an_engine_that_cannot_transcribe_refuses_a_transcription_session() -> None:
    s = make(TRANSCRIPTION)  # CAPS: no input transcription
    out = s.start()
    assert types(out) == ["session.created", "error"]
    assert narrow(out[1], ev.ErrorEvent).param == "session.type"
    duplex = make(handshake=Handshake.DUPLEX)
    out = duplex.receive(cmd.SessionUpdate(session=SessionPatch(kind=SessionKind.TRANSCRIPTION)), now=0)
    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.INVALID_VALUE


# -- the engine's own turn-taking (vLLM-Omni auto_response, engine VAD) --------------------------

NATIVE = replace(CAPS, native_turns=True)
ENGINE_VAD = replace(CAPS, native_turns=True, detects_turns=True)


def native(config: SessionConfig = MANUAL, caps: port.EngineCapabilities = NATIVE) -> Session:
    return Session(session_id="sess_1", capabilities=caps, defaults=config, handshake=Handshake.REALTIME)


def test_auto_response_on_a_native_engine_leaves_the_reply_to_the_engine() -> None:
    s = native(replace(MANUAL, auto_response=True))
    assert s.engine_turns
    s.input_processed(pcm(400), 400)
    out = s.receive(cmd.InputAudioCommit(), now=0)
    (commit,) = only(out, CommitInput)
    assert (commit.response_id, commit.engine_decides, commit.final) == (None, True, True)
    assert "response.created" not in types(out)  # the model may choose to listen
    assert types(s.engine_event(port.EngineTurnCommitted(item_id=commit.item_id))) == []  # ours: announced
    # The model chose to speak: its reply is announced under its own id.
    out = start_response(s, "resp_engine")
    assert types(out)[:2] == ["response.created", "response.output_item.added"]
    item_id = only(out, ev.OutputItemAdded)[0].item.id
    assert s.engine_event(port.EngineSpeak(response_id="resp_engine")) == [
        ev.ResponseSpeak(response_id="resp_engine", item_id=item_id)
    ]
    # A non-final segment goes to the engine as one.
    s.input_processed(pcm(100), 100)
    (segment,) = only(s.receive(cmd.InputAudioCommit(final=False), now=0), CommitInput)
    assert segment.final is False and segment.engine_decides
    # The caller's words land on the caller's item, never on the assistant's.
    out = s.engine_event(port.EngineInputTranscript(item_id="", text="hello", final=True))
    assert [o.item_id for o in only(out, ev.InputTranscriptionCompleted)] in ([], [segment.item_id])


def test_auto_response_on_other_engines_is_the_gateways_rendering() -> None:
    s = make(replace(MANUAL, auto_response=True))
    assert not s.engine_turns
    s.input_processed(pcm(400), 400)
    out = s.receive(cmd.InputAudioCommit(), now=0)
    (commit,) = only(out, CommitInput)
    assert commit.response_id is not None and not commit.engine_decides
    assert "response.created" in types(out)
    # An explicit response_create on a native engine is the gateway's reply, named by it.
    s = native(replace(MANUAL, auto_response=True))
    s.input_processed(pcm(400), 400)
    (commit,) = only(s.receive(cmd.InputAudioCommit(create_response=True), now=0), CommitInput)
    assert commit.response_id is not None and not commit.engine_decides


def test_listen_and_overlap_decisions_reach_the_client() -> None:
    s = native(replace(MANUAL, auto_response=True))
    assert s.engine_event(port.EngineListen(reason="silence_or_noise")) == [
        ev.ResponseListen(response_id=None, reason="silence_or_noise")
    ]
    decision = port.EngineOverlapDecision(policy="listen_only", action="listen", reason="short_ack")
    assert s.engine_event(decision) == []  # a Realtime client gets it only when it asks
    asked = native(replace(MANUAL, auto_response=True, include=(OVERLAP_EVENT,)))
    assert asked.engine_event(decision) == [
        ev.OverlapDecision(policy="listen_only", action="listen", reason="short_ack")
    ]


def test_a_turn_the_engine_ended_becomes_the_callers_item() -> None:
    s = native(VAD, ENGINE_VAD)
    started = s.engine_event(port.EngineSpeechStarted(audio_start_ms=100, item_id="item_engine"))
    (speech,) = only(started, ev.SpeechStarted)
    item_id = speech.item_id
    s.input_processed(pcm(500), 500)
    stopped = s.engine_event(port.EngineSpeechStopped(audio_end_ms=600, item_id="item_engine"))
    assert stopped == [ev.SpeechStopped(audio_end_ms=600, item_id=item_id)]
    out = s.engine_event(port.EngineTurnCommitted(item_id="item_engine"))
    assert types(out) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert {o.item_id if isinstance(o, ev.InputAudioCommitted) else o.item.id for o in out} == {item_id}  # type: ignore[union-attr]
    assert s.engine_event(port.EngineTurnCommitted(item_id="item_engine")) == []  # once
    # Its transcript, named by the engine, lands on the caller's item.
    s = native(replace(VAD, input_transcription=InputTranscription()), ENGINE_VAD)
    s.engine_event(port.EngineSpeechStarted(audio_start_ms=0, item_id="e1"))
    (speech,) = s.engine_event(port.EngineSpeechStopped(audio_end_ms=900, item_id="e1"))
    s.engine_event(port.EngineTurnCommitted(item_id="e1"))
    start_response(s, "resp_e")  # the reply starts before the transcript arrives
    out = s.engine_event(port.EngineInputTranscript(item_id="e1", text="hi there", final=True))
    assert [o.item_id for o in only(out, ev.InputTranscriptionCompleted)] == [
        narrow(speech, ev.SpeechStopped).item_id
    ]


def test_a_turn_the_engine_committed_unannounced_gets_an_item() -> None:
    s = native(replace(MANUAL, auto_response=True))
    s.input_processed(pcm(300), 300)
    out = s.engine_event(port.EngineTurnCommitted(item_id="item_x"))
    assert types(out) == ["input_audio_buffer.committed", "conversation.item.added", "conversation.item.done"]
    assert (
        narrow(s.receive(cmd.InputAudioCommit(), now=0)[0], ev.ErrorEvent).code
        is ErrorCode.INPUT_AUDIO_BUFFER_EMPTY
    )


def test_transcript_without_an_item_id_goes_to_the_callers_last_turn() -> None:
    s = make(replace(MANUAL, input_transcription=InputTranscription()))
    s.input_processed(pcm(300), 300)
    (commit,) = only(s.receive(cmd.InputAudioCommit(create_response=True), now=0), CommitInput)
    start_response(s, commit.response_id or "")
    out = s.engine_event(port.EngineInputTranscript(item_id="", text="hello", final=True))
    assert [o.item_id for o in only(out, ev.InputTranscriptionCompleted)] == [commit.item_id]


def test_text_into_a_live_turn_and_turn_signals_need_native_turn_taking() -> None:
    s = make()
    for command in (cmd.InputTextAppend(text="hi", event_id="t1"), cmd.TurnSignal(event="user_started")):
        (error,) = s.receive(command, now=0)
        assert isinstance(error, ev.ErrorEvent) and error.code is ErrorCode.UNSUPPORTED_BY_ENGINE
    s = native()
    assert types(s.receive(cmd.InputTextAppend(text="book a table"), now=0)) == ["AppendText"]
    # Text alone is a turn to commit.
    assert types(s.receive(cmd.InputAudioCommit(create_response=True), now=0))[:2] == [
        "CommitInput",
        "input_audio_buffer.committed",
    ]
    out = s.receive(cmd.TurnSignal(event="user_started", payload={"at_ms": 3}), now=0)
    assert types(out) == ["SignalTurn"] and narrow(out[0], session_module.SignalTurn).payload == {"at_ms": 3}


def test_input_cancel_abandons_the_turn() -> None:
    s = make()
    s.input_processed(pcm(300), 300)
    assert types(s.receive(cmd.InputCancel(), now=0)) == ["CancelInput", "input_audio_buffer.cleared"]
    assert (
        narrow(s.receive(cmd.InputAudioCommit(), now=0)[0], ev.ErrorEvent).code
        is ErrorCode.INPUT_AUDIO_BUFFER_EMPTY
    )


def test_chunk_hints_and_formats() -> None:
    s = make()
    same = s.receive(cmd.InputAudioAppend(audio=bytes(480), encoding=Encoding.PCM16, rate=RATE), now=0)
    assert same == [ProcessInput(audio=bytes(480))]
    hinted = s.receive(
        cmd.InputAudioAppend(
            audio=bytes(160), encoding=Encoding.G711_ULAW, is_speech=False, hints={"rms": 0.0}
        ),
        now=0,
    )
    assert hinted == [
        ProcessInput(
            audio=bytes(160),
            format=AudioFormat(encoding=Encoding.G711_ULAW, rate=8_000),
            is_speech=False,
            hints={"rms": 0.0},
        )
    ]
    rate_only = s.receive(cmd.InputAudioAppend(audio=bytes(320), rate=16_000), now=0)
    assert narrow(rate_only[0], ProcessInput).format == AudioFormat(encoding=Encoding.PCM16, rate=16_000)
    (error,) = s.receive(cmd.InputAudioAppend(audio=bytes(3), rate=16_000), now=0)
    assert isinstance(error, ev.ErrorEvent) and error.code is ErrorCode.INVALID_AUDIO_LENGTH
    # The hints ride with the audio to the engine.
    assert s.input_processed(pcm(20), 20, is_speech=False, hints={"rms": 0.0}) == [
        AppendAudio(pcm=pcm(20), is_speech=False, hints={"rms": 0.0})
    ]


# -- the per-reply latency breakdown (session.include: turn.latency) -------------------------

LATENCY_VAD = replace(VAD, include=("turn.latency",))


def test_latency_breakdown_from_speech_end_to_first_audio_with_the_engines_stages() -> None:
    s = make(LATENCY_VAD)
    feed(s, 0, 320, 0.95)
    windows = [(end, 0.01) for end in range(320 + 32, 640 + 1, 32)]
    out = s.input_processed(pcm(320), 320.0, windows, now=100.0)
    created = only(out, ev.ResponseCreated)[0]
    committed = only(out, ev.InputAudioCommitted)[0]
    stopped = only(out, ev.SpeechStopped)[0]
    start_response(s, created.response_id)
    s.engine_event(
        port.EngineTimings(
            response_id=created.response_id,
            stages=(
                ("recognition", 100.0),
                ("reply", 5.0),
                ("speech", 200.0),
            ),
        )
    )
    out = s.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=100.4)
    latency = only(out, ev.TurnLatency)
    assert len(latency) == 1
    report = latency[0]
    assert report.response_id == created.response_id and report.item_id == committed.item_id
    # The speech ended silence_duration_ms before audio_end_ms; the detector waited from then until now.
    detection = 640 - (stopped.audio_end_ms - 200)
    assert detection >= 200
    assert report.stages == (
        ("turn_detection", pytest.approx(detection)),
        ("recognition", 100.0),
        ("reply", 5.0),
        ("speech", 200.0),
        ("other", pytest.approx(95.0)),
    )
    assert report.total_ms == pytest.approx(detection + 400.0)
    # Once per reply: later audio reports nothing more.
    later = s.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=100.5)
    assert only(later, ev.TurnLatency) == []


def test_latency_of_a_client_requested_reply_is_the_engines_and_off_unless_asked() -> None:
    s = make(replace(MANUAL, include=("turn.latency",)))
    created = only(s.receive(cmd.ResponseCreate(), now=5.0), ev.ResponseCreated)[0]
    start_response(s, created.response_id)
    out = s.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=5.25)
    (report,) = only(out, ev.TurnLatency)
    assert report.item_id is None
    assert report.stages == (("engine", pytest.approx(250.0)),) and report.total_ms == pytest.approx(250.0)

    plain = make(MANUAL)
    created = only(plain.receive(cmd.ResponseCreate(), now=5.0), ev.ResponseCreated)[0]
    start_response(plain, created.response_id)
    out = plain.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=5.25)
    assert only(out, ev.TurnLatency) == []


def test_the_host_gets_every_replys_latency_asked_or_not() -> None:
    """The same numbers feed the metrics (ReportLatency) and the turn.latency event."""
    for config in (VAD, LATENCY_VAD):
        s = make(config)
        feed(s, 0, 320, 0.95)
        windows = [(end, 0.01) for end in range(320 + 32, 640 + 1, 32)]
        created = only(s.input_processed(pcm(320), 320.0, windows, now=100.0), ev.ResponseCreated)[0]
        start_response(s, created.response_id)
        out = s.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=100.25)
        (report,) = only(out, ReportLatency)
        assert report.first_audio_ms == pytest.approx(250.0)
        assert report.speech_end_ms == report.latency.total_ms and report.speech_end_ms > 250.0
        assert only(out, ev.TurnLatency) == ([report.latency] if config is LATENCY_VAD else [])
    # A reply the client asked for has no end of speech to count from.
    s = make(MANUAL)
    created = only(s.receive(cmd.ResponseCreate(), now=5.0), ev.ResponseCreated)[0]
    start_response(s, created.response_id)
    (report,) = only(
        s.engine_event(port.EngineAudio(response_id=created.response_id, pcm=pcm(20)), now=5.5), ReportLatency
    )
    assert report.first_audio_ms == pytest.approx(500.0) and report.speech_end_ms is None


# -- function calling ---------------------------------------------------------------------

TOOL_CAPS = replace(
    CAPS, tools=True, out_of_band=True, response_options=frozenset({"voice", "input", "tools"})
)
WEATHER = FunctionTool(name="get_weather", description="The weather in a city", parameters={"type": "object"})
WITH_TOOLS = replace(MANUAL, tools=(WEATHER,))


def tool_session(config: SessionConfig = WITH_TOOLS, caps: port.EngineCapabilities = TOOL_CAPS) -> Session:
    return Session(session_id="sess_1", capabilities=caps, defaults=config, handshake=Handshake.REALTIME)


def test_a_reply_that_calls_a_function_then_answers_with_its_output() -> None:
    s = tool_session()
    out = s.receive(cmd.ResponseCreate(), now=0)
    rid = only(out, ev.ResponseCreated)[0].response_id
    assert only(out, StartResponse)[0].options == port.ResponseOptions(tools=(WEATHER,))
    # A reply that may call a function opens no message until it says something.
    assert start_response(s, rid) == []
    out = s.engine_event(
        port.EngineFunctionCallDelta(response_id=rid, call_id="c1", name="get_weather", delta='{"ci')
    )
    assert types(out) == [
        "response.output_item.added",
        "conversation.item.added",
        "response.function_call_arguments.delta",
    ]
    item_id = only(out, ev.OutputItemAdded)[0].item.id
    s.engine_event(
        port.EngineFunctionCallDelta(response_id=rid, call_id="c1", name="get_weather", delta='ty": "Oslo"}')
    )
    out = s.engine_event(
        port.EngineFunctionCall(
            response_id=rid, call_id="c1", name="get_weather", arguments='{"city": "Oslo"}'
        )
    )
    assert types(out) == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "conversation.item.done",
    ]
    done_args = only(out, ev.FunctionCallArgumentsDone)[0]
    assert (done_args.item_id, done_args.arguments, done_args.name) == (
        item_id,
        '{"city": "Oslo"}',
        "get_weather",
    )
    out = s.engine_event(port.EngineResponseDone(response_id=rid))
    (done,) = only(out, ev.ResponseDone)
    assert [(i.kind, i.status, i.call_id) for i in done.output] == [("function_call", "completed", "c1")]
    # The client runs the function and returns its output; the next reply can use it.
    out = s.receive(
        cmd.ConversationItemCreate(
            item_id=None,
            role="tool",
            text="",
            kind="function_call_output",
            call_id="c1",
            output='{"temp": 3}',
        ),
        now=1,
    )
    assert types(out) == ["AddFunctionOutput", "conversation.item.added", "conversation.item.done"]
    added = only(out, ev.ConversationItemAdded)[0]
    assert added.previous_item_id == item_id and added.item.output == '{"temp": 3}'
    out = s.receive(cmd.ResponseCreate(), now=2)
    rid2 = only(out, ev.ResponseCreated)[0].response_id
    start_response(s, rid2)
    out = audio(s, 20, rid2)
    assert types(out)[:2] == ["response.output_item.added", "conversation.item.added"]
    assert only(out, ev.AudioDelta)[0].output_index == 0


def test_a_call_cut_short_is_closed_incomplete_and_a_message_after_a_call_is_output_one() -> None:
    s = tool_session()
    rid = only(s.receive(cmd.ResponseCreate(), now=0), ev.ResponseCreated)[0].response_id
    s.engine_event(port.EngineFunctionCall(response_id=rid, call_id="c1", name="get_weather", arguments="{}"))
    out = audio(s, 20, rid)
    assert only(out, ev.OutputItemAdded)[0].output_index == 1
    assert only(out, ev.AudioDelta)[0].output_index == 1
    s.engine_event(
        port.EngineFunctionCallDelta(response_id=rid, call_id="c2", name="get_weather", delta='{"c')
    )
    out = s.receive(cmd.ResponseCancel(), now=1)
    cut = only(out, ev.FunctionCallArgumentsDone)
    assert [(c.call_id, c.arguments) for c in cut] == [("c2", '{"c')]
    (done,) = only(out, ev.ResponseDone)
    assert [(i.kind, i.status) for i in done.output] == [
        ("function_call", "completed"),
        ("message", "incomplete"),
        ("function_call", "incomplete"),
    ]
    # Nothing of the cancelled reply gets through afterwards.
    assert (
        s.engine_event(port.EngineFunctionCall(response_id=rid, call_id="c3", name="x", arguments="{}")) == []
    )


def test_tool_choice_required_is_refused_by_an_engine_without_tools() -> None:
    s = make(MANUAL)
    out = s.receive(
        cmd.SessionUpdate(
            session=SessionPatch(tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED))
        ),
        now=0,
    )
    (error,) = only(out, ev.ErrorEvent)
    assert error.code is ErrorCode.UNSUPPORTED_BY_ENGINE and error.param == "session.tool_choice"
    out = s.receive(
        cmd.ResponseCreate(
            tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="get_weather")
        ),
        now=0,
    )
    assert only(out, ev.ErrorEvent)[0].param == "response.tool_choice"
    # A named function that is not offered is the client's mistake, on any engine.
    out = tool_session().receive(
        cmd.ResponseCreate(tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="nope")), now=0
    )
    assert only(out, ev.ErrorEvent)[0].code is ErrorCode.INVALID_VALUE
    # Tools offered with "auto" are accepted: capabilities tell the client the engine calls none.
    assert only(s.receive(cmd.ResponseCreate(tools=(WEATHER,)), now=0), ev.ResponseCreated)


@pytest.mark.parametrize(
    ("command", "param"),
    [
        (cmd.ResponseCreate(voice="other"), "response.audio.output.voice"),
        (cmd.ResponseCreate(max_output_tokens=10), "response.max_output_tokens"),
        (cmd.ResponseCreate(out_of_band=True), "response.conversation"),
        (cmd.ResponseCreate(input=()), "response.input"),
    ],
)
def test_reply_options_the_engine_cannot_honour_are_refused_by_name(
    command: cmd.ResponseCreate, param: str
) -> None:
    (error,) = only(make(MANUAL).receive(command, now=0), ev.ErrorEvent)
    assert error.code is ErrorCode.UNSUPPORTED_BY_ENGINE and error.param == param


def test_an_out_of_band_reply_runs_beside_the_conversations_and_stays_out_of_it() -> None:
    s = tool_session()
    main = only(s.receive(cmd.ResponseCreate(), now=0), ev.ResponseCreated)[0].response_id
    start_response(s, main)
    audio(s, 20, main)
    out = s.receive(
        cmd.ResponseCreate(
            out_of_band=True,
            metadata={"job": "classify"},
            input=(cmd.ItemSpec(kind="item_reference", item_id="nope"),),
        ),
        now=1,
    )
    assert only(out, ev.ErrorEvent)[0].code is ErrorCode.ITEM_NOT_FOUND
    out = s.receive(cmd.ResponseCreate(out_of_band=True, metadata={"job": "classify"}), now=1)
    created = only(out, ev.ResponseCreated)[0]
    assert created.out_of_band and created.metadata == {"job": "classify"}
    assert narrow(only(out, StartResponse)[0].options, port.ResponseOptions).out_of_band
    side = created.response_id
    start_response(s, side)
    out = s.engine_event(port.EngineText(response_id=side, delta="positive"))
    assert "conversation.item.added" not in types(out) and "response.output_item.added" in types(out)
    # The caller barges in: the conversation's reply stops, the side reply goes on.
    out = s.receive(cmd.BargeIn(), now=2)
    assert [d.response_id for d in only(out, ev.ResponseDone)] == [main]
    out = s.engine_event(port.EngineResponseDone(response_id=side))
    (done,) = only(out, ev.ResponseDone)
    assert (
        done.out_of_band
        and done.metadata == {"job": "classify"}
        and "conversation.item.done" not in types(out)
    )
    assert all(record.response_id != side for record in s._items.values())


def test_closing_the_session_closes_out_every_reply() -> None:
    s = tool_session()
    only(s.receive(cmd.ResponseCreate(), now=0), ev.ResponseCreated)
    only(s.receive(cmd.ResponseCreate(out_of_band=True), now=0), ev.ResponseCreated)
    out = s.receive(cmd.SessionClose(), now=1)
    assert len(only(out, ev.ResponseDone)) == 2 and types(out)[-1] == "CloseSession"


def test_an_engine_that_calls_only_the_sessions_tools_refuses_a_replys_own() -> None:
    s = tool_session(caps=replace(TOOL_CAPS, response_options=frozenset()))
    (error,) = only(s.receive(cmd.ResponseCreate(tools=()), now=0), ev.ErrorEvent)
    assert error.code is ErrorCode.UNSUPPORTED_BY_ENGINE and error.param == "response.tools"
    out = s.receive(cmd.ResponseCreate(tool_choice=ToolChoice(mode=ToolChoiceMode.NONE)), now=0)
    assert only(out, ev.ErrorEvent)[0].param == "response.tool_choice"
    # Naming the session's own tools again is no change.
    assert only(s.receive(cmd.ResponseCreate(tools=(WEATHER,)), now=0), ev.ResponseCreated)
