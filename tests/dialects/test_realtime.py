"""The OpenAI Realtime dialect: client JSON -> commands, server events -> wire JSON."""

from __future__ import annotations

import ast
import base64
import dataclasses
import inspect
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import duplex_gateway.vocabulary.events as events_module
from duplex_gateway.dialects import realtime, realtime_session
from duplex_gateway.dialects.realtime import (
    CLIENT_EVENT_TYPES,
    RealtimeDialect,
    parse_client_event,
    render_server_event,
)
from duplex_gateway.dialects.realtime_session import parse_session_patch, session_payload
from duplex_gateway.vocabulary.commands import (
    BargeIn,
    Command,
    ConversationItemCreate,
    ConversationItemDelete,
    ConversationItemRetrieve,
    ConversationItemTruncate,
    InputAudioAppend,
    InputAudioClear,
    InputAudioCommit,
    InputCancel,
    InputTextAppend,
    ItemSpec,
    OutputAudioClear,
    PlaybackAck,
    ResponseCancel,
    ResponseCreate,
    SessionClose,
    SessionEventAck,
    SessionHeartbeat,
    SessionResume,
    SessionUpdate,
    TurnSignal,
)
from duplex_gateway.vocabulary.errors import ErrorCode, ProtocolError
from duplex_gateway.vocabulary.events import (
    AudioDelta,
    AudioDone,
    ContentPartAdded,
    ContentPartDone,
    ConversationItem,
    ConversationItemAdded,
    ConversationItemDeleted,
    ConversationItemDone,
    ConversationItemRetrieved,
    ConversationItemTruncated,
    DtmfReceived,
    ErrorEvent,
    FunctionCallArgumentsDelta,
    FunctionCallArgumentsDone,
    HeartbeatAck,
    InputAudioCleared,
    InputAudioCommitted,
    InputAudioTimeoutTriggered,
    InputIgnored,
    InputTranscriptionCompleted,
    InputTranscriptionDelta,
    InputTranscriptionFailed,
    OutputAudioCleared,
    OutputItemAdded,
    OutputItemDone,
    OverlapDecision,
    PlaybackAcknowledged,
    RateLimitsUpdated,
    ResponseCreated,
    ResponseDone,
    ResponseListen,
    ResponseSpeak,
    ServerEvent,
    SessionClosed,
    SessionClosing,
    SessionCreated,
    SessionReplaced,
    SessionResumed,
    SessionResyncRequired,
    SessionUpdated,
    SpeechStarted,
    SpeechStopped,
    TextDelta,
    TextDone,
    TranscriptDelta,
    TranscriptDone,
    TurnLatency,
)
from duplex_gateway.vocabulary.formats import AudioFormat, Encoding
from duplex_gateway.vocabulary.session_config import (
    UNSET,
    FunctionTool,
    InputTranscription,
    Modality,
    SessionConfig,
    SessionKind,
    SessionPatch,
    ToolChoice,
    ToolChoiceMode,
    TurnDetection,
    TurnDetectionMode,
)
from tests.sdk_models import EXTENSION_EVENTS, validate_server_event
from tests.typed import json_at

MAX = 1 << 20
PCM16 = Encoding.PCM16


def parse(obj: object, *, max_bytes: int = MAX) -> Command:
    return parse_client_event(json.dumps(obj), max_bytes=max_bytes)


def error_of(payload: object, *, max_bytes: int = MAX) -> ProtocolError:
    text = payload if isinstance(payload, str | bytes) else json.dumps(payload)
    with pytest.raises(ProtocolError) as info:
        parse_client_event(text, max_bytes=max_bytes)
    return info.value


def patch_of(session: dict[str, object]) -> SessionPatch:
    command = parse({"type": "session.update", "session": session})
    assert isinstance(command, SessionUpdate)
    return command.session


def fmt(encoding: Encoding, rate: int) -> AudioFormat:
    return AudioFormat(encoding=encoding, rate=rate)


# ---------------------------------------------------------------------------
# session.update


def test_session_update_ga_shape() -> None:
    patch = patch_of(
        {
            "type": "realtime",
            "model": "gpt-realtime",
            "instructions": "be brief",
            "output_modalities": ["audio"],
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": 0.6,
                        "prefix_padding_ms": 200,
                        "silence_duration_ms": 400,
                        "create_response": False,
                        "interrupt_response": False,
                        "idle_timeout_ms": 5000,
                    },
                    "transcription": {"model": "whisper-1"},
                    "noise_reduction": {"type": "near_field"},
                },
                "output": {"format": {"type": "audio/pcmu"}, "voice": "marin", "speed": 1.25},
            },
            "tools": [{"type": "function", "name": "f"}],
            "tracing": "auto",
            "tool_choice": "auto",
        }
    )
    assert patch == SessionPatch(
        kind=SessionKind.REALTIME,
        model="gpt-realtime",
        instructions="be brief",
        output_modalities=(Modality.AUDIO,),
        input_format=fmt(PCM16, 24000),
        output_format=fmt(Encoding.G711_ULAW, 8000),
        voice="marin",
        speed=1.25,
        turn_detection=TurnDetection(
            threshold=0.6,
            prefix_padding_ms=200,
            silence_duration_ms=400,
            create_response=False,
            interrupt_response=False,
            idle_timeout_ms=5000,
        ),
        input_transcription=InputTranscription(),
        noise_reduction={"type": "near_field"},
        tools=(FunctionTool(name="f"),),
        tool_choice=ToolChoice(),
    )


def test_session_update_beta_flat_shape() -> None:
    patch = patch_of(
        {
            "modalities": ["text", "audio"],
            "instructions": "hi",
            "voice": "alloy",
            "input_audio_format": "g711_ulaw",
            "output_audio_format": "g711_alaw",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 700},
            "input_audio_transcription": {"model": "whisper-1"},
            "temperature": 0.8,
            "max_response_output_tokens": "inf",
        }
    )
    assert patch == SessionPatch(
        instructions="hi",
        voice="alloy",
        output_modalities=(Modality.TEXT, Modality.AUDIO),
        input_format=fmt(Encoding.G711_ULAW, 8000),
        output_format=fmt(Encoding.G711_ALAW, 8000),
        turn_detection=TurnDetection(silence_duration_ms=700),
        input_transcription=InputTranscription(),
        temperature=0.8,
        max_output_tokens=None,  # "inf"
    )


def test_session_update_duplex_client_shape() -> None:
    command = parse_client_event(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "model": "m",
                    "modalities": ["audio", "text"],
                    "input_audio_format": "pcm16",
                    "output_audio_format": "pcm16",
                    "sample_rate_hz": 16000,
                    "audio": {"input": {"sample_rate_hz": 16000}, "output": {"sample_rate_hz": 24000}},
                    "turn_detection": None,
                    "extra_body": {"auto_response": True, "force_listen_count": 0},
                },
            }
        ),
        max_bytes=MAX,
    )
    assert command == SessionUpdate(
        session=SessionPatch(
            model="m",
            output_modalities=(Modality.AUDIO, Modality.TEXT),
            input_format=fmt(PCM16, 16000),
            output_format=fmt(PCM16, 24000),
            turn_detection=None,
            auto_response=True,
            # The model's own knobs are kept for the engine, auto_response among them.
            extra_body={"auto_response": True, "force_listen_count": 0},
        )
    )


@pytest.mark.parametrize(
    ("extra_body", "auto_response"),
    [
        ({"auto_response": True}, True),
        ({"auto_response": False}, False),
        # vLLM-Omni's test is ``extra_body.get("auto_response") is True``, and an update
        # replaces the whole extra_body: anything but true turns it off.
        ({"auto_response": "yes"}, False),
        ({"auto_response": 1}, False),
        ({"force_listen_count": 2}, False),
        ({}, False),
    ],
)
def test_extra_body_auto_response_is_read_as_vllm_omni_reads_it(
    extra_body: dict[str, object], auto_response: bool
) -> None:
    assert patch_of({"extra_body": extra_body}).auto_response is auto_response


def test_no_extra_body_leaves_auto_response_as_it_was() -> None:
    assert patch_of({"instructions": "hi"}).auto_response is UNSET
    assert patch_of({"extra_body": None}).auto_response is UNSET


def test_vllm_omni_session_fields_are_read_and_echoed() -> None:
    session = {
        "ref_audio": "data:audio/wav;base64,AAAA",
        "temperature": 0.6,
        "max_tokens": 256,
        "overlap_policy": "barge_in",
        "overlap_short_ack_ms": 500,
        "overlap_barge_in_ms": 900,
        "overlap_silence_rms": 0.01,
        "playback_commit_policy": "ack_only",
        "idle_timeout_s": 42.0,
        "input_audio_noise_reduction": {"type": "far_field"},
        "initial_user_text": "hello",
        "use_tts_template": False,
        "extra_body": {"force_listen_count": 3},
    }
    patch = patch_of(session)
    config = SessionConfig().apply(patch)
    assert (config.ref_audio, config.temperature, config.max_output_tokens) == (
        session["ref_audio"],
        0.6,
        256,
    )
    assert (config.overlap_policy, config.overlap_short_ack_ms, config.overlap_barge_in_ms) == (
        "barge_in",
        500,
        900,
    )
    assert (config.overlap_silence_rms, config.playback_commit_policy, config.idle_timeout_s) == (
        0.01,
        "ack_only",
        42,
    )
    assert config.noise_reduction == {"type": "far_field"}
    assert (config.initial_user_text, config.use_tts_template) == ("hello", False)
    assert config.extra_body == {"force_listen_count": 3} and config.auto_response is False
    beta = session_payload(config, session_id="s", beta=True)
    ga = session_payload(config, session_id="s", beta=False)
    for key in (
        "ref_audio",
        "temperature",
        "overlap_policy",
        "playback_commit_policy",
        "idle_timeout_s",
        "initial_user_text",
        "use_tts_template",
        "extra_body",
    ):
        assert beta[key] == ga[key] == session[key], key
    assert beta["max_response_output_tokens"] == ga["max_output_tokens"] == 256
    assert (
        beta["input_audio_noise_reduction"]
        == json_at(ga, "audio", "input", "noise_reduction")
        == {"type": "far_field"}
    )
    # null puts a field back to the engine's default; "inf" is no limit.
    assert (
        SessionConfig().apply(patch_of({"temperature": None, "max_output_tokens": "inf"})).temperature is None
    )
    for bad in (
        {"temperature": -1},
        {"max_tokens": 0},
        {"use_tts_template": "yes"},
        {"extra_body": [1]},
        {"idle_timeout_s": 0},
        {"ref_audio": 3},
    ):
        with pytest.raises(ProtocolError):
            patch_of(bad)


def test_session_update_empty_and_unknown_keys_change_nothing() -> None:
    assert patch_of({}) == SessionPatch()
    assert patch_of({"tracing": None, "whatever": [1]}) == SessionPatch()
    assert patch_of({"tools": []}) == SessionPatch(tools=())
    patch = patch_of({"instructions": None})
    assert patch.instructions == ""
    assert patch.turn_detection is UNSET


@pytest.mark.parametrize(
    ("spelling", "encoding", "rate"),
    [
        ("audio/pcm", PCM16, 24000),
        ("pcm16", PCM16, 24000),
        ("pcm_s16le", PCM16, 24000),
        ("s16le", PCM16, 24000),
        ("PCM16", PCM16, 24000),
        ("pcm_f32le", Encoding.PCM_F32LE, 24000),
        ("audio/pcm_f32le", Encoding.PCM_F32LE, 24000),
        ("f32le", Encoding.PCM_F32LE, 24000),
        ("audio/pcmu", Encoding.G711_ULAW, 8000),
        ("g711_ulaw", Encoding.G711_ULAW, 8000),
        ("mulaw", Encoding.G711_ULAW, 8000),
        ("ulaw", Encoding.G711_ULAW, 8000),
        ("audio/pcma", Encoding.G711_ALAW, 8000),
        ("g711_alaw", Encoding.G711_ALAW, 8000),
        ("alaw", Encoding.G711_ALAW, 8000),
    ],
)
def test_format_spellings(spelling: str, encoding: Encoding, rate: int) -> None:
    expected = fmt(encoding, rate)
    assert patch_of({"input_audio_format": spelling}).input_format == expected
    assert patch_of({"output_audio_format": spelling}).output_format == expected
    ga = patch_of(
        {"audio": {"input": {"format": {"type": spelling}}, "output": {"format": {"type": spelling}}}}
    )
    assert ga.input_format == expected
    assert ga.output_format == expected


def test_format_rates() -> None:
    patch = patch_of(
        {
            "audio": {
                "input": {"format": {"type": "audio/pcm", "rate": 16000}},
                "output": {"format": {"type": "audio/pcm_f32le", "rate": 48000}},
            }
        }
    )
    assert patch.input_format == fmt(PCM16, 16000)
    assert patch.output_format == fmt(Encoding.PCM_F32LE, 48000)
    assert patch_of(
        {"audio": {"input": {"format": {"type": "audio/pcmu", "rate": 16000}}}}
    ).input_format == fmt(Encoding.G711_ULAW, 16000)
    # A rate alone means PCM16 at that rate; an integral float is a whole number.
    assert patch_of({"sample_rate_hz": 16000.0}).input_format == fmt(PCM16, 16000)
    assert patch_of({"audio": {"output": {"sample_rate_hz": 22050}}}).output_format == fmt(PCM16, 22050)
    # The GA format object's own rate wins over the flat vLLM-Omni keys.
    both = patch_of(
        {"sample_rate_hz": 16000, "audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}
    )
    assert both.input_format == fmt(PCM16, 8000)
    # The GA nest wins over the flat beta key.
    nest = patch_of(
        {"input_audio_format": "g711_alaw", "audio": {"input": {"format": {"type": "audio/pcmu"}}}}
    )
    assert nest.input_format == fmt(Encoding.G711_ULAW, 8000)


@pytest.mark.parametrize(
    ("turn_detection", "expected"),
    [
        (None, None),
        ({}, TurnDetection()),
        ({"type": "server_vad"}, TurnDetection()),
        ({"type": "server_vad", "idle_timeout_ms": None}, TurnDetection()),
        (
            {"type": "semantic_vad", "eagerness": "high", "create_response": False},
            TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD, create_response=False, eagerness="high"),
        ),
        ({"type": "semantic_vad"}, TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD)),
    ],
)
def test_turn_detection(turn_detection: object, expected: TurnDetection | None) -> None:
    assert patch_of({"turn_detection": turn_detection}).turn_detection == expected
    assert patch_of({"audio": {"input": {"turn_detection": turn_detection}}}).turn_detection == expected


def test_transcription_flag() -> None:
    assert patch_of({"audio": {"input": {"transcription": {"model": "x"}}}}).input_transcription == (
        InputTranscription(model="x")
    )
    asked = {"model": "gpt-4o-transcribe", "language": "de", "prompt": "Namen: Ueli"}
    assert patch_of({"audio": {"input": {"transcription": asked}}}).input_transcription == InputTranscription(
        **asked
    )
    assert patch_of({"audio": {"input": {"transcription": None}}}).input_transcription is None
    assert patch_of({"input_audio_transcription": {}}).input_transcription == InputTranscription()
    assert patch_of({"input_audio_transcription": None}).input_transcription is None


def test_voice_object_and_speed() -> None:
    patch = patch_of({"audio": {"output": {"voice": {"id": "voice_123"}, "speed": 0.25}}})
    assert patch.voice == "voice_123"
    assert patch.speed == 0.25


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"input_audio_format": "mp3"}, ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "session.input_audio_format"),
        ({"output_audio_format": "opus"}, ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "session.output_audio_format"),
        (
            {"audio": {"input": {"format": {"type": "audio/opus"}}}},
            ErrorCode.UNSUPPORTED_AUDIO_FORMAT,
            "session.audio.input.format.type",
        ),
        ({"input_audio_format": 16}, ErrorCode.INVALID_VALUE, "session.input_audio_format"),
        (
            {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 7999}}}},
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            "session.audio.input.format.rate",
        ),
        (
            {"audio": {"output": {"format": {"type": "audio/pcm", "rate": 96000}}}},
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            "session.audio.output.format.rate",
        ),
        ({"sample_rate_hz": 48001}, ErrorCode.UNSUPPORTED_SAMPLE_RATE, "session.sample_rate_hz"),
        (
            {"audio": {"output": {"sample_rate_hz": 4000}}},
            ErrorCode.UNSUPPORTED_SAMPLE_RATE,
            "session.audio.output.sample_rate_hz",
        ),
        ({"sample_rate_hz": "16000"}, ErrorCode.INVALID_VALUE, "session.sample_rate_hz"),
        ({"sample_rate_hz": 16000.5}, ErrorCode.INVALID_VALUE, "session.sample_rate_hz"),
        ({"sample_rate_hz": True}, ErrorCode.INVALID_VALUE, "session.sample_rate_hz"),
        (
            {"turn_detection": {"type": "push_to_talk"}},
            ErrorCode.UNSUPPORTED_TURN_DETECTION,
            "session.turn_detection.type",
        ),
        (
            {"audio": {"input": {"turn_detection": {"type": "magic"}}}},
            ErrorCode.UNSUPPORTED_TURN_DETECTION,
            "session.audio.input.turn_detection.type",
        ),
        (
            {"audio": {"input": {"turn_detection": {"threshold": 1.5}}}},
            ErrorCode.INVALID_VALUE,
            "session.audio.input.turn_detection.threshold",
        ),
        (
            {"turn_detection": {"silence_duration_ms": 20000}},
            ErrorCode.INVALID_VALUE,
            "session.turn_detection.silence_duration_ms",
        ),
        (
            {"turn_detection": {"prefix_padding_ms": -1}},
            ErrorCode.INVALID_VALUE,
            "session.turn_detection.prefix_padding_ms",
        ),
        (
            {"turn_detection": {"idle_timeout_ms": 10}},
            ErrorCode.INVALID_VALUE,
            "session.turn_detection.idle_timeout_ms",
        ),
        (
            {"turn_detection": {"create_response": "yes"}},
            ErrorCode.INVALID_VALUE,
            "session.turn_detection.create_response",
        ),
        ({"turn_detection": "server_vad"}, ErrorCode.INVALID_VALUE, "session.turn_detection"),
        ({"turn_detection": {"type": 3}}, ErrorCode.INVALID_VALUE, "session.turn_detection.type"),
        ({"output_modalities": []}, ErrorCode.INVALID_VALUE, "session.output_modalities"),
        ({"modalities": ["video"]}, ErrorCode.INVALID_VALUE, "session.modalities[0]"),
        ({"modalities": "audio"}, ErrorCode.INVALID_VALUE, "session.modalities"),
        ({"voice": 7}, ErrorCode.INVALID_VALUE, "session.voice"),
        ({"voice": ""}, ErrorCode.INVALID_VALUE, "session.voice"),
        ({"audio": {"output": {"speed": 9}}}, ErrorCode.INVALID_VALUE, "session.audio.output.speed"),
        ({"speed": "fast"}, ErrorCode.INVALID_VALUE, "session.speed"),
        ({"instructions": 5}, ErrorCode.INVALID_VALUE, "session.instructions"),
        ({"model": ""}, ErrorCode.INVALID_VALUE, "session.model"),
        ({"type": "conversation"}, ErrorCode.INVALID_VALUE, "session.type"),
        ({"type": ["realtime"]}, ErrorCode.INVALID_VALUE, "session.type"),
        ({"audio": []}, ErrorCode.INVALID_VALUE, "session.audio"),
        ({"audio": {"input": 1}}, ErrorCode.INVALID_VALUE, "session.audio.input"),
        ({"input_audio_transcription": True}, ErrorCode.INVALID_VALUE, "session.input_audio_transcription"),
    ],
)
def test_session_update_errors(session: dict[str, object], code: ErrorCode, param: str) -> None:
    error = error_of({"type": "session.update", "event_id": "evt_s", "session": session})
    assert (error.code, error.param, error.event_id) == (code, param, "evt_s")


def test_session_update_needs_a_session_object() -> None:
    error = error_of({"type": "session.update", "event_id": "e1"})
    assert (error.code, error.param, error.event_id) == (ErrorCode.MISSING_FIELD, "session", "e1")
    error = error_of({"type": "session.update", "session": "x"})
    assert (error.code, error.param) == (ErrorCode.INVALID_VALUE, "session")


# ---------------------------------------------------------------------------
# the other client events


def test_append() -> None:
    pcm = bytes(range(256)) * 4
    command = parse(
        {"type": "input_audio_buffer.append", "event_id": "a1", "audio": base64.b64encode(pcm).decode()}
    )
    assert command == InputAudioAppend(event_id="a1", audio=pcm)
    # vLLM-Omni's DuplexClient declares each chunk's format and timing.
    extended = parse(
        {
            "type": "input_audio_buffer.append",
            "audio": "AAAA",
            "format": "pcm16",
            "sample_rate_hz": 16000,
            "duration_ms": 0,
            "audio_end_ms": 0,
        }
    )
    assert extended == InputAudioAppend(audio=b"\0\0\0", encoding=Encoding.PCM16, rate=16000)


def test_append_hints() -> None:
    hinted = parse(
        {
            "type": "input_audio_buffer.append",
            "audio": "AAAA",
            "format": "g711_ulaw",
            "is_speech": False,
            "hints": {"rms": 0.01, "vad": 0.2},
        }
    )
    assert hinted == InputAudioAppend(
        audio=b"\0\0\0", encoding=Encoding.G711_ULAW, is_speech=False, hints={"rms": 0.01, "vad": 0.2}
    )


@pytest.mark.parametrize(
    ("fields", "code", "param"),
    [
        ({"format": "opus"}, ErrorCode.UNSUPPORTED_AUDIO_FORMAT, "format"),
        ({"sample_rate_hz": 4000}, ErrorCode.UNSUPPORTED_SAMPLE_RATE, "sample_rate_hz"),
        ({"sample_rate_hz": "16k"}, ErrorCode.INVALID_VALUE, "sample_rate_hz"),
        ({"is_speech": "yes"}, ErrorCode.INVALID_VALUE, "is_speech"),
        ({"duration_ms": -5}, ErrorCode.INVALID_VALUE, "duration_ms"),
        ({"hints": [1]}, ErrorCode.INVALID_VALUE, "hints"),
    ],
)
def test_append_bad_hints(fields: dict[str, object], code: ErrorCode, param: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse({"type": "input_audio_buffer.append", "audio": "AAAA", **fields})
    assert (info.value.code, info.value.param) == (code, param)


#: The smallest pictures with a JPEG and a PNG signature, base64 (what the dialect checks).
JPEG_B64 = base64.b64encode(b"\xff\xd8\xff\xe0" + bytes(16)).decode()
PNG_B64 = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(16)).decode()


def test_append_keeps_its_audio_and_carries_its_video_frames() -> None:
    # vLLM-Omni's benchmark clients send a camera frame with the second of audio it was taken in.
    command = parse(
        {
            "type": "input_audio_buffer.append",
            "audio": "AAAA",
            "input_audio_format": "pcm16",
            "sample_rate_hz": 16000,
            "duration_ms": 200,
            "audio_end_ms": 600,
            "video_frames": [JPEG_B64, PNG_B64],
        }
    )
    assert command == InputAudioAppend(audio=b"\0\0\0", rate=16000, video_frames=(JPEG_B64, PNG_B64))
    assert parse(
        {"type": "input_audio_buffer.append", "audio": "AAAA", "video_frames": []}
    ) == InputAudioAppend(audio=b"\0\0\0")


@pytest.mark.parametrize(
    ("frames", "problem"),
    [
        ("AAAA", "must be a list"),
        (["AAAA"], "JPEG or PNG"),
        ([JPEG_B64, JPEG_B64, JPEG_B64], "at most 2 frames"),
        (["not base64!"], "valid base64"),
        ([""], "non-empty"),
        ([7], "non-empty base64 string"),
    ],
)
def test_append_with_bad_video_frames_keeps_its_audio(frames: object, problem: str) -> None:
    # Frames that cannot be used cost the frames, never the caller's audio beside them.
    command = parse({"type": "input_audio_buffer.append", "audio": "AAAA", "video_frames": frames})
    assert isinstance(command, InputAudioAppend)
    assert (command.audio, command.video_frames) == (b"\0\0\0", ())
    assert command.video_error is not None and problem in command.video_error


def test_item_create_with_input_image() -> None:
    url = f"data:image/jpeg;base64,{JPEG_B64}"
    command = parse(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": url, "detail": "auto"},
                ],
            },
        }
    )
    assert isinstance(command, ConversationItemCreate)
    assert (command.text, command.images) == ("what is this?", (url,))
    only_image = parse(
        {
            "type": "conversation.item.create",
            "item": {"role": "user", "content": [{"type": "input_image", "image_url": url}]},
        }
    )
    assert isinstance(only_image, ConversationItemCreate) and (only_image.text, only_image.images) == (
        "",
        (url,),
    )


@pytest.mark.parametrize(
    ("part", "code"),
    [
        ({"type": "input_image"}, ErrorCode.MISSING_FIELD),
        ({"type": "input_image", "image_url": "https://example.com/cat.jpg"}, ErrorCode.INVALID_VALUE),
        ({"type": "input_image", "image_url": "data:image/jpeg;base64,AAAA"}, ErrorCode.INVALID_VALUE),
    ],
)
def test_item_create_with_a_bad_input_image(part: dict[str, object], code: ErrorCode) -> None:
    error = error_of({"type": "conversation.item.create", "item": {"role": "user", "content": [part]}})
    assert (error.code, error.param) == (code, "item.content[0].image_url")
    # Pictures are the caller's input: an assistant message cannot hold one.
    assistant = {"type": "input_image", "image_url": f"data:image/png;base64,{PNG_B64}"}
    error = error_of(
        {"type": "conversation.item.create", "item": {"role": "assistant", "content": [assistant]}}
    )
    assert (error.code, error.param) == (ErrorCode.INVALID_VALUE, "item.content[0].type")


def test_user_item_with_images_renders_its_image_parts() -> None:
    item = ConversationItem(id="item_1", role="user", content_type="input_text", text="look", images=1)
    assert realtime.render_item(item, beta=False)["content"] == [
        {"type": "input_text", "text": "look"},
        {"type": "input_image"},
    ]
    picture_only = replace(item, text="")
    assert realtime.render_item(picture_only, beta=False)["content"] == [{"type": "input_image"}]


def test_input_ignored_renders_once_told() -> None:
    event = InputIgnored(input="video_frames", engine="echo", message="not used")
    assert ga(event) == {
        "type": "input.ignored",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "input": "video_frames",
        "engine": "echo",
        "message": "not used",
    }


def test_duplex_input_events() -> None:
    assert parse({"type": "input.cancel", "event_id": "c"}) == InputCancel(event_id="c")
    for kind in ("input.text.append", "input_text.append", "push_text"):
        assert parse({"type": kind, "text": "hi"}) == InputTextAppend(text="hi")
    with pytest.raises(ProtocolError) as info:
        parse({"type": "input.text.append"})
    assert info.value.code is ErrorCode.MISSING_FIELD
    assert parse({"type": "audio.playback_ack", "played_ms": 5}) == PlaybackAck(
        response_id=None, item_id=None, played_ms=5
    )
    assert parse({"type": "close_session"}) == SessionClose()


def test_turn_signal() -> None:
    # A signal of its own passes to the engine; one naming a command becomes that command.
    assert parse({"type": "turn.signal", "event": "user_started", "payload": {"x": 1}}) == TurnSignal(
        event="user_started", payload={"x": 1}
    )
    assert parse({"type": "signal_turn", "event": "barge_in"}) == BargeIn()
    assert parse({"type": "turn.signal", "event": "input.cancel"}) == InputCancel()
    assert parse({"type": "turn.signal", "event": "response.cancel", "response_id": "r1"}) == ResponseCancel(
        response_id="r1"
    )
    assert parse(
        {"type": "turn.signal", "event": "conversation.item.delete", "payload": {"item_id": "i1"}}
    ) == ConversationItemDelete(item_id="i1")
    update = parse(
        {"type": "turn.signal", "event": "session.update", "payload": {"instructions": "Be brief."}}
    )
    assert isinstance(update, SessionUpdate) and update.session.instructions == "Be brief."
    with pytest.raises(ProtocolError) as info:
        parse({"type": "turn.signal"})
    assert info.value.code is ErrorCode.MISSING_FIELD


@pytest.mark.parametrize(
    ("audio", "code"),
    [
        ("", ErrorCode.INVALID_VALUE),
        ("A", ErrorCode.INVALID_BASE64),
        ("AAA", ErrorCode.INVALID_BASE64),
        ("AA AA", ErrorCode.INVALID_BASE64),
        ("AAAA\n", ErrorCode.INVALID_BASE64),
        ("AA*A", ErrorCode.INVALID_BASE64),
        ("====", ErrorCode.INVALID_BASE64),
        ("ÄÄÄÄ", ErrorCode.INVALID_BASE64),
        (5, ErrorCode.INVALID_VALUE),
        (None, ErrorCode.INVALID_VALUE),
    ],
)
def test_append_errors(audio: object, code: ErrorCode) -> None:
    error = error_of({"type": "input_audio_buffer.append", "event_id": "a2", "audio": audio})
    assert (error.code, error.param, error.event_id) == (code, "audio", "a2")


def test_append_missing_audio() -> None:
    error = error_of({"type": "input_audio_buffer.append", "event_id": "a3"})
    assert (error.code, error.param, error.event_id) == (ErrorCode.MISSING_FIELD, "audio", "a3")


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        ({"type": "input_audio_buffer.commit"}, InputAudioCommit()),
        (
            {"type": "input_audio_buffer.commit", "final": True, "response_create": False},
            InputAudioCommit(create_response=False),
        ),
        (
            {"type": "input_audio_buffer.commit", "response_create": True},
            InputAudioCommit(create_response=True),
        ),
        ({"type": "input_audio_buffer.commit", "response_create": None}, InputAudioCommit()),
        # vLLM-Omni's reading: either spelling; response_create wins; non-booleans count as not given.
        (
            {"type": "input_audio_buffer.commit", "create_response": True},
            InputAudioCommit(create_response=True),
        ),
        (
            {"type": "input_audio_buffer.commit", "response_create": False, "create_response": True},
            InputAudioCommit(create_response=False),
        ),
        ({"type": "input_audio_buffer.commit", "response_create": "yes"}, InputAudioCommit()),
        (
            {"type": "input_audio_buffer.commit", "final": False, "is_speech": False},
            InputAudioCommit(final=False, is_speech=False),
        ),
        ({"type": "input_audio_buffer.commit", "final": 0, "is_speech": 1}, InputAudioCommit()),
        # input.commit asks for the reply unless it says otherwise.
        ({"type": "input.commit"}, InputAudioCommit(create_response=True)),
        ({"type": "input.commit", "response_create": False}, InputAudioCommit(create_response=False)),
        ({"type": "input_audio_buffer.clear", "event_id": "c"}, InputAudioClear(event_id="c")),
        ({"type": "output_audio_buffer.clear"}, OutputAudioClear()),
        ({"type": "barge_in", "event_id": "b"}, BargeIn(event_id="b")),
        ({"type": "session.heartbeat"}, SessionHeartbeat()),
        ({"type": "session.close"}, SessionClose()),
        ({"type": "session.close", "reason": None}, SessionClose()),
        ({"type": "session.close", "reason": "bye"}, SessionClose(reason="bye")),
        ({"type": "session.event_ack", "server_event_seq": 7}, SessionEventAck(server_event_seq=7)),
        (
            {
                "type": "session.resume",
                "session_id": "s1",
                "resume_token": "t",
                "last_received_server_event_seq": 9,
            },
            SessionResume(session_id="s1", resume_token="t", last_received_server_event_seq=9),
        ),
        (
            {"type": "session.resume", "session_id": "s1", "resume_token": "t"},
            SessionResume(session_id="s1", resume_token="t"),
        ),
        ({"type": "response.cancel"}, ResponseCancel()),
        ({"type": "response.cancel", "response_id": "resp_1"}, ResponseCancel(response_id="resp_1")),
        ({"type": "response.create"}, ResponseCreate()),
        ({"type": "response.create", "response": None}, ResponseCreate()),
        (
            {"type": "response.create", "response": {"instructions": "x", "output_modalities": ["text"]}},
            ResponseCreate(instructions="x", output_modalities=(Modality.TEXT,)),
        ),
        (
            {
                "type": "response.create",
                "response": {"modalities": ["audio", "text"], "voice": "v"},
            },  # beta voice
            ResponseCreate(output_modalities=(Modality.AUDIO, Modality.TEXT), voice="v"),
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 1500},
            ConversationItemTruncate(item_id="i", content_index=0, audio_end_ms=1500),
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": 12.9},
            ConversationItemTruncate(item_id="i", content_index=0, audio_end_ms=12),
        ),
        ({"type": "conversation.item.delete", "item_id": "i"}, ConversationItemDelete(item_id="i")),
        ({"type": "conversation.item.retrieve", "item_id": "i"}, ConversationItemRetrieve(item_id="i")),
        (
            {
                "type": "playback.ack",
                "played_ms": 120,
                "committed_ms": 120,
                "response_id": "r",
                "item_id": "i",
            },
            PlaybackAck(response_id="r", item_id="i", played_ms=120),
        ),
        ({"type": "playback.ack", "played_ms": 0}, PlaybackAck(response_id=None, item_id=None, played_ms=0)),
    ],
)
def test_simple_client_events(event: dict[str, object], expected: Command) -> None:
    assert parse(event) == expected


@pytest.mark.parametrize(
    ("item", "expected_text", "role"),
    [
        (
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            "hi",
            "user",
        ),
        ({"role": "system", "content": [{"type": "input_text", "text": "rules"}]}, "rules", "system"),
        (
            {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "ok"}]},
            "ok",
            "assistant",
        ),
        ({"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}, "ok", "assistant"),
        (
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "text", "text": "b"}]},
            "a\nb",
            "user",
        ),
    ],
)
def test_item_create(item: dict[str, object], expected_text: str, role: str) -> None:
    command = parse({"type": "conversation.item.create", "event_id": "ic", "item": item})
    assert command == ConversationItemCreate(event_id="ic", item_id=None, role=role, text=expected_text)


def test_item_create_ids() -> None:
    command = parse(
        {
            "type": "conversation.item.create",
            "previous_item_id": "prev",
            "item": {
                "id": "item_1",
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "x"}],
            },
        }
    )
    assert command == ConversationItemCreate(item_id="item_1", role="user", text="x", previous_item_id="prev")


@pytest.mark.parametrize(
    ("event", "code", "param"),
    [
        ({"type": "conversation.item.create"}, ErrorCode.MISSING_FIELD, "item"),
        ({"type": "conversation.item.create", "item": []}, ErrorCode.INVALID_VALUE, "item"),
        ({"type": "conversation.item.create", "item": {"content": []}}, ErrorCode.MISSING_FIELD, "item.role"),
        (
            {"type": "conversation.item.create", "item": {"role": "robot", "content": []}},
            ErrorCode.INVALID_VALUE,
            "item.role",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "function_call", "role": "user"}},
            ErrorCode.MISSING_FIELD,
            "item.name",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "mcp_call", "role": "user"}},
            ErrorCode.INVALID_VALUE,
            "item.type",
        ),
        (
            {"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "{}"}},
            ErrorCode.MISSING_FIELD,
            "item.call_id",
        ),
        (
            {"type": "response.create", "response": {"conversation": "conv_1"}},
            ErrorCode.INVALID_VALUE,
            "response.conversation",
        ),
        (
            {"type": "response.create", "response": {"tools": [{"type": "mcp", "server_label": "x"}]}},
            ErrorCode.UNSUPPORTED_BY_ENGINE,
            "response.tools[0].type",
        ),
        (
            {"type": "response.create", "response": {"tool_choice": "sometimes"}},
            ErrorCode.INVALID_VALUE,
            "response.tool_choice",
        ),
        (
            {"type": "response.create", "response": {"input": [{"type": "item_reference"}]}},
            ErrorCode.MISSING_FIELD,
            "response.input[0].id",
        ),
        (
            {"type": "conversation.item.create", "item": {"role": "user"}},
            ErrorCode.MISSING_FIELD,
            "item.content",
        ),
        (
            {"type": "conversation.item.create", "item": {"role": "user", "content": []}},
            ErrorCode.INVALID_VALUE,
            "item.content",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "user", "content": [{"type": "input_audio", "audio": "AAAA"}]},
            },
            ErrorCode.INVALID_VALUE,
            "item.content[0].type",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "audio"}]},
            },
            ErrorCode.INVALID_VALUE,
            "item.content[1].type",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"role": "user", "content": [{"type": "input_text"}]},
            },
            ErrorCode.MISSING_FIELD,
            "item.content[0].text",
        ),
        (
            {"type": "conversation.item.create", "item": {"role": "user", "content": [{"text": "x"}]}},
            ErrorCode.MISSING_FIELD,
            "item.content[0].type",
        ),
        (
            {"type": "conversation.item.create", "item": {"role": "user", "content": ["x"]}},
            ErrorCode.INVALID_VALUE,
            "item.content[0]",
        ),
        (
            {
                "type": "conversation.item.create",
                "previous_item_id": 4,
                "item": {"role": "user", "content": [{"type": "input_text", "text": "x"}]},
            },
            ErrorCode.INVALID_VALUE,
            "previous_item_id",
        ),
        (
            {"type": "conversation.item.truncate", "content_index": 0, "audio_end_ms": 1},
            ErrorCode.MISSING_FIELD,
            "item_id",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "audio_end_ms": 1},
            ErrorCode.MISSING_FIELD,
            "content_index",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0},
            ErrorCode.MISSING_FIELD,
            "audio_end_ms",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0, "audio_end_ms": -5},
            ErrorCode.INVALID_VALUE,
            "audio_end_ms",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": 0.5, "audio_end_ms": 5},
            ErrorCode.INVALID_VALUE,
            "content_index",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": "i", "content_index": -1, "audio_end_ms": 5},
            ErrorCode.INVALID_VALUE,
            "content_index",
        ),
        (
            {"type": "conversation.item.truncate", "item_id": 3, "content_index": 0, "audio_end_ms": 5},
            ErrorCode.INVALID_VALUE,
            "item_id",
        ),
        ({"type": "conversation.item.delete"}, ErrorCode.MISSING_FIELD, "item_id"),
        ({"type": "conversation.item.delete", "item_id": ""}, ErrorCode.INVALID_VALUE, "item_id"),
        ({"type": "conversation.item.retrieve"}, ErrorCode.MISSING_FIELD, "item_id"),
        ({"type": "conversation.item.retrieve", "item_id": None}, ErrorCode.INVALID_VALUE, "item_id"),
        ({"type": "playback.ack"}, ErrorCode.MISSING_FIELD, "played_ms"),
        ({"type": "playback.ack", "played_ms": -1}, ErrorCode.INVALID_VALUE, "played_ms"),
        ({"type": "playback.ack", "played_ms": "10"}, ErrorCode.INVALID_VALUE, "played_ms"),
        ({"type": "playback.ack", "played_ms": True}, ErrorCode.INVALID_VALUE, "played_ms"),
        ({"type": "playback.ack", "played_ms": 1, "response_id": 9}, ErrorCode.INVALID_VALUE, "response_id"),
        ({"type": "playback.ack", "played_ms": 1, "item_id": []}, ErrorCode.INVALID_VALUE, "item_id"),
        ({"type": "response.cancel", "response_id": 1}, ErrorCode.INVALID_VALUE, "response_id"),
        ({"type": "response.create", "response": 1}, ErrorCode.INVALID_VALUE, "response"),
        (
            {"type": "response.create", "response": {"instructions": 1}},
            ErrorCode.INVALID_VALUE,
            "response.instructions",
        ),
        (
            {"type": "response.create", "response": {"output_modalities": ["smell"]}},
            ErrorCode.INVALID_VALUE,
            "response.output_modalities[0]",
        ),
        ({"type": "session.close", "reason": 5}, ErrorCode.INVALID_VALUE, "reason"),
        ({"type": "session.event_ack"}, ErrorCode.MISSING_FIELD, "server_event_seq"),
        ({"type": "session.event_ack", "server_event_seq": -1}, ErrorCode.INVALID_VALUE, "server_event_seq"),
    ],
)
def test_client_event_errors(event: dict[str, object], code: ErrorCode, param: str) -> None:
    error = error_of({**event, "event_id": "evt_9"})
    assert (error.code, error.param, error.event_id) == (code, param, "evt_9")
    anonymous = error_of(event)
    assert (anonymous.code, anonymous.param, anonymous.event_id) == (code, param, None)


def test_nan_and_infinity_are_not_numbers() -> None:
    error = error_of('{"type": "playback.ack", "played_ms": NaN}')
    assert (error.code, error.param) == (ErrorCode.INVALID_VALUE, "played_ms")
    error = error_of('{"type": "session.update", "session": {"sample_rate_hz": Infinity}}')
    assert (error.code, error.param) == (ErrorCode.INVALID_VALUE, "session.sample_rate_hz")


def test_every_client_event_type_is_covered() -> None:
    assert CLIENT_EVENT_TYPES == {  # noqa: SIM300 - the table under test, not a constant
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input.commit",
        "input_audio_buffer.clear",
        "input.cancel",
        "input.text.append",
        "input_text.append",
        "push_text",
        "turn.signal",
        "signal_turn",
        "audio.playback_ack",
        "close",
        "close_session",
        "response.create",
        "response.cancel",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "output_audio_buffer.clear",
        "barge_in",
        "playback.ack",
        "session.heartbeat",
        "session.close",
        "session.event_ack",
        "session.resume",
    }


# ---------------------------------------------------------------------------
# envelope errors


@pytest.mark.parametrize("text", ["", "{", "nope", '{"type": "x",}', "{'type': 'x'}", "[1, 2"])
def test_invalid_json(text: str) -> None:
    error = error_of(text)
    assert error.code is ErrorCode.INVALID_JSON
    assert error.event_id is None


@pytest.mark.parametrize("text", ["[]", '"session.update"', "1", "null", "true", '[{"type": "barge_in"}]'])
def test_non_object_json(text: str) -> None:
    assert error_of(text).code is ErrorCode.INVALID_EVENT


@pytest.mark.parametrize(
    "event", [{}, {"event_id": "e"}, {"type": None}, {"type": 3}, {"type": ["barge_in"]}]
)
def test_missing_or_bad_type(event: dict[str, object]) -> None:
    error = error_of(event)
    assert error.code is ErrorCode.INVALID_EVENT
    assert error.event_id == event.get("event_id")


def test_unknown_type_is_named() -> None:
    error = error_of({"type": "response.teleport", "event_id": "u1"})
    assert error.code is ErrorCode.UNKNOWN_EVENT
    assert "response.teleport" in error.message
    assert error.event_id == "u1"


def test_event_id_must_be_a_string() -> None:
    error = error_of({"type": "barge_in", "event_id": 12})
    assert (error.code, error.param, error.event_id) == (ErrorCode.INVALID_VALUE, "event_id", None)
    assert parse({"type": "barge_in", "event_id": None}) == BargeIn()


def test_message_too_large() -> None:
    event = json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 1000, "event_id": "big"})
    error = error_of(event, max_bytes=500)
    assert error.code is ErrorCode.MESSAGE_TOO_LARGE
    assert error_of(event.encode(), max_bytes=500).code is ErrorCode.MESSAGE_TOO_LARGE
    # The limit counts UTF-8 bytes, not characters.
    wide = json.dumps({"type": "session.close", "reason": "é" * 200}, ensure_ascii=False)
    assert len(wide) < 300 < len(wide.encode())
    assert error_of(wide, max_bytes=300).code is ErrorCode.MESSAGE_TOO_LARGE
    assert parse_client_event(wide, max_bytes=len(wide.encode())) == SessionClose(reason="é" * 200)


def test_bytes_input() -> None:
    assert parse_client_event(b'{"type": "barge_in"}', max_bytes=MAX) == BargeIn()
    assert error_of(b'{"type": "\xff"}').code is ErrorCode.INVALID_JSON


def test_pathological_json() -> None:
    assert error_of("[" * 100_000 + "]" * 100_000).code is ErrorCode.INVALID_JSON
    assert (
        error_of('{"type": "playback.ack", "played_ms": ' + "9" * 5000 + "}").code is ErrorCode.INVALID_JSON
    )
    huge = error_of('{"type": "playback.ack", "played_ms": -' + "9" * 4000 + "}")
    assert (huge.code, huge.param) == (ErrorCode.INVALID_VALUE, "played_ms")
    far = error_of('{"type": "session.update", "session": {"speed": ' + "9" * 4000 + "}}")
    assert (far.code, far.param) == (ErrorCode.INVALID_VALUE, "session.speed")


# ---------------------------------------------------------------------------
# fuzz: the parser raises nothing but ProtocolError

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.sampled_from([0, 1, 8000, 16000, 24000, 48000, 0.5, -1, 1e308, 2**70]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(
        [
            "AAAA",
            "audio/pcm",
            "audio/pcmu",
            "pcm16",
            "g711_alaw",
            "server_vad",
            "semantic_vad",
            "user",
            "assistant",
            "input_text",
            "input_audio",
            "text",
            "audio",
            "message",
            "realtime",
        ]
    ),
)
_KEYS = st.sampled_from(
    [
        "type",
        "event_id",
        "audio",
        "session",
        "response",
        "item",
        "item_id",
        "content_index",
        "audio_end_ms",
        "played_ms",
        "response_id",
        "reason",
        "previous_item_id",
        "server_event_seq",
        "role",
        "content",
        "text",
        "id",
        "instructions",
        "modalities",
        "output_modalities",
        "input",
        "output",
        "format",
        "rate",
        "sample_rate_hz",
        "sample_rate",
        "output_sample_rate_hz",
        "input_audio_format",
        "output_audio_format",
        "turn_detection",
        "threshold",
        "prefix_padding_ms",
        "silence_duration_ms",
        "create_response",
        "interrupt_response",
        "idle_timeout_ms",
        "transcription",
        "input_audio_transcription",
        "voice",
        "speed",
        "model",
        "eagerness",
        "extra_body",
    ]
)
_json_value = st.recursive(
    _json_leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.one_of(_KEYS, st.text(max_size=6)), children, max_size=6),
    ),
    max_leaves=30,
)
_FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _only_protocol_errors(text: str | bytes) -> None:
    try:
        result = parse_client_event(text, max_bytes=4096)
    except ProtocolError as exc:
        assert isinstance(exc.code, ErrorCode)
    else:
        assert isinstance(result, Command)


@_FUZZ
@given(st.text(max_size=300))
def test_fuzz_arbitrary_text(text: str) -> None:
    _only_protocol_errors(text)


@_FUZZ
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data: bytes) -> None:
    _only_protocol_errors(data)


@_FUZZ
@given(st.sampled_from(sorted(CLIENT_EVENT_TYPES)), st.dictionaries(_KEYS, _json_value, max_size=6))
def test_fuzz_typed_objects(kind: str, fields: dict[str, Any]) -> None:
    _only_protocol_errors(json.dumps({**fields, "type": kind}))


@_FUZZ
@given(
    st.dictionaries(_KEYS, _json_value, max_size=8),
    st.dictionaries(_KEYS, _json_value, max_size=4),
    st.dictionaries(_KEYS, _json_value, max_size=4),
)
def test_fuzz_session_update(
    session: dict[str, Any], audio_in: dict[str, Any], audio_out: dict[str, Any]
) -> None:
    session = {**session, "audio": {"input": audio_in, "output": audio_out}}
    _only_protocol_errors(json.dumps({"type": "session.update", "session": session}))


# ---------------------------------------------------------------------------
# rendering

USER_AUDIO = ConversationItem(id="item_u", role="user", content_type="input_audio", transcript="hello")
USER_TEXT = ConversationItem(id="item_t", role="user", content_type="input_text", text="typed")
ASSISTANT = ConversationItem(id="item_a", role="assistant", content_type="audio", transcript="hi there")
ASSISTANT_TEXT = ConversationItem(id="item_x", role="assistant", content_type="text", text="words")
ASSISTANT_OPEN = ConversationItem(id="item_a", role="assistant", status="in_progress", content_type="audio")
CONFIG = SessionConfig(
    model="gpt-4o-realtime-preview",
    instructions="be kind",
    voice="v1",
    input_transcription=InputTranscription(),
)

FUNCTION_CALL = ConversationItem(
    id="item_fc",
    role="assistant",
    status="in_progress",
    content_type="",
    kind="function_call",
    call_id="call_1",
    name="get_weather",
    arguments="",
)
FUNCTION_OUTPUT = ConversationItem(
    id="item_out",
    role="tool",
    content_type="",
    kind="function_call_output",
    call_id="call_1",
    output='{"temperature": 21}',
)

SAMPLES: list[ServerEvent] = [
    SessionCreated(
        session_id="sess_1", config=CONFIG, capabilities=(("barge_in", True), ("rates", (16000, 24000)))
    ),
    # The defaults a client gets before any session.update, with the gateway's own model name.
    SessionCreated(session_id="sess_1", config=SessionConfig()),
    SessionResumed(session_id="sess_1", config=CONFIG, resume_token="tok"),
    SessionReplaced(session_id="sess_1", attachment_generation=1),
    SessionResyncRequired(session_id="sess_1"),
    FunctionCallArgumentsDelta(
        response_id="resp_1",
        item_id="item_fc",
        output_index=0,
        call_id="call_1",
        delta='{"city": "Pa',
    ),
    FunctionCallArgumentsDone(
        response_id="resp_1",
        item_id="item_fc",
        output_index=0,
        call_id="call_1",
        name="get_weather",
        arguments='{"city": "Paris"}',
    ),
    OutputItemAdded(response_id="resp_1", output_index=0, item=FUNCTION_CALL),
    OutputItemDone(response_id="resp_1", output_index=0, item=replace(FUNCTION_CALL, status="completed")),
    ConversationItemDone(item=FUNCTION_OUTPUT, previous_item_id="item_fc"),
    ResponseDone(
        response_id="resp_2",
        status="completed",
        output=(replace(FUNCTION_CALL, status="completed"),),
        metadata={"topic": "weather"},
        input_audio_ms=1500,
        input_tokens=120,
        output_tokens=30,
    ),
    ResponseCreated(response_id="resp_3", metadata={"purpose": "classify"}, out_of_band=True),
    TurnLatency(
        response_id="resp_1",
        item_id="item_1",
        total_ms=812.5,
        stages=(
            ("turn_detection", 500.0),
            ("recognition", 120.0),
            ("reply", 2.0),
            ("speech", 180.5),
            ("other", 10.0),
        ),
    ),
    SessionUpdated(session_id="sess_1", config=CONFIG),
    SpeechStarted(audio_start_ms=100, item_id="item_u"),
    SpeechStopped(audio_end_ms=900, item_id="item_u"),
    InputAudioCommitted(item_id="item_u", previous_item_id=None),
    InputAudioCleared(),
    InputAudioTimeoutTriggered(item_id="item_s", audio_start_ms=4000, audio_end_ms=9000),
    ConversationItemAdded(item=USER_AUDIO, previous_item_id=None),
    ConversationItemDone(item=USER_AUDIO, previous_item_id="item_0"),
    ConversationItemTruncated(item_id="item_a", content_index=0, audio_end_ms=640),
    ConversationItemDeleted(item_id="item_t"),
    ConversationItemRetrieved(item=USER_TEXT),
    InputTranscriptionDelta(item_id="item_u", delta="hel"),
    InputTranscriptionCompleted(item_id="item_u", transcript="hello", audio_ms=1840),
    InputTranscriptionCompleted(item_id="item_u", transcript=""),
    InputTranscriptionFailed(item_id="item_u", code="transcription_failed", message="no words"),
    ResponseCreated(response_id="resp_1"),
    OutputItemAdded(response_id="resp_1", output_index=0, item=ASSISTANT_OPEN),
    ContentPartAdded(
        response_id="resp_1", item_id="item_a", output_index=0, content_index=0, part_type="audio"
    ),
    AudioDelta(response_id="resp_1", item_id="item_a", audio=b"\x01\x02\x03", rate=24000, encoded=True),
    TranscriptDelta(response_id="resp_1", item_id="item_a", delta="hi"),
    AudioDone(response_id="resp_1", item_id="item_a"),
    TranscriptDone(response_id="resp_1", item_id="item_a", transcript="hi there"),
    TextDelta(response_id="resp_1", item_id="item_x", delta="wo"),
    TextDone(response_id="resp_1", item_id="item_x", text="words"),
    ContentPartDone(response_id="resp_1", item_id="item_a", part_type="audio", transcript="hi there"),
    OutputItemDone(response_id="resp_1", output_index=0, item=ASSISTANT),
    ResponseDone(response_id="resp_1", status="completed", output=(ASSISTANT,), audio_ms=1200),
    ResponseDone(response_id="resp_2", status="cancelled", reason="turn_detected", output=(ASSISTANT_TEXT,)),
    ResponseDone(response_id="resp_3", status="failed", reason="engine_error"),
    ResponseDone(response_id="resp_4", status="cancelled", reason="superseded"),
    ResponseDone(response_id="resp_5", status="cancelled", reason="no caller audio"),
    ResponseDone(response_id="resp_6", status="failed", reason="no caller audio"),
    RateLimitsUpdated(),
    OutputAudioCleared(response_id="resp_1"),
    OutputAudioCleared(response_id=None),
    PlaybackAcknowledged(response_id="resp_1", played_ms=500, produced_ms=1200),
    HeartbeatAck(session_id="sess_1"),
    InputIgnored(input="video_frames", engine="echo", message="the echo engine does not use camera frames"),
    SessionClosed(session_id="sess_1", reason="client_close"),
    SessionClosing(reason="server_shutdown", grace_s=20.0),
    ResponseListen(response_id=None, reason="silence_or_noise"),
    ResponseListen(response_id="resp_1", reason="model_turn_completed_without_output"),
    ResponseSpeak(response_id="resp_1", item_id="item_9"),
    DtmfReceived(digit="5", received_at=1764540000),
    OverlapDecision(policy="barge_in_on_speech", action="barge_in", reason="speech_over_reply"),
    ErrorEvent(code=ErrorCode.INVALID_BASE64, message="bad", event_id="evt_c", param="audio"),
    ErrorEvent(code=ErrorCode.ENGINE_ERROR, message="boom"),
]


def render(
    event: ServerEvent, *, beta: bool = False, seq: int = 3, duplex: bool = False
) -> dict[str, object] | None:
    return render_server_event(
        event, seq=seq, event_id=f"evt_{seq}", beta=beta, session_id="sess_1", duplex=duplex
    )


def ga(event: ServerEvent) -> dict[str, object]:
    wire = render(event)
    assert wire is not None
    return wire


def test_samples_cover_every_server_event_class() -> None:
    classes = {
        cls
        for _, cls in inspect.getmembers(events_module, inspect.isclass)
        if issubclass(cls, ServerEvent) and cls.type
    }
    assert classes == {type(event) for event in SAMPLES}


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_envelope_and_json(event: ServerEvent, beta: bool) -> None:
    wire = render(event, beta=beta, seq=41, duplex=True)
    if wire is None:
        assert (beta and event.type in realtime._GA_ONLY) or event == OutputAudioCleared(response_id=None)
        return
    assert wire["event_id"] == "evt_41"
    assert wire["server_event_seq"] == 41
    assert isinstance(wire["type"], str)
    assert json.loads(json.dumps(wire)) == wire


@pytest.mark.parametrize("beta", [False, True])
@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: type(e).__name__)
def test_conforms_to_official_sdk_models(event: ServerEvent, beta: bool) -> None:
    """Every event but the vLLM-Omni extensions validates, exactly as rendered, against the
    openai SDK's (GA or beta) server-event union in strict mode."""
    wire = render(event, beta=beta)
    if wire is None or wire["type"] in EXTENSION_EVENTS:
        return
    parsed = validate_server_event(wire, beta=beta)
    assert parsed.type == wire["type"]  # type: ignore[attr-defined]


def test_strict_validation_rejects_what_strict_clients_reject() -> None:
    """The check above can fail: unknown types and missing or out-of-literal fields do not pass."""
    for bad in (
        {"type": "no.such", "event_id": "e"},
        {
            "type": "conversation.item.input_audio_transcription.completed",
            "event_id": "e",
            "item_id": "i",
            "content_index": 0,
            "transcript": "t",
        },
        {"type": "output_audio_buffer.cleared", "event_id": "e", "response_id": None},
        {
            "type": "response.done",
            "event_id": "e",
            "response": {
                "id": "r",
                "status": "cancelled",
                "status_details": {"type": "cancelled", "reason": "superseded"},
            },
        },
        {"type": "rate_limits.updated", "event_id": "e", "rate_limits": "none"},
    ):
        with pytest.raises(pydantic.ValidationError):
            validate_server_event(bad)
    with pytest.raises(pydantic.ValidationError):
        validate_server_event(
            {"type": "session.created", "event_id": "e", "session": {"model": "duplex-gateway"}}, beta=True
        )


def test_transcription_usage_is_the_audio_duration() -> None:
    wire = ga(InputTranscriptionCompleted(item_id="i", transcript="hey", audio_ms=2345))
    assert wire["usage"] == {"type": "duration", "seconds": 2.345}


def test_rate_limits_updated() -> None:
    wire = ga(RateLimitsUpdated())
    assert wire == {
        "type": "rate_limits.updated",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "rate_limits": [],
    }
    assert render(RateLimitsUpdated(), beta=True) == wire


@pytest.mark.parametrize(
    ("status", "reason", "expected"),
    [
        ("cancelled", "turn_detected", "turn_detected"),
        ("cancelled", "client_cancelled", "client_cancelled"),
        ("cancelled", "superseded", "turn_detected"),  # the caller's next turn replaced it
        ("cancelled", "engine says stop", None),
        ("incomplete", "max_output_tokens", "max_output_tokens"),
        ("incomplete", "turn_detected", None),
        ("failed", "no caller audio", None),
    ],
)
def test_response_done_reasons_stay_within_openai_literal(
    status: str, reason: str, expected: str | None
) -> None:
    response = ga(ResponseDone(response_id="r", status=status, reason=reason))["response"]
    assert isinstance(response, dict)
    assert response["status_details"]["reason"] == expected
    if status == "failed":  # the gateway's own words go to the error, where OpenAI puts them
        assert response["status_details"]["error"]["code"] == reason


@pytest.mark.parametrize("beta", [False, True])
def test_vllm_omni_events_go_only_to_duplex_handshake_clients(beta: bool) -> None:
    # (``overlap.decision`` is held back by the session unless asked for: the dialect renders it.)
    unasked = (SessionClosed, ResponseListen, ResponseSpeak)
    for event in SAMPLES:
        if isinstance(event, unasked):
            assert render(event, beta=beta) is None
            duplex = render(event, beta=beta, duplex=True)
            assert duplex is not None and duplex["type"] == event.type
        else:  # everything else is the same in both lanes
            assert render(event, beta=beta) == render(event, beta=beta, duplex=True)


def test_native_turn_taking_events_in_vllm_omni_shape() -> None:
    base = {"event_id": "evt_3", "server_event_seq": 3}
    assert render(ResponseListen(reason="silence_or_noise"), duplex=True) == {
        **base,
        "type": "response.listen",
        "session_id": "sess_1",
        "response": {
            "object": "realtime.response",
            "status": "listening",
            "metadata": {"reason": "silence_or_noise"},
        },
    }
    assert render(ResponseListen(response_id="r", reason=None), duplex=True) == {
        **base,
        "type": "response.listen",
        "session_id": "sess_1",
        "response_id": "r",
        "response": {
            "object": "realtime.response",
            "status": "listening",
            "metadata": {"reason": None},
            "id": "r",
        },
    }
    assert render(ResponseSpeak(response_id="r", item_id="i"), duplex=True) == {
        **base,
        "type": "response.speak",
        "response_id": "r",
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
        "metadata": {"session_id": "sess_1"},
    }
    assert render(OverlapDecision(policy="p", action="a", reason="why"), duplex=True) == {
        **base,
        "type": "overlap.decision",
        "session_id": "sess_1",
        "policy": "p",
        "action": "a",
        "reason": "why",
        "metadata": {},
    }


def test_output_audio_cleared_names_a_reply_or_is_not_sent() -> None:
    assert ga(OutputAudioCleared(response_id="resp_1"))["response_id"] == "resp_1"
    assert render(OutputAudioCleared(response_id=None)) is None
    assert render(OutputAudioCleared(response_id=None), beta=True) is None


def test_audio_delta_ga_and_beta() -> None:
    event = AudioDelta(
        response_id="r", item_id="i", output_index=1, content_index=0, audio=b"\xff\x00", rate=16000
    )
    expected = {
        "type": "response.output_audio.delta",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "response_id": "r",
        "item_id": "i",
        "output_index": 1,
        "content_index": 0,
        "delta": base64.b64encode(b"\xff\x00").decode(),
        # vLLM-Omni's AudioDelta.to_realtime() names each chunk's format beside its rate.
        "format": "pcm16",
        "sample_rate_hz": 16000,
    }
    assert ga(event) == expected
    ulaw = replace(event, encoding=Encoding.G711_ULAW, rate=8000, encoded=True)
    assert (ga(ulaw)["format"], ga(ulaw)["sample_rate_hz"]) == ("g711_ulaw", 8000)
    assert render(event, beta=True) == {**expected, "type": "response.audio.delta"}


@pytest.mark.parametrize(
    ("event", "ga_name", "beta_name"),
    [
        (AudioDone(response_id="r", item_id="i"), "response.output_audio.done", "response.audio.done"),
        (
            TranscriptDelta(response_id="r", item_id="i", delta="d"),
            "response.output_audio_transcript.delta",
            "response.audio_transcript.delta",
        ),
        (
            TranscriptDone(response_id="r", item_id="i", transcript="t"),
            "response.output_audio_transcript.done",
            "response.audio_transcript.done",
        ),
        (
            TextDelta(response_id="r", item_id="i", delta="d"),
            "response.output_text.delta",
            "response.text.delta",
        ),
        (TextDone(response_id="r", item_id="i", text="t"), "response.output_text.done", "response.text.done"),
        (
            ConversationItemAdded(item=USER_TEXT, previous_item_id=None),
            "conversation.item.added",
            "conversation.item.created",
        ),
        (ResponseCreated(response_id="r"), "response.created", "response.created"),
        (
            SpeechStarted(audio_start_ms=0, item_id="i"),
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_started",
        ),
    ],
)
def test_beta_names(event: ServerEvent, ga_name: str, beta_name: str) -> None:
    ga_wire = ga(event)
    beta_wire = render(event, beta=True)
    assert ga_wire["type"] == ga_name
    assert beta_wire is not None
    assert beta_wire["type"] == beta_name
    assert {k: v for k, v in ga_wire.items() if k not in ("type", "item", "response")} == {
        k: v for k, v in beta_wire.items() if k not in ("type", "item", "response")
    }


def test_item_done_has_no_beta_form() -> None:
    event = ConversationItemDone(item=USER_AUDIO, previous_item_id=None)
    assert ga(event)["type"] == "conversation.item.done"
    assert render(event, beta=True) is None


def test_items() -> None:
    added = ga(ConversationItemAdded(item=USER_AUDIO, previous_item_id="item_0"))
    assert added == {
        "type": "conversation.item.added",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "previous_item_id": "item_0",
        "item": {
            "id": "item_u",
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": "hello"}],
        },
    }

    def content(item: ConversationItem, beta: bool) -> object:
        return realtime.render_item(item, beta=beta)["content"]

    assert content(USER_TEXT, False) == [{"type": "input_text", "text": "typed"}]
    assert content(ASSISTANT, False) == [{"type": "output_audio", "transcript": "hi there"}]
    assert content(ASSISTANT, True) == [{"type": "audio", "transcript": "hi there"}]
    assert content(ASSISTANT_TEXT, False) == [{"type": "output_text", "text": "words"}]
    assert content(ASSISTANT_TEXT, True) == [{"type": "text", "text": "words"}]
    assert content(ASSISTANT_OPEN, False) == []
    pending = ConversationItem(id="u", role="user", status="in_progress")
    assert content(pending, False) == [{"type": "input_audio", "transcript": None}]


def test_content_parts() -> None:
    added = ga(
        ContentPartAdded(response_id="r", item_id="i", output_index=0, content_index=0, part_type="audio")
    )
    assert added["part"] == {"type": "audio", "transcript": ""}
    text = ga(
        ContentPartAdded(response_id="r", item_id="i", output_index=0, content_index=1, part_type="text")
    )
    assert text["part"] == {"type": "text", "text": ""}
    done = ga(ContentPartDone(response_id="r", item_id="i", part_type="audio", transcript="all"))
    assert done == {
        "type": "response.content_part.done",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "response_id": "r",
        "item_id": "i",
        "output_index": 0,
        "content_index": 0,
        "part": {"type": "audio", "transcript": "all"},
    }


def test_responses() -> None:
    assert ga(ResponseCreated(response_id="resp_1")) == {
        "type": "response.created",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "response_id": "resp_1",
        "response": {
            "object": "realtime.response",
            "id": "resp_1",
            "status": "in_progress",
            "status_details": None,
            "output": [],
            "usage": None,
            "metadata": None,
            "conversation_id": "conv_sess_1",
            "audio_ms": 0,
        },
    }
    done = ga(ResponseDone(response_id="resp_1", status="completed", output=(ASSISTANT,), audio_ms=1200))
    response = done["response"]
    assert isinstance(response, dict)
    assert response["status"] == "completed"
    assert response["status_details"] is None
    assert response["audio_ms"] == 1200
    assert response["output"] == [realtime.render_item(ASSISTANT, beta=False)]
    cancelled = ga(ResponseDone(response_id="r", status="cancelled", reason="turn_detected"))["response"]
    assert isinstance(cancelled, dict)
    assert cancelled["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
    failed = ga(ResponseDone(response_id="r", status="failed", reason="engine_error"))["response"]
    assert isinstance(failed, dict)
    assert failed["status_details"] == {
        "type": "failed",
        "reason": None,
        "error": {"type": "server_error", "code": "engine_error", "message": "engine_error"},
    }


def test_simple_ga_events() -> None:
    base = {"event_id": "evt_3", "server_event_seq": 3}
    assert ga(SpeechStarted(audio_start_ms=5, item_id="i")) == {
        **base,
        "type": "input_audio_buffer.speech_started",
        "audio_start_ms": 5,
        "item_id": "i",
    }
    assert ga(SpeechStopped(audio_end_ms=9, item_id="i")) == {
        **base,
        "type": "input_audio_buffer.speech_stopped",
        "audio_end_ms": 9,
        "item_id": "i",
    }
    assert ga(InputAudioCommitted(item_id="i", previous_item_id="p")) == {
        **base,
        "type": "input_audio_buffer.committed",
        "item_id": "i",
        "previous_item_id": "p",
    }
    assert ga(InputAudioCleared()) == {**base, "type": "input_audio_buffer.cleared"}
    assert ga(ConversationItemTruncated(item_id="i", content_index=0, audio_end_ms=7)) == {
        **base,
        "type": "conversation.item.truncated",
        "item_id": "i",
        "content_index": 0,
        "audio_end_ms": 7,
    }
    assert ga(ConversationItemDeleted(item_id="i")) == {
        **base,
        "type": "conversation.item.deleted",
        "item_id": "i",
    }
    assert ga(InputTranscriptionDelta(item_id="i", delta="he")) == {
        **base,
        "type": "conversation.item.input_audio_transcription.delta",
        "item_id": "i",
        "content_index": 0,
        "delta": "he",
    }
    assert ga(InputTranscriptionCompleted(item_id="i", transcript="hey", audio_ms=1500)) == {
        **base,
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": "i",
        "content_index": 0,
        "transcript": "hey",
        "usage": {"type": "duration", "seconds": 1.5},
    }
    assert ga(OutputAudioCleared(response_id="r")) == {
        **base,
        "type": "output_audio_buffer.cleared",
        "response_id": "r",
    }


def test_extension_events() -> None:
    base = {"event_id": "evt_3", "server_event_seq": 3}
    assert ga(PlaybackAcknowledged(response_id="r", played_ms=40, produced_ms=90)) == {
        **base,
        "type": "playback.acknowledged",
        "session_id": "sess_1",
        "response_id": "r",
        "played_ms": 40,
        "produced_ms": 90,
        "event": {
            "type": "playback.acknowledged",
            "session_id": "sess_1",
            "response_id": "r",
            "played_ms": 40,
            "produced_ms": 90,
        },
    }
    assert ga(HeartbeatAck(session_id="s")) == {**base, "type": "session.heartbeat_ack", "session_id": "s"}
    assert render(SessionClosed(session_id="s", reason="idle_timeout"), duplex=True) == {
        **base,
        "type": "session.closed",
        "session_id": "s",
        "reason": "idle_timeout",
    }
    for event in (
        PlaybackAcknowledged(response_id="r", played_ms=1, produced_ms=2),
        HeartbeatAck(session_id="s"),
    ):
        assert render(event, beta=True) == ga(event)


def test_error_event() -> None:
    wire = ga(ErrorEvent(code=ErrorCode.UNKNOWN_EVENT, message="unknown", event_id="evt_c", param="type"))
    assert wire == {
        "type": "error",
        "event_id": "evt_3",
        "server_event_seq": 3,
        "error": {
            "type": "invalid_request_error",
            "code": "unknown_event",
            "message": "unknown",
            "param": "type",
            "event_id": "evt_c",
        },
    }
    server = ga(ErrorEvent(code=ErrorCode.ENGINE_ERROR, message="x"))["error"]
    assert server == {
        "type": "server_error",
        "code": "engine_error",
        "message": "x",
        "param": None,
        "event_id": None,
    }
    limited = ga(ErrorEvent(code=ErrorCode.INPUT_RATE_EXCEEDED, message="slow down"))["error"]
    assert isinstance(limited, dict)
    assert limited["type"] == "rate_limit_error"


def test_session_object_ga() -> None:
    wire = ga(SessionCreated(session_id="sess_9", config=CONFIG, capabilities=(("barge_in", True),)))
    assert wire["type"] == "session.created"
    assert wire["session"] == {
        "type": "realtime",
        "object": "realtime.session",
        "id": "sess_9",
        "model": "gpt-4o-realtime-preview",
        "instructions": "be kind",
        "output_modalities": ["audio"],
        "audio": {
            "input": {
                "format": {"type": "audio/pcm", "rate": 24000},
                "turn_detection": {
                    "type": "server_vad",
                    "threshold": 0.5,
                    "prefix_padding_ms": 300,
                    "silence_duration_ms": 500,
                    "create_response": True,
                    "interrupt_response": True,
                    "idle_timeout_ms": None,
                },
                "transcription": {"model": "whisper-1"},
            },
            "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "v1", "speed": 1.0},
        },
        "tools": [],
        "tool_choice": "auto",
        "capabilities": {"barge_in": True},
    }
    updated = ga(SessionUpdated(session_id="sess_9", config=CONFIG))
    assert updated["type"] == "session.updated"
    assert isinstance(updated["session"], dict)
    assert "capabilities" not in updated["session"]


def test_session_object_beta() -> None:
    config = SessionConfig(
        input_format=fmt(Encoding.G711_ULAW, 8000),
        output_format=fmt(Encoding.G711_ALAW, 8000),
        output_modalities=(Modality.AUDIO, Modality.TEXT),
        turn_detection=None,
    )
    wire = render(
        SessionCreated(session_id="sess_b", config=config, capabilities=(("x", (1, 2)),)), beta=True
    )
    assert wire is not None
    assert wire["session"] == {
        "id": "sess_b",
        "object": "realtime.session",
        "model": None,  # the beta model field admits only OpenAI's model names
        "instructions": "",
        "modalities": ["audio", "text"],
        "voice": "default",
        "speed": 1.0,
        "input_audio_format": "g711_ulaw",
        "output_audio_format": "g711_alaw",
        "input_audio_transcription": None,
        "turn_detection": None,
        "sample_rate_hz": 8000,
        "output_sample_rate_hz": 8000,
        "tools": [],
        "tool_choice": "auto",
        "capabilities": {"x": [1, 2]},
    }


@pytest.mark.parametrize(
    ("audio_format", "ga_object", "beta_name"),
    [
        (fmt(PCM16, 16000), {"type": "audio/pcm", "rate": 16000}, "pcm16"),
        (fmt(Encoding.PCM_F32LE, 48000), {"type": "audio/pcm_f32le", "rate": 48000}, "pcm_f32le"),
        (fmt(Encoding.G711_ULAW, 8000), {"type": "audio/pcmu"}, "g711_ulaw"),
        (fmt(Encoding.G711_ULAW, 16000), {"type": "audio/pcmu", "rate": 16000}, "g711_ulaw"),
        (fmt(Encoding.G711_ALAW, 8000), {"type": "audio/pcma"}, "g711_alaw"),
    ],
)
def test_session_formats(audio_format: AudioFormat, ga_object: dict[str, object], beta_name: str) -> None:
    config = SessionConfig(input_format=audio_format, output_format=audio_format)
    ga_session = session_payload(config, session_id="s", beta=False)
    audio = ga_session["audio"]
    assert isinstance(audio, dict)
    assert audio["input"]["format"] == ga_object
    assert audio["output"]["format"] == ga_object
    beta_session = session_payload(config, session_id="s", beta=True)
    assert beta_session["input_audio_format"] == beta_name
    assert beta_session["output_audio_format"] == beta_name


def test_semantic_vad_renders_in_openai_shape() -> None:
    config = SessionConfig(
        turn_detection=TurnDetection(mode=TurnDetectionMode.SEMANTIC_VAD, create_response=False)
    )
    session = session_payload(config, session_id="s", beta=True)
    assert session["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "auto",
        "create_response": False,
        "interrupt_response": True,
    }


def test_semantic_vad_eagerness_is_echoed_as_sent() -> None:
    # LiveKit's realtime plugin sends eagerness "medium" by default and reads it back.
    patch = patch_of(
        {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "medium"}}}}
    )
    config = SessionConfig().apply(patch)
    for beta in (False, True):
        session = session_payload(config, session_id="s", beta=beta)
        td = session["turn_detection"] if beta else session["audio"]["input"]["turn_detection"]
        assert td["eagerness"] == "medium"


def test_semantic_vad_eagerness_outside_openai_values_is_refused() -> None:
    with pytest.raises(ProtocolError) as err:
        patch_of({"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}})
    assert err.value.code is ErrorCode.INVALID_VALUE
    assert err.value.param is not None and err.value.param.endswith("turn_detection.eagerness")


def test_render_rejects_unknown_event_classes() -> None:
    with pytest.raises(TypeError):
        render(ServerEvent())


# ---------------------------------------------------------------------------
# round trip: what the gateway says about a session, it accepts back


#: The formats OpenAI's models can name: PCM16 only at 24 kHz, G.711 only at 8 kHz. Other
#: rates and float32 are vLLM-Omni extensions a client gets only by asking for them.
_OPENAI_FORMATS = (fmt(PCM16, 24000), fmt(Encoding.G711_ULAW, 8000), fmt(Encoding.G711_ALAW, 8000))


@st.composite
def _configs(draw: st.DrawFn, openai_formats: bool = False) -> SessionConfig:
    def audio_format() -> AudioFormat:
        if openai_formats:
            return draw(st.sampled_from(_OPENAI_FORMATS))
        return AudioFormat(
            encoding=draw(st.sampled_from(list(Encoding))), rate=draw(st.integers(8000, 48000))
        )

    mode = draw(st.sampled_from([None, *TurnDetectionMode]))
    turn_detection: TurnDetection | None = None
    if mode is TurnDetectionMode.SERVER_VAD:
        turn_detection = TurnDetection(
            threshold=draw(st.floats(0.01, 0.99)),
            prefix_padding_ms=draw(st.integers(0, 10_000)),
            silence_duration_ms=draw(st.integers(0, 10_000)),
            create_response=draw(st.booleans()),
            interrupt_response=draw(st.booleans()),
            idle_timeout_ms=draw(st.none() | st.integers(1_000, 600_000)),
        )
    elif mode is TurnDetectionMode.SEMANTIC_VAD:
        turn_detection = TurnDetection(
            mode=mode, create_response=draw(st.booleans()), interrupt_response=draw(st.booleans())
        )
    return SessionConfig(
        model=draw(st.text(min_size=1, max_size=10)),
        instructions=draw(st.text(max_size=20)),
        voice=draw(st.text(min_size=1, max_size=10)),
        output_modalities=tuple(
            draw(st.lists(st.sampled_from(list(Modality)), min_size=1, max_size=2, unique=True))
        ),
        input_format=audio_format(),
        output_format=audio_format(),
        turn_detection=turn_detection,
        input_transcription=draw(
            st.sampled_from(
                [None, InputTranscription(), InputTranscription(model="gpt-4o-transcribe", language="en")]
            )
        ),
        speed=draw(st.floats(0.25, 1.5)),
    )


@settings(max_examples=200, deadline=None)
@given(_configs(), st.booleans())
def test_session_object_round_trips(config: SessionConfig, beta: bool) -> None:
    payload = json.loads(
        json.dumps(session_payload(config, session_id="s", beta=beta, capabilities=(("a", 1),)))
    )
    if beta and payload["model"] is None:  # a name the beta object cannot hold is not echoed
        config = dataclasses.replace(config, model=SessionConfig().model)
    assert SessionConfig().apply(parse_session_patch(payload)) == config
    command = parse({"type": "session.update", "session": payload})
    assert isinstance(command, SessionUpdate)
    assert SessionConfig().apply(command.session) == config


@settings(max_examples=150, deadline=None)
@given(_configs(openai_formats=True), st.booleans(), st.booleans())
def test_session_events_conform_for_any_openai_expressible_config(
    config: SessionConfig, beta: bool, created: bool
) -> None:
    """Whatever a client configured in OpenAI's own terms, strict clients accept our echo."""
    event = (
        SessionCreated(session_id="sess_h", config=config, capabilities=(("barge_in", True),))
        if created
        else SessionUpdated(session_id="sess_h", config=config)
    )
    wire = render(event, beta=beta)
    assert wire is not None
    validate_server_event(wire, beta=beta)


# ---------------------------------------------------------------------------
# purity


_FORBIDDEN = {
    "asyncio",
    "socket",
    "time",
    "selectors",
    "threading",
    "trio",
    "anyio",
    "websockets",
    "starlette",
    "uvicorn",
    "datetime",
    "random",
    "uuid",
    "os",
}


@pytest.mark.parametrize("module", [realtime, realtime_session], ids=lambda m: m.__name__)
def test_dialect_is_pure(module: Any) -> None:
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            imported.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("__import__", "open", "exec", "eval")
    assert not imported & _FORBIDDEN
    assert imported <= {
        "__future__",
        "base64",
        "binascii",
        "json",
        "math",
        "collections",
        "dataclasses",
        "typing",
        "duplex_gateway",
    }


def test_session_created_and_resumed_carry_resume_credentials() -> None:
    created = ga(SessionCreated(session_id="sess_r", config=CONFIG, resume_token="tok"))
    assert (created["session_id"], created["resume_token"]) == ("sess_r", "tok")
    assert created["session"]["id"] == "sess_r"
    resumed = ga(SessionResumed(session_id="sess_r", config=CONFIG, resume_token="tok2"))
    assert resumed["type"] == "session.resumed" and resumed["resume_token"] == "tok2"
    assert "resume_token" not in ga(SessionCreated(session_id="sess_r", config=CONFIG))


def test_resume_events_are_outside_the_numbered_stream_in_vllm_omni_shape() -> None:
    """``session.resumed`` carries no ``server_event_seq``: vLLM-Omni's DuplexClient drops an
    event numbered at or below the last one it saw, and with it the rotated resume_token."""
    dialect = RealtimeDialect(session_id="sess_r", beta=False, duplex=True, max_message_bytes=MAX)
    resumed = json.loads(
        dialect.render_unsequenced(
            SessionResumed(session_id="sess_r", config=CONFIG, resume_token="tok2", attachment_generation=2)
        )
    )
    assert "server_event_seq" not in resumed
    assert {k: resumed[k] for k in ("type", "session_id", "resume_token", "attachment_generation")} == {
        "type": "session.resumed",
        "session_id": "sess_r",
        "resume_token": "tok2",
        "attachment_generation": 2,
    }
    assert resumed["session"]["id"] == "sess_r"
    replaced = json.loads(
        dialect.render_unsequenced(SessionReplaced(session_id="sess_r", attachment_generation=1))
    )
    resync = json.loads(dialect.render_unsequenced(SessionResyncRequired(session_id="sess_r")))
    assert {k: v for k, v in replaced.items() if k != "event_id"} == {
        "type": "session.replaced",
        "session_id": "sess_r",
        "attachment_generation": 1,
    }
    assert {k: v for k, v in resync.items() if k != "event_id"} == {
        "type": "session.resync_required",
        "session_id": "sess_r",
        "reason": "journal_gap",
    }
    # Each still has an event id of its own.
    assert len({resumed["event_id"], replaced["event_id"], resync["event_id"]}) == 3


def test_session_include_asks_for_the_latency_breakdown_and_refuses_unknown_names() -> None:
    assert patch_of({"include": ["turn.latency"]}) == SessionPatch(include=("turn.latency",))
    with pytest.raises(ProtocolError) as refused:
        patch_of({"include": ["everything"]})
    assert refused.value.code is ErrorCode.INVALID_VALUE and refused.value.param == "session.include[0]"
    wire = ga(SessionUpdated(session_id="s", config=SessionConfig(include=("turn.latency",))))
    assert json_at(wire, "session", "include") == ["turn.latency"]


def test_function_items_and_response_options_parse() -> None:
    output = parse(
        {
            "type": "conversation.item.create",
            "previous_item_id": "item_fc",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": '{"temperature": 21}'},
        }
    )
    assert output == ConversationItemCreate(
        item_id=None,
        role="tool",
        text="",
        previous_item_id="item_fc",
        kind="function_call_output",
        call_id="call_1",
        output='{"temperature": 21}',
    )
    call = parse(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "function_call",
                "id": "item_h",
                "call_id": "call_0",
                "name": "lookup",
                "arguments": "{}",
            },
        }
    )
    assert isinstance(call, ConversationItemCreate)
    assert (call.kind, call.item_id, call.call_id, call.name, call.arguments) == (
        "function_call",
        "item_h",
        "call_0",
        "lookup",
        "{}",
    )
    weather = {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    create = parse(
        {
            "type": "response.create",
            "response": {
                "conversation": "none",
                "metadata": {"topic": "x"},
                "tools": [weather],
                "tool_choice": {"type": "function", "name": "get_weather"},
                "max_output_tokens": 200,
                "audio": {"output": {"voice": "marin"}},
                "output_modalities": ["text"],
                "input": [
                    {"type": "item_reference", "id": "item_1"},
                    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                ],
            },
        }
    )
    assert create == ResponseCreate(
        output_modalities=(Modality.TEXT,),
        tools=(
            FunctionTool(
                name="get_weather",
                description="Weather in a city",
                parameters={"type": "object", "properties": {"city": {"type": "string"}}},
            ),
        ),
        tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="get_weather"),
        voice="marin",
        max_output_tokens=200,
        out_of_band=True,
        metadata={"topic": "x"},
        input=(ItemSpec(kind="item_reference", item_id="item_1"), ItemSpec(role="user", text="hi")),
    )
    # The beta spelling of the token limit, and "inf".
    beta = parse(
        {"type": "response.create", "response": {"max_response_output_tokens": "inf", "tool_choice": "none"}}
    )
    assert beta == ResponseCreate(tool_choice=ToolChoice(mode=ToolChoiceMode.NONE))


def test_session_tools_round_trip_in_both_shapes() -> None:
    tools = [
        {"type": "function", "name": "a", "description": "d", "parameters": {"type": "object"}},
        {"type": "function", "function": {"name": "b"}},
    ]  # the chat-completions nesting, tolerated
    patch = patch_of({"tools": tools, "tool_choice": "required"})
    assert patch.tools == (
        FunctionTool(name="a", description="d", parameters={"type": "object"}),
        FunctionTool(name="b"),
    )
    assert patch.tool_choice == ToolChoice(mode=ToolChoiceMode.REQUIRED)
    config = SessionConfig().apply(patch)
    for beta in (False, True):
        wire = render(SessionUpdated(session_id="s", config=config), beta=beta)
        assert wire is not None
        assert json_at(wire, "session", "tools", 1) == {
            "type": "function",
            "name": "b",
            "description": "",
            "parameters": {},
        }
        assert json_at(wire, "session", "tool_choice") == "required"
        validate_server_event(wire, beta=beta)
    with pytest.raises(ProtocolError) as twice:
        patch_of({"tools": [tools[0], tools[0]]})
    assert twice.value.param == "session.tools[1].name"


def test_a_forced_function_is_an_object_for_ga_and_required_for_beta() -> None:
    config = SessionConfig(
        tools=(FunctionTool(name="f"),), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="f")
    )
    for beta, expected in ((False, {"type": "function", "name": "f"}), (True, "required")):
        wire = render(SessionUpdated(session_id="s", config=config), beta=beta)
        assert wire is not None and json_at(wire, "session", "tool_choice") == expected
        validate_server_event(wire, beta=beta)
