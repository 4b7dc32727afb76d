"""The ``remote`` engine: a pool of duplex backends, driven through the engine port.

The backends are REAL gateway processes with the ``echo`` engine: they speak the
same duplex protocol on ``/v1/realtime?duplex=1`` as vLLM-Omni's own server (the
test against real vLLM-Omni servers is ``tests/omni/test_remote_pool.py``). The
wire translation is tested pure first; then placement, caps, audio, cancel, a
backend killed mid-reply, health, drain, resume, the admin routes and a front
gateway running ``--engine remote``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr

from duplex_gateway.config import ConfigError, load_settings
from duplex_gateway.dialects.realtime_session import parse_session_patch
from duplex_gateway.engine import port
from duplex_gateway.engine.registry import build_engine
from duplex_gateway.engine.remote import BackendKind, BackendSpec, RemoteEngine, RemoteSession
from duplex_gateway.engine.remote.pool import BackendPool, realtime_url
from duplex_gateway.engine.remote.protocol import BackendWire, detect_kind, session_object
from duplex_gateway.vocabulary.formats import AudioFormat
from duplex_gateway.vocabulary.session_config import FunctionTool, SessionConfig, ToolChoice, ToolChoiceMode
from tests.e2e.conftest import (  # noqa: F401 - fixtures, registered by import
    _no_traceback_in_gateway_logs,
)
from tests.e2e.helpers import (
    EventLog,
    Gateway,
    GatewayFactory,
    b64,
    load_speech,
    send_json,
    ws_connect,
)
from tests.typed import narrow

IN_RATE = 16_000
OUT_RATE = 24_000
#: Echo backends: 50 ms reply chunks paced at real time (a reply lasts as long as the turn).
BACKEND_CONFIG: dict[str, Any] = {
    "server": {"web_demo": False},
    "engine": {"echo": {"chunk_ms": 50, "pace": 1.0}},
    "limits": {"resume_grace_s": 5},
}


def speech(seconds: float, rate: int = IN_RATE) -> bytes:
    pcm = load_speech(rate)
    return pcm[: int(seconds * rate) * 2]


# ---------------------------------------------------------------------------------------
# The wire, pure


def wire(kind: BackendKind = BackendKind.GATEWAY) -> BackendWire:
    return BackendWire(kind=kind, input_rate=IN_RATE, output_rate=OUT_RATE)


def audio_delta(response_id: str, pcm: bytes, rate: int = OUT_RATE, **extra: Any) -> dict[str, Any]:
    return {
        "type": "response.output_audio.delta",
        "response_id": response_id,
        "delta": base64.b64encode(pcm).decode(),
        "sample_rate_hz": rate,
        **extra,
    }


def created(response_id: str) -> dict[str, Any]:
    return {"type": "response.created", "response": {"id": response_id, "status": "in_progress"}}


def done(response_id: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "response.done",
        "response_id": response_id,
        "response": {"id": response_id, "status": status},
    }


def test_session_object_is_read_by_a_gateway_as_pcm16_at_the_engine_rates_without_vad() -> None:
    config = SessionConfig(instructions="be brief", voice="alloy")
    patch = parse_session_patch(
        session_object(config, input_rate=IN_RATE, output_rate=OUT_RATE, initial=True)
    )
    assert (
        narrow(patch.input_format, AudioFormat).encoding,
        narrow(patch.input_format, AudioFormat).rate,
    ) == ("pcm16", IN_RATE)
    assert (
        narrow(patch.output_format, AudioFormat).encoding,
        narrow(patch.output_format, AudioFormat).rate,
    ) == ("pcm16", OUT_RATE)
    assert patch.turn_detection is None
    assert patch.instructions == "be brief" and patch.voice == "alloy"


KNOBS = {
    "ref_audio": "data:audio/wav;base64,AAAA",
    "temperature": 0.6,
    "max_output_tokens": 128,
    "overlap_policy": "barge_in",
    "overlap_short_ack_ms": 500,
    "overlap_barge_in_ms": 900,
    "overlap_silence_rms": 0.01,
    "playback_commit_policy": "ack_only",
    "idle_timeout_s": 42.0,
    "input_audio_noise_reduction": {"type": "far_field"},
    "initial_user_text": "hello",
    "use_tts_template": False,
}


def test_every_vllm_omni_session_field_reaches_the_backend_and_extra_body_is_kept() -> None:
    config = SessionConfig().apply(
        parse_session_patch({**KNOBS, "extra_body": {"force_listen_count": 2, "auto_response": True}})
    )
    assert config.auto_response is True  # the client asked for the model's own turn-taking...
    w = wire(BackendKind.VLLM_OMNI)
    opening = w.session_update(config, initial=True)
    assert opening is not None
    session = opening["session"]
    for key, value in KNOBS.items():
        assert session[key] == value, key
    # ...so the backend decides which commits it answers; the model's knobs go as sent.
    assert session["extra_body"] == {"force_listen_count": 2, "auto_response": True}
    plain = wire(BackendKind.VLLM_OMNI).session_update(SessionConfig(), initial=True)
    assert plain is not None and plain["session"]["extra_body"] == {"auto_response": False}


def test_an_update_sends_only_what_changed_and_is_taken_when_the_backend_answers() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    config = SessionConfig(voice="nova", instructions="a")
    w.session_update(config, initial=True)
    w.receive({"type": "session.updated", "session": {}})  # vLLM-Omni's answer to the open
    assert w.session_update(config, initial=False) is None  # nothing changed: nothing to send
    update = w.session_update(replace(config, instructions="b", temperature=0.5), initial=False)
    assert update is not None and update["session"] == {"instructions": "b", "temperature": 0.5}  # no voice
    assert w.take_update_answers() == []
    w.receive({"type": "session.updated", "session": {}})
    assert w.take_update_answers() == [(update["event_id"], None)]
    # A refused update: the backend's error about it is the answer, not an engine error.
    refused = w.session_update(
        replace(config, instructions="b", temperature=0.5, voice="alloy"), initial=False
    )
    assert refused is not None and refused["session"] == {"voice": "alloy"}
    error = {
        "type": "error",
        "error": {
            "code": "voice_update_after_audio_unsupported",
            "message": "no",
            "event_id": refused["event_id"],
        },
    }
    assert w.receive(error) == []
    ((event_id, refusal),) = w.take_update_answers()
    assert event_id == refused["event_id"] and isinstance(refusal, port.EngineRefused)
    assert refusal.code == "voice_update_after_audio_unsupported"
    # The backend kept its voice, so asking for it again is a change again.
    again = w.session_update(replace(config, instructions="b", temperature=0.5, voice="alloy"), initial=False)
    assert again is not None and again["session"] == {"voice": "alloy"}


def test_detect_kind() -> None:
    gateway = {
        "type": "session.created",
        "session": {"capabilities": {"engine": "echo", "input_sample_rate_hz": 1}},
    }
    omni = {"type": "session.created", "session": {"id": "s", "capabilities": {"supports_barge_in": True}}}
    assert detect_kind(gateway) is BackendKind.GATEWAY
    assert detect_kind(omni) is BackendKind.VLLM_OMNI


def test_commit_asks_a_gateway_for_a_response_and_vllm_omni_through_the_commit() -> None:
    types = [e["type"] for e in wire(BackendKind.GATEWAY).commit(item_id="i1", response_id="resp_for_i1")]
    assert types == ["input_audio_buffer.commit", "response.create"]
    (commit,) = wire(BackendKind.VLLM_OMNI).commit(item_id="i1", response_id="resp_for_i1")
    assert commit["type"] == "input_audio_buffer.commit" and commit["response_create"] is True


def test_a_reply_carries_the_gateway_id_and_its_audio_is_resampled() -> None:
    w = wire()
    w.create_response(response_id="resp_gw", instructions=None)
    assert w.receive(created("resp_backend")) == [port.EngineResponseStarted(response_id="resp_gw")]
    same_rate = w.receive(audio_delta("resp_backend", bytes(480)))
    assert same_rate == [port.EngineAudio(response_id="resp_gw", pcm=bytes(480))]
    tone = (np.sin(np.arange(16_000) / 10) * 8000).astype("<i2").tobytes()  # 1 s at 16 kHz
    pcm = b"".join(
        narrow(e, port.EngineAudio).pcm for e in w.receive(audio_delta("resp_backend", tone, rate=16_000))
    )
    events = w.receive(done("resp_backend"))
    pcm += b"".join(e.pcm for e in events if isinstance(e, port.EngineAudio))
    assert abs(len(pcm) // 2 - OUT_RATE) <= 2  # 1 s at 24 kHz once flushed
    assert events[-1] == port.EngineResponseDone(response_id="resp_gw", status="completed")


def test_a_reply_a_commit_asks_for_takes_the_gateway_id() -> None:
    w = wire()
    w.commit(item_id="i1", response_id="resp_for_i1")
    assert w.receive(created("r1")) == [port.EngineResponseStarted(response_id="resp_for_i1")]
    assert w.receive(
        {"type": "response.output_audio_transcript.delta", "response_id": "r1", "delta": "hi"}
    ) == [port.EngineTranscript(response_id="resp_for_i1", delta="hi")]


def test_a_reply_the_backend_starts_by_itself_keeps_its_id() -> None:
    w = wire()
    w.commit(item_id="i1", response_id=None)
    assert w.receive(created("r1")) == [port.EngineResponseStarted(response_id="r1")]


def test_cancelling_a_reply_not_yet_announced_drops_it_and_keeps_later_ids_aligned() -> None:
    w = wire()
    w.create_response(response_id="x", instructions=None)
    (cancel,) = w.cancel_response("x")
    assert cancel["type"] == "response.cancel" and "response_id" not in cancel
    # The backend ends the cancelled reply without announcing it (a gateway does that) ...
    assert w.receive(done("rx", "cancelled")) == []
    w.create_response(response_id="y", instructions=None)
    assert w.receive(created("ry")) == [port.EngineResponseStarted(response_id="y")]
    # ... or announces it anyway: it is dropped, and told to stop.
    w2 = wire()
    w2.create_response(response_id="x", instructions=None)
    w2.cancel_response("x")
    assert w2.receive(created("rx")) == []
    assert [e["type"] for e in w2.take_outgoing()] == ["response.cancel"]
    assert w2.receive(audio_delta("rx", bytes(100))) == [] and w2.receive(done("rx")) == []


def test_cancel_of_a_running_reply_names_the_backend_id_and_fences_its_output() -> None:
    w = wire()
    w.create_response(response_id="g", instructions=None)
    w.receive(created("b"))
    (cancel,) = w.cancel_response("g")
    assert cancel["response_id"] == "b"
    assert w.receive(audio_delta("b", bytes(100))) == [] and w.receive(done("b", "cancelled")) == []


def test_errors_about_a_refused_create_or_a_late_cancel() -> None:
    w = wire()
    (create,) = w.create_response(response_id="g", instructions=None)
    refusal = {
        "type": "error",
        "error": {
            "code": "conversation_already_has_active_response",
            "message": "busy",
            "event_id": create["event_id"],
        },
    }
    assert w.receive(refusal) == [
        port.EngineError(code="conversation_already_has_active_response", message="busy"),
        # The gateway's reply "g" will never start: it ends here, so the session is not left waiting.
        port.EngineResponseDone(
            response_id="g", status="failed", reason="conversation_already_has_active_response"
        ),
    ]
    w.commit(item_id="i", response_id="resp_for_i")
    assert w.receive(created("r2")) == [
        port.EngineResponseStarted(response_id="resp_for_i")
    ]  # not taken for "g"
    (cancel,) = w.cancel_response("resp_for_i")
    late = {
        "type": "error",
        "error": {"code": "response_cancel_not_active", "message": "", "event_id": cancel["event_id"]},
    }
    assert w.receive(late) == []


def test_vllm_omni_gets_unreported_playback_acknowledged_at_the_next_commit_or_response_create() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.commit(item_id="i1", response_id="resp_for_i1")
    w.receive(created("r1"))
    w.receive(audio_delta("r1", bytes(4800), metadata={"audio_duration_ms": 100}))
    w.receive(done("r1"))
    # The caller speaks: nothing is acknowledged yet (the client may still report or truncate),
    # and the audio waits, since vLLM-Omni would take it for talking over the reply.
    assert w.append_audio(bytes(320)) == []
    first, append, commit = w.commit(item_id="i2", response_id="resp_for_i2")
    assert first == {**first, "type": "playback.ack", "response_id": "r1", "played_ms": 100}
    assert (append["type"], commit["type"]) == ("input_audio_buffer.append", "input_audio_buffer.commit")
    w.receive(created("r_i2"))
    w.receive(done("r_i2"))  # a reply without audio: nothing to play, nothing to acknowledge
    # Acknowledged once: a response.create after it sends no second ack.
    assert [e["type"] for e in w.create_response(response_id="resp_x", instructions=None)] == [
        "response.create"
    ]
    # ...and an unreported reply is acknowledged before a response.create too.
    w.receive(created("r2"))
    w.receive(audio_delta("r2", bytes(4800), metadata={"audio_duration_ms": 100}))
    w.receive(done("r2"))
    ack, _ = w.create_response(response_id="resp_y", instructions=None)
    assert ack == {**ack, "type": "playback.ack", "response_id": "r2", "played_ms": 100}
    # A gateway keeps no such ledger.
    g = wire()
    g.commit(item_id="i1", response_id="resp_for_i1")
    g.receive(created("r1"))
    g.receive(audio_delta("r1", bytes(4800)))
    g.receive(done("r1"))
    assert [e["type"] for e in g.commit(item_id="i2", response_id=None)] == ["input_audio_buffer.commit"]


def _types(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


def test_vllm_omni_gets_each_turns_audio_only_once_the_last_reply_is_over_and_before_its_commit() -> None:
    """vLLM-Omni takes input during a reply, or before the reply is reported played, for talking
    over it (quiet chunks dropped, the rest set aside): a turn's audio waits until then, and its
    commit goes right after it."""
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(), initial=True)  # the gateway decides turns
    (append,) = w.append_audio(bytes(320))
    assert append["is_speech"] is True  # turn audio, quiet or not (turn mode drops what it finds quiet)
    (commit,) = w.commit(item_id="i1", response_id="resp_1")
    assert commit["response_create"] is True
    # The next turn starts at once: the reply asked for is not even announced yet.
    turn2 = [w.append_audio(bytes(320)), w.append_audio(bytes(640))]
    assert turn2 == [[], []]
    assert w.input_waiting
    assert w.receive(created("r1")) == [port.EngineResponseStarted(response_id="resp_1")]
    w.receive(audio_delta("r1", bytes(4800), metadata={"audio_duration_ms": 100}))
    assert w.commit(item_id="i2", response_id=None) == []  # behind its audio
    w.add_item(item_id="note", role="user", text="later")  # and what came after it stays after it
    w.receive(done("r1"))
    assert w.take_outgoing() == []  # done, but its playback is not reported yet
    # The client reports it: the turn goes, in order.
    out = w.ack_playback(response_id="resp_1", played_ms=100)
    assert _types(out) == [
        "playback.ack",
        "input_audio_buffer.append",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "conversation.item.create",
    ]
    assert [len(base64.b64decode(e["audio"])) for e in out[1:3]] == [320, 640]
    assert out[3]["response_create"] is False
    assert not w.input_waiting
    # Nothing is asked of the backend now: the next turn goes straight out.
    assert _types(w.append_audio(bytes(320))) == ["input_audio_buffer.append"]


def test_a_reply_the_client_never_reports_is_acknowledged_at_the_commit_before_the_turns_audio() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(), initial=True)
    for turn in range(3):
        # The first turn goes at once; each later one waits for the reply before it to be played.
        audio = w.append_audio(bytes(320))
        out = w.commit(item_id=f"i{turn}", response_id=f"resp_{turn}")
        if turn == 0:
            assert (_types(audio), _types(out)) == (
                ["input_audio_buffer.append"],
                ["input_audio_buffer.commit"],
            )
        else:
            assert audio == []
            assert _types(out) == [
                "playback.ack",
                "input_audio_buffer.append",
                "input_audio_buffer.commit",
            ], turn
            assert out[0]["response_id"] == f"r{turn - 1}"
        w.receive(created(f"r{turn}"))
        w.receive(audio_delta(f"r{turn}", bytes(4800)))
        assert w.receive(done(f"r{turn}"))[-1] == port.EngineResponseDone(
            response_id=f"resp_{turn}", status="completed"
        )
        assert w.take_outgoing() == []


def test_input_held_for_a_reply_goes_when_it_ends_and_a_held_reply_can_be_called_off() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(), initial=True)
    w.commit(item_id="i1", response_id="resp_1")
    w.receive(created("r1"))
    w.append_audio(bytes(320))
    assert w.commit(item_id="i2", response_id="resp_2") == []
    # The client cancels the reply it asked for with the held commit: the backend never hears of it.
    assert w.cancel_response("resp_2") == []
    # The caller barged in: the reply in progress is cancelled; its end frees the turn.
    assert _types(w.cancel_response("resp_1")) == ["response.cancel"]
    assert w.receive(done("r1", status="cancelled")) == []
    released = w.take_outgoing()
    assert _types(released) == ["input_audio_buffer.append", "input_audio_buffer.commit"]
    assert released[1]["response_create"] is False
    # A held response.create that is called off is not sent at all.
    w.commit(item_id="i3", response_id="resp_3")
    assert w.create_response(response_id="resp_4", instructions=None) == []
    assert w.cancel_response("resp_4") == []
    w.receive(created("r3"))
    w.receive(done("r3"))
    assert w.take_outgoing() == []


def test_held_input_can_be_forced_out_and_a_backend_deciding_turns_gets_it_at_once() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(), initial=True)
    w.commit(item_id="i1", response_id="resp_1")
    w.receive(created("r1"))
    w.receive(audio_delta("r1", bytes(4800)))
    w.receive(done("r1"))
    assert w.append_audio(bytes(320)) == []
    # The backend went quiet: the input goes anyway, the reply acknowledged first.
    assert _types(w.release_input()) == ["playback.ack", "input_audio_buffer.append"]
    assert not w.input_waiting
    # auto_response: vLLM-Omni's own turn-taking hears the caller over its reply (as it should).
    auto = wire(BackendKind.VLLM_OMNI)
    auto.session_update(SessionConfig(auto_response=True), initial=True)
    auto.commit(item_id="i1", response_id=None, engine_decides=True)
    auto.receive(created("r1"))
    (append,) = auto.append_audio(bytes(320))
    assert "is_speech" not in append
    # A gateway backend buffers input during a reply as OpenAI does: nothing waits either.
    g = wire()
    g.commit(item_id="i1", response_id="resp_1")
    g.receive(created("r1"))
    assert _types(g.append_audio(bytes(320))) == ["input_audio_buffer.append"]


def test_a_response_create_vllm_omni_refuses_without_naming_it_ends_that_reply() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(), initial=True)
    assert _types(w.create_response(response_id="resp_1", instructions=None)) == ["response.create"]
    refusal = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "code": "response_create_without_input",
            "message": "Duplex response.create requires committed audio to answer.",
        },
    }
    assert w.receive(refusal) == [
        port.EngineError(
            code="response_create_without_input",
            message="Duplex response.create requires committed audio to answer.",
        ),
        port.EngineResponseDone(
            response_id="resp_1", status="failed", reason="response_create_without_input"
        ),
    ]
    # The backend is free again: the caller's next turn is not held behind a reply that never came.
    assert _types(w.append_audio(bytes(320))) == ["input_audio_buffer.append"]


def test_a_truncate_is_vllm_omnis_truncate_of_the_reply_item_and_takes_the_place_of_the_ack() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.commit(item_id="i1", response_id="resp_for_i1")
    w.receive(created("r1"))
    # 200 ms delivered, which the backend's ledger counts as 400 ms (a faster speed).
    w.receive(audio_delta("r1", bytes(9600), metadata={"audio_duration_ms": 400}))
    w.receive(done("r1"))
    truncate, release = w.truncate_reply(response_id="resp_for_i1", audio_end_ms=100)
    assert truncate == {
        **truncate,
        "type": "conversation.item.truncate",
        "item_id": "item_r1",
        "content_index": 0,
        "audio_end_ms": 200,
    }
    # Then the rest is acknowledged, so vLLM-Omni's ledger frees the turn (its history stays cut).
    assert release == {**release, "type": "playback.ack", "response_id": "r1", "played_ms": 400}
    # The reply is accounted for: the next turn carries no full-length ack.
    assert [e["type"] for e in w.commit(item_id="i2", response_id=None)] == ["input_audio_buffer.commit"]
    # A backend error about the truncate concerns a reply the gateway already closed out.
    assert (
        w.receive({"type": "error", "error": {"code": "bad_event", "event_id": truncate["event_id"]}}) == []
    )
    # A gateway backend hears of it as playback.
    g = wire()
    g.commit(item_id="i1", response_id="resp_for_i1")
    g.receive(created("r1"))
    g.receive(audio_delta("r1", bytes(4800)))
    g.receive(done("r1"))
    assert [e["type"] for e in g.truncate_reply(response_id="resp_for_i1", audio_end_ms=50)] == [
        "playback.ack"
    ]


def test_input_transcripts_name_the_gateway_turn() -> None:
    w = wire()
    (refused,) = w.commit(item_id="item_empty", response_id=None)
    error = {"code": "input_audio_buffer_commit_empty", "message": "empty", "event_id": refused["event_id"]}
    assert w.receive({"type": "error", "error": error}) != []  # the client hears of it
    w.commit(item_id="item_gw", response_id=None)
    committed = w.receive({"type": "input_audio_buffer.committed", "item_id": "item_b"})
    assert committed == [port.EngineTurnCommitted(item_id="item_gw")]  # the gateway's own turn
    event = {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": "item_b",
        "transcript": "hi",
    }
    assert w.receive(event) == [port.EngineInputTranscript(item_id="item_gw", text="hi", final=True)]
    # A turn the backend ended by itself keeps the backend's name (the session maps it).
    assert w.receive({"type": "input_audio_buffer.committed", "item_id": "item_own"}) == [
        port.EngineTurnCommitted(item_id="item_own")
    ]
    assert w.receive({**event, "item_id": "item_own"}) == [
        port.EngineInputTranscript(item_id="item_own", text="hi", final=True)
    ]


def test_native_turn_taking_passes_through() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(auto_response=True), initial=True)  # the backend decides turns
    # auto_response: the commit leaves the reply to the backend (no response_create key).
    (commit,) = w.commit(item_id="item_1", response_id=None, engine_decides=True)
    assert commit["type"] == "input_audio_buffer.commit" and commit["final"] is True
    assert "response_create" not in commit
    (segment,) = w.commit(item_id="item_2", response_id=None, final=False)
    assert (segment["final"], segment["response_create"]) == (False, False)
    gateway = wire(BackendKind.GATEWAY)  # a gateway backend reads the same keys
    assert [e["type"] for e in gateway.commit(item_id="item_1", response_id=None, engine_decides=True)] == [
        "input_audio_buffer.commit"
    ]
    assert gateway.commit(item_id="item_2", response_id=None, final=False)[0]["final"] is False
    # The backend's own reply: announced under its id, with the model's decisions.
    assert w.receive({"type": "response.created", "response": {"id": "resp_b"}}) == [
        port.EngineResponseStarted(response_id="resp_b")
    ]
    assert w.receive({"type": "response.speak", "response_id": "resp_b", "item_id": "item_resp_b"}) == [
        port.EngineSpeak(response_id="resp_b")
    ]
    listen = {
        "type": "response.listen",
        "session_id": "s",
        "response": {
            "object": "realtime.response",
            "status": "listening",
            "metadata": {"reason": "silence_or_noise"},
        },
    }
    assert w.receive(listen) == [port.EngineListen(response_id=None, reason="silence_or_noise")]
    overlap = {"type": "overlap.decision", "policy": "listen_only", "action": "listen", "reason": "short_ack"}
    assert w.receive(overlap) == [
        port.EngineOverlapDecision(policy="listen_only", action="listen", reason="short_ack")
    ]
    # The duplex-only client events, in vLLM-Omni's shapes.
    assert [(e["type"], e.get("text")) for e in w.append_text("hello")] == [("input.text.append", "hello")]
    assert [e["type"] for e in w.cancel_input()] == ["input.cancel"]
    (signal,) = w.signal_turn("user_started", {"at_ms": 5})
    assert (signal["type"], signal["event"], signal["payload"]) == (
        "turn.signal",
        "user_started",
        {"at_ms": 5},
    )
    (append,) = w.append_audio(bytes(320), is_speech=False, hints={"rms": 0.0})
    assert (append["is_speech"], append["hints"]) == (False, {"rms": 0.0})
    (plain,) = w.append_audio(bytes(320))
    assert "is_speech" not in plain and "hints" not in plain


def test_pictures_go_to_the_backend_in_vllm_omnis_shapes() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    # A camera frame rides the audio it was taken with, as vLLM-Omni's clients send it.
    (append,) = w.append_audio(bytes(320), video_frames=("/9j/4AAQ",))
    assert (append["type"], append["video_frames"]) == ("input_audio_buffer.append", ["/9j/4AAQ"])
    assert "video_frames" not in w.append_audio(bytes(320))[0]
    url = "data:image/png;base64,iVBORw0K"
    (create,) = w.add_item(item_id="item_1", role="user", text="what is this?", images=(url,))
    assert create["item"]["content"] == [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": url},
    ]
    (picture_only,) = w.add_item(item_id="item_2", role="user", text="", images=(url,))
    assert picture_only["item"]["content"] == [{"type": "input_image", "image_url": url}]


# -- function calling ------------------------------------------------------------------------

WEATHER = FunctionTool(
    name="get_weather",
    description="The weather in a city",
    parameters={"type": "object", "properties": {"city": {"type": "string"}}},
)
WEATHER_WIRE = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def omni_call(response_id: str, call_id: str, name: str, arguments: str) -> list[dict[str, Any]]:
    """vLLM-Omni 0.30's wire for a model's ``function_call.done``: a response of its own.

    As its Realtime translator makes it (``_function_call_done_events``) and its server
    sends it (``to_realtime()``); the ``...arguments.done`` event names no function.
    """
    item_id = f"item_{call_id}"
    item = {
        "id": item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": "completed",
        "name": name,
        "call_id": call_id,
        "arguments": arguments,
    }
    response = {
        "id": response_id,
        "object": "realtime.response",
        "status": "completed",
        "status_details": {"type": "completed", "reason": "completed"},
        "output": [item],
        "metadata": {},
    }
    return [
        {
            "type": "response.created",
            "response": {**response, "status": "in_progress", "output": []},
            "response_id": response_id,
        },
        {"type": "conversation.item.added", "previous_item_id": "item_prev", "item": item},
        {"type": "conversation.item.created", "previous_item_id": "item_prev", "item": item},
        {"type": "response.output_item.added", "response_id": response_id, "output_index": 0, "item": item},
        {
            "type": "response.function_call_arguments.delta",
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "call_id": call_id,
            "delta": arguments,
        },
        {
            "type": "response.function_call_arguments.done",
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "call_id": call_id,
            "arguments": arguments,
        },
        {"type": "response.output_item.done", "response_id": response_id, "output_index": 0, "item": item},
        {"type": "conversation.item.done", "previous_item_id": "item_prev", "item": item},
        {"type": "response.done", "response": response, "response_id": response_id},
    ]


def receive_all(w: BackendWire, events: list[dict[str, Any]]) -> list[port.EngineEvent]:
    return [out for event in events for out in w.receive(event)]


def test_session_tools_go_to_the_backend_and_an_update_that_drops_them_sends_nulls() -> None:
    config = SessionConfig(tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED))
    for kind in BackendKind:
        w = wire(kind)
        opening = w.session_update(config, initial=True)
        assert opening is not None
        # Where vLLM-Omni reads them (it keeps them as extra_body.realtime_tools / _tool_choice).
        assert (
            opening["session"]["tools"] == [WEATHER_WIRE] and opening["session"]["tool_choice"] == "required"
        )
        w.receive({"type": "session.updated", "session": {}})
        forced = replace(config, tool_choice=ToolChoice(mode=ToolChoiceMode.REQUIRED, function="get_weather"))
        update = w.session_update(forced, initial=False)
        assert update is not None
        assert update["session"] == {"tool_choice": {"type": "function", "name": "get_weather"}}
        dropped = w.session_update(replace(forced, tools=()), initial=False)
        assert dropped is not None and dropped["session"] == {"tools": None, "tool_choice": None}
    # A session without tools names none.
    plain = wire(BackendKind.VLLM_OMNI).session_update(SessionConfig(), initial=True)
    assert plain is not None and "tools" not in plain["session"] and "tool_choice" not in plain["session"]


def test_a_call_vllm_omni_wraps_in_a_response_of_its_own_goes_on_the_reply_in_progress() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.session_update(SessionConfig(tools=(WEATHER,)), initial=True)
    w.commit(item_id="i1", response_id="resp_for_i1")
    assert w.receive(created("r1")) == [port.EngineResponseStarted(response_id="resp_for_i1")]
    out = receive_all(w, omni_call("resp_call", "call_1", "get_weather", '{"city":"Oslo"}'))
    assert out == [
        port.EngineFunctionCallDelta(
            response_id="resp_for_i1", call_id="call_1", name="get_weather", delta='{"city":"Oslo"}'
        ),
        port.EngineFunctionCall(
            response_id="resp_for_i1", call_id="call_1", name="get_weather", arguments='{"city":"Oslo"}'
        ),
    ]
    # The reply the call belongs to ends with its own response.done (vLLM-Omni reports no usage).
    assert w.receive(done("r1")) == [port.EngineResponseDone(response_id="resp_for_i1", status="completed")]
    # The client returns the function's output; vLLM-Omni answers it after a response.create.
    (output,) = w.add_function_output(item_id="item_out", call_id="call_1", output='{"temp": 3}')
    assert (output["type"], output["item"]) == (
        "conversation.item.create",
        {"id": "item_out", "type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'},
    )
    assert "previous_item_id" not in output
    # Taking it, vLLM-Omni ends whatever reply is in progress: the next one waits for its announcement.
    assert w.outputs_pending
    item = {"id": "item_out", "type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'}
    assert w.receive({"type": "conversation.item.added", "previous_item_id": None, "item": item}) == []
    assert not w.outputs_pending
    w.create_response(response_id="resp_after", instructions=None)
    assert w.receive(created("r2")) == [port.EngineResponseStarted(response_id="resp_after")]
    assert w.receive(
        {"type": "response.output_audio_transcript.delta", "response_id": "r2", "delta": "3 degrees"}
    ) == [port.EngineTranscript(response_id="resp_after", delta="3 degrees")]


def test_a_call_of_a_cancelled_reply_is_dropped_and_one_with_no_reply_in_progress_is_a_reply() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.commit(item_id="i1", response_id="resp_for_i1")
    w.receive(created("r1"))
    w.cancel_response("resp_for_i1")
    assert receive_all(w, omni_call("resp_call", "call_1", "get_weather", "{}")) == []
    assert w.receive(done("r1", "cancelled")) == []
    # The model's own turn-taking (no reply asked for) answered with a call only.
    w.commit(item_id="i2", response_id=None, engine_decides=True)
    out = receive_all(w, omni_call("resp_own", "call_2", "get_weather", "{}"))
    assert out == [
        port.EngineResponseStarted(response_id="resp_own"),
        port.EngineFunctionCallDelta(
            response_id="resp_own", call_id="call_2", name="get_weather", delta="{}"
        ),
        port.EngineFunctionCall(response_id="resp_own", call_id="call_2", name="get_weather", arguments="{}"),
        port.EngineResponseDone(response_id="resp_own", status="completed", reason="completed"),
    ]


def test_a_response_started_beside_the_reply_that_carries_audio_is_a_reply_of_its_own() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    w.commit(item_id="i1", response_id="resp_for_i1")
    w.receive(created("r1"))
    assert w.receive(created("r_next")) == []  # held: it may be a call's wrapper
    out = w.receive(audio_delta("r_next", bytes(480)))
    assert out == [
        port.EngineResponseStarted(response_id="r_next"),
        port.EngineAudio(response_id="r_next", pcm=bytes(480)),
    ]
    assert w.receive(done("r_next")) == [port.EngineResponseDone(response_id="r_next", status="completed")]


def test_a_gateway_backend_streams_calls_in_the_reply_and_reports_token_usage() -> None:
    w = wire(BackendKind.GATEWAY)
    w.session_update(SessionConfig(tools=(WEATHER,)), initial=True)
    w.create_response(response_id="resp_gw", instructions=None)
    w.receive(created("b1"))
    item = {
        "id": "item_9",
        "type": "function_call",
        "status": "in_progress",
        "call_id": "c1",
        "name": "get_weather",
        "arguments": "",
    }
    out = receive_all(
        w,
        [
            {"type": "response.output_item.added", "response_id": "b1", "output_index": 0, "item": item},
            {
                "type": "response.function_call_arguments.delta",
                "response_id": "b1",
                "item_id": "item_9",
                "call_id": "c1",
                "delta": '{"ci',
            },
            {
                "type": "response.function_call_arguments.delta",
                "response_id": "b1",
                "item_id": "item_9",
                "call_id": "c1",
                "delta": 'ty":"Oslo"}',
            },
            {
                "type": "response.function_call_arguments.done",
                "response_id": "b1",
                "item_id": "item_9",
                "call_id": "c1",
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
            },
            {
                "type": "response.done",
                "response": {
                    "id": "b1",
                    "status": "completed",
                    "usage": {"input_tokens": 12, "output_tokens": 5},
                },
            },
        ],
    )
    assert out == [
        port.EngineFunctionCallDelta(response_id="resp_gw", call_id="c1", name="get_weather", delta='{"ci'),
        port.EngineFunctionCallDelta(
            response_id="resp_gw", call_id="c1", name="get_weather", delta='ty":"Oslo"}'
        ),
        port.EngineFunctionCall(
            response_id="resp_gw", call_id="c1", name="get_weather", arguments='{"city":"Oslo"}'
        ),
        port.EngineResponseDone(response_id="resp_gw", status="completed", input_tokens=12, output_tokens=5),
    ]


def test_a_replayed_call_and_its_output_are_items_the_client_can_delete() -> None:
    w = wire(BackendKind.VLLM_OMNI)
    (call,) = w.add_function_call(
        item_id="item_c", call_id="c1", name="get_weather", arguments="{}", previous_item_id="item_a"
    )
    assert call["item"] == {
        "id": "item_c",
        "type": "function_call",
        "status": "completed",
        "call_id": "c1",
        "name": "get_weather",
        "arguments": "{}",
    }
    assert call["previous_item_id"] == "item_a"
    (sent,) = w.add_function_output(item_id="item_o", call_id="c1", output="ok")
    # Refused (vLLM-Omni knows no such call): the client hears of it, and nothing is waited for.
    refusal = {
        "type": "error",
        "error": {
            "code": "invalid_function_call_output",
            "message": "no such call",
            "event_id": sent["event_id"],
        },
    }
    assert w.receive(refusal) == [
        port.EngineError(code="invalid_function_call_output", message="no such call")
    ]
    assert not w.outputs_pending
    assert [e["item_id"] for i in ("item_c", "item_o") for e in w.delete_item(i)] == ["item_c", "item_o"]
    # A gateway backend has no such continuation to wait for.
    g = wire(BackendKind.GATEWAY)
    g.add_function_output(item_id="item_o", call_id="c1", output="ok")
    assert not g.outputs_pending


def test_a_replys_own_tools_go_to_a_gateway_backend_and_are_refused_for_vllm_omni() -> None:
    config = SessionConfig(tools=(WEATHER,))
    same = port.ResponseOptions(tools=(WEATHER,))
    none = port.ResponseOptions(tools=(WEATHER,), tool_choice=ToolChoice(mode=ToolChoiceMode.NONE))
    g = wire(BackendKind.GATEWAY)
    g.session_update(config, initial=True)
    assert g.reply_refusal(none) is None
    (plain,) = g.create_response(response_id="a", instructions=None, options=same)
    assert "response" not in plain  # the session's tools: nothing to say
    (own,) = g.create_response(response_id="b", instructions=None, options=none)
    assert own["response"] == {"tools": [WEATHER_WIRE], "tool_choice": "none"}
    # vLLM-Omni's response.create refuses tools: the reply cannot be made there.
    v = wire(BackendKind.VLLM_OMNI)
    v.session_update(config, initial=True)
    assert v.reply_refusal(same) is None and v.reply_refusal(None) is None
    refusal = v.reply_refusal(none)
    assert refusal is not None and "session" in refusal


def test_placement_is_least_loaded_then_round_robin() -> None:
    pool = BackendPool([BackendSpec(url=f"ws://h{i}:1", max_sessions=cap) for i, cap in enumerate((2, 2, 4))])
    for b in pool.backends:
        b.record_success()
    order = [pool.place().index for _ in range(8)]
    assert order[:3] == [0, 1, 2]  # a tie at 0 load: round-robin
    assert sorted(order) == [0, 0, 1, 1, 2, 2, 2, 2]  # by load relative to the cap
    with pytest.raises(port.EngineSessionLimit):
        pool.place()
    pool.backends[2].draining = True
    pool.backends[0].mark_down("gone")
    pool.backends[1].mark_down("gone")
    with pytest.raises(port.EngineUnavailable):
        pool.place()


def test_realtime_url() -> None:
    assert realtime_url("ws://h:1") == "ws://h:1/v1/realtime?duplex=1"
    assert realtime_url("wss://h/custom?x=1") == "wss://h/custom?x=1&duplex=1"


def test_config_cli_and_registry() -> None:
    from duplex_gateway.cli import _parser

    args = _parser().parse_args(
        ["serve", "--engine", "remote", "--backend", "ws://a:1", "--backend", "ws://b:2"]
    )
    assert args.backend == ["ws://a:1", "ws://b:2"]
    settings = load_settings(
        None, **{"engine.name": "remote", "engine.remote.backends": [{"url": u} for u in args.backend]}
    )
    engine = build_engine(settings)
    assert isinstance(engine, RemoteEngine)
    assert [(b.url, b.cap, b.spec.health_path) for b in engine.backends] == [
        ("ws://a:1", 4, "/health"),
        ("ws://b:2", 4, "/health"),
    ]
    with pytest.raises(ConfigError, match="engine.remote.backends"):
        build_engine(load_settings(None, **{"engine.name": "remote"}))
    with pytest.raises(ConfigError, match="url"):
        load_settings(None, **{"engine.remote.backends": [{"url": "http://a:1"}]})
    tcp_only = load_settings(
        None, **{"engine.name": "remote", "engine.remote.backends": [{"url": "ws://a:1", "health_path": ""}]}
    )
    assert narrow(build_engine(tcp_only), RemoteEngine).backends[0].spec.health_path is None
    keepalive = build_engine(
        load_settings(
            None,
            **{
                "engine.name": "remote",
                "engine.remote.backends": [{"url": "ws://a:1"}],
                "engine.remote.ping_interval_s": 5,
                "engine.remote.ping_timeout_s": 7,
            },
        )
    )
    assert isinstance(keepalive, RemoteEngine)
    assert (keepalive.options.ping_interval_s, keepalive.options.ping_timeout_s) == (5, 7)
    assert keepalive.unresponsive_after_s == 5.0


def test_the_example_config_loads() -> None:
    settings = load_settings(Path(__file__).resolve().parents[2] / "configs" / "remote-pool.yaml")
    engine = build_engine(settings)
    assert isinstance(engine, RemoteEngine) and len(engine.backends) == 2


# ---------------------------------------------------------------------------------------
# Real backends: echo gateways on loopback


class Events:
    """Reads an engine session's events in the background; tests wait on them."""

    def __init__(self, session: port.EngineSession) -> None:
        self.seen: list[tuple[float, port.EngineEvent]] = []
        self._cond = asyncio.Condition()
        self._task = asyncio.create_task(self._run(session))

    async def _run(self, session: port.EngineSession) -> None:
        async for event in session.events():
            async with self._cond:
                self.seen.append((time.monotonic(), event))
                self._cond.notify_all()

    @property
    def events(self) -> list[port.EngineEvent]:
        return [e for _, e in self.seen]

    def audio(self, response_id: str | None = None) -> bytes:
        return b"".join(
            e.pcm
            for e in self.events
            if isinstance(e, port.EngineAudio) and response_id in (None, e.response_id)
        )

    async def wait(
        self, match: Callable[[port.EngineEvent], bool], timeout: float = 10.0
    ) -> port.EngineEvent:
        try:
            async with asyncio.timeout(timeout), self._cond:
                while True:
                    for _, event in self.seen:
                        if match(event):
                            return event
                    await self._cond.wait()
        except TimeoutError:
            seen = [f"{type(e).__name__}({getattr(e, 'response_id', '')})" for e in self.events[-30:]]
            errors = [e for e in self.events if isinstance(e, port.EngineError | port.EngineClosed)]
            raise AssertionError(f"no matching event within {timeout} s; saw {seen}; {errors}") from None

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def is_(cls: type, **fields: Any) -> Callable[[port.EngineEvent], bool]:
    return lambda e: isinstance(e, cls) and all(getattr(e, k) == v for k, v in fields.items())


async def say(session: port.EngineSession, pcm: bytes, *, respond: bool = True) -> None:
    """Stream a turn (20 ms chunks, as fast as it goes) and commit it."""
    for offset in range(0, len(pcm), 640):
        await session.append_audio(pcm[offset : offset + 640])
    await session.commit(
        item_id=f"item_{time.monotonic_ns()}", response_id=f"resp_{time.monotonic_ns()}" if respond else None
    )


@pytest.fixture
def factory(tmp_path: Path) -> Iterator[GatewayFactory]:
    """Gateway processes for one test (stopped, and their logs checked, after it)."""
    gateways = GatewayFactory(tmp_path)
    yield gateways
    gateways.close()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Gateway]]:
    """Two echo gateways shared by the module's tests (each test closes its sessions)."""
    gateways = GatewayFactory(tmp_path_factory.mktemp("backends"))
    yield [gateways.start(BACKEND_CONFIG, name=f"backend{i}") for i in range(2)]
    gateways.close()


async def health_rounds(engine: RemoteEngine, rounds: int, timeout: float = 10) -> None:
    """Wait until the engine's health loop has probed every backend ``rounds`` more times."""
    finished = asyncio.Event()
    count = 0
    real = engine.check_health

    async def counted() -> None:
        nonlocal count
        await real()
        count += 1
        if count >= rounds:
            finished.set()

    engine.check_health = counted  # type: ignore[method-assign]
    try:
        await asyncio.wait_for(finished.wait(), timeout)
    finally:
        del engine.check_health


@contextlib.asynccontextmanager
async def remote_engine(
    gateways: list[Gateway], caps: tuple[int, ...] = (2, 2), **kw: Any
) -> AsyncIterator[RemoteEngine]:
    specs = [
        BackendSpec(url=g.ws_url, max_sessions=cap, health_path="/readyz")
        for g, cap in zip(gateways, caps, strict=True)
    ]
    # Frequent probes (a dead backend shows at once), patient ones (a busy machine is not a dead backend).
    kw = {"health_interval_s": 0.2, "health_timeout_s": 5.0, **kw}
    engine = RemoteEngine(specs, **kw)
    await engine.start()
    try:
        yield engine
    finally:
        await asyncio.wait_for(engine.shutdown(), 10)


def placed(engine: RemoteEngine) -> list[int]:
    return [b.sessions for b in engine.backends]


async def test_sessions_spread_over_backends_up_to_their_caps(backends: list[Gateway]) -> None:
    async with remote_engine(backends, caps=(2, 2)) as engine:
        assert engine.ready and engine.capabilities.max_sessions == 4
        sessions = [await engine.open_session(f"s{i}", SessionConfig()) for i in range(4)]
        assert placed(engine) == [2, 2] and engine.active_sessions == 4
        assert [narrow(s, RemoteSession).backend.index for s in sessions] == [0, 1, 0, 1]
        assert all(narrow(s, RemoteSession).kind is BackendKind.GATEWAY for s in sessions)
        await asyncio.gather(*(gw.wait_sessions(2) for gw in backends))
        with pytest.raises(port.EngineSessionLimit):
            await engine.open_session("s5", SessionConfig())
        for session in sessions:
            await session.close("done")
        assert placed(engine) == [0, 0] and engine.active_sessions == 0
        await asyncio.gather(*(gw.wait_sessions(0) for gw in backends))


async def test_audio_round_trip_with_the_gateway_response_id(backends: list[Gateway]) -> None:
    async with remote_engine(backends) as engine:
        session = await engine.open_session("s1", SessionConfig())
        events = Events(session)
        pcm = speech(0.6)
        await say(session, pcm, respond=False)
        await session.create_response(response_id="resp_gw_1", instructions=None)
        await events.wait(is_(port.EngineResponseDone, response_id="resp_gw_1"))
        assert [type(e) for e in events.events[:2]] == [port.EngineTurnCommitted, port.EngineResponseStarted]
        assert narrow(events.events[1], port.EngineResponseStarted).response_id == "resp_gw_1"
        kinds = [type(e) for e in events.events]
        assert port.EngineTranscript in kinds
        reply = events.audio("resp_gw_1")
        # The echo of 0.6 s of 16 kHz audio, handed back at 24 kHz: same length, same sound.
        assert abs(len(reply) / 2 / OUT_RATE - 0.6) < 0.03
        sent = np.frombuffer(pcm, "<i2").astype(np.float32)
        back = soxr.resample(np.frombuffer(reply, "<i2").astype(np.float32), OUT_RATE, IN_RATE)
        n = min(len(sent), len(back))
        corr = float(np.corrcoef(sent[:n], back[:n])[0, 1])
        assert corr > 0.9, corr
        # A second turn through the commit path gets an id of the backend's own.
        await say(session, speech(0.2))
        started = await events.wait(
            lambda e: isinstance(e, port.EngineResponseStarted) and e.response_id != "resp_gw_1"
        )
        await events.wait(
            is_(
                port.EngineResponseDone,
                response_id=narrow(started, port.EngineResponseStarted).response_id,
                status="completed",
            )
        )
        await session.close("done")
        await events.wait(is_(port.EngineClosed, reason="done"))
        await events.stop()


async def test_cancel_stops_the_reply_and_the_next_one_works(backends: list[Gateway]) -> None:
    async with remote_engine(backends) as engine:
        session = await engine.open_session("s1", SessionConfig())
        events = Events(session)
        await say(session, speech(2.0), respond=False)
        await session.create_response(response_id="r1", instructions=None)
        await events.wait(is_(port.EngineAudio, response_id="r1"))
        await session.cancel_response("r1")
        cancelled_at = len(events.events)
        # Cancelled before it was announced: nothing of it ever shows.
        await session.create_response(response_id="r2", instructions=None)
        await session.cancel_response("r2")
        await session.create_response(response_id="r3", instructions=None)
        await events.wait(is_(port.EngineResponseDone, response_id="r3", status="completed"), timeout=10)
        after = events.events[cancelled_at:]
        assert not [e for e in after if getattr(e, "response_id", None) in ("r1", "r2")], after
        assert abs(len(events.audio("r3")) / 2 / OUT_RATE - 2.0) < 0.05
        await session.close("done")
        await events.stop()


async def test_a_backend_killed_mid_reply_fails_its_sessions_fast_and_spares_the_others(
    factory: GatewayFactory,
) -> None:
    doomed, survivor = (factory.start(BACKEND_CONFIG, name=f"kill{i}") for i in range(2))
    async with remote_engine([doomed, survivor], caps=(2, 2)) as engine:
        a = await engine.open_session("a", SessionConfig())
        b = await engine.open_session("b", SessionConfig())
        assert [narrow(a, RemoteSession).backend.url, narrow(b, RemoteSession).backend.url] == [
            doomed.ws_url,
            survivor.ws_url,
        ]
        ea, eb = Events(a), Events(b)
        for session in (a, b):
            await say(session, speech(2.0))
        await ea.wait(lambda e: isinstance(e, port.EngineAudio))
        await eb.wait(lambda e: isinstance(e, port.EngineAudio))
        killed_at = time.monotonic()
        doomed.proc.kill()
        fatal = await ea.wait(is_(port.EngineError, fatal=True), timeout=5)
        took = next(t for t, e in ea.seen if e is fatal) - killed_at
        assert took < 1.0, f"the fatal error took {took:.3f} s"
        assert isinstance(ea.events[-1], port.EngineClosed)
        # Health: the dead backend is down at once and stays down; new sessions go to the survivor.
        assert not engine.backends[0].healthy and engine.backends[1].healthy
        assert engine.backends[0].sessions == 0
        c = await engine.open_session("c", SessionConfig())
        assert narrow(c, RemoteSession).backend.url == survivor.ws_url
        await health_rounds(engine, 3)
        assert not engine.backends[0].healthy and engine.ready
        # The survivor's session streamed on, untouched.
        done_b = await eb.wait(lambda e: isinstance(e, port.EngineResponseDone), timeout=10)
        assert narrow(done_b, port.EngineResponseDone).status == "completed"
        assert any(t > killed_at for t, e in eb.seen if isinstance(e, port.EngineAudio))
        assert not [e for e in eb.events if isinstance(e, port.EngineError)]
        assert abs(len(eb.audio()) / 2 / OUT_RATE - 2.0) < 0.05
        await a.close("done")  # after a failure: quick and harmless
        for session in (b, c):
            await session.close("done")
        await ea.stop()
        await eb.stop()


async def test_a_backend_that_hangs_fails_its_sessions_within_health_rounds_not_the_keepalive(
    factory: GatewayFactory,
) -> None:
    """SIGSTOP: the process holds its sockets but answers nothing (no close, no refusal).

    The sockets' own keepalive stays at its 20 s default; the health check's verdict and a
    ping of each session's socket end the hung backend's sessions, not the other's.
    """
    hung, survivor = (factory.start(BACKEND_CONFIG, name=f"hang{i}") for i in range(2))
    async with remote_engine(
        [hung, survivor], caps=(2, 2), health_timeout_s=1.0, unresponsive_after_s=1.0
    ) as engine:
        assert engine.options.ping_interval_s == 20.0
        a = await engine.open_session("a", SessionConfig())
        b = await engine.open_session("b", SessionConfig())
        assert [narrow(a, RemoteSession).backend.url, narrow(b, RemoteSession).backend.url] == [
            hung.ws_url,
            survivor.ws_url,
        ]
        ea, eb = Events(a), Events(b)
        for session in (a, b):
            await say(session, speech(4.0))
        await ea.wait(lambda e: isinstance(e, port.EngineAudio))
        await eb.wait(lambda e: isinstance(e, port.EngineAudio))
        hung.proc.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            fatal = await ea.wait(is_(port.EngineError, fatal=True), timeout=10)
            took = next(t for t, e in ea.seen if e is fatal) - stopped_at
            assert (
                narrow(fatal, port.EngineError).code == "backend_lost"
                and "ping" in narrow(fatal, port.EngineError).message
            ), fatal
            assert isinstance(ea.events[-1], port.EngineClosed)
            # Probe interval + a timed-out probe + a ping unanswered for 1 s, with room for a slow machine.
            assert took < 6.0, f"the fatal error took {took:.2f} s"
            assert not engine.backends[0].healthy and engine.backends[0].sessions == 0
            assert engine.ready  # the survivor takes sessions
            await a.close("done")  # after the failure: quick, it waits for no hung peer
            assert time.monotonic() - stopped_at < 8.0
        finally:
            hung.proc.send_signal(signal.SIGCONT)
        # The survivor's reply streamed on to its end.
        done_b = await eb.wait(lambda e: isinstance(e, port.EngineResponseDone), timeout=10)
        assert narrow(done_b, port.EngineResponseDone).status == "completed"
        assert not [e for e in eb.events if isinstance(e, port.EngineError)]
        assert abs(len(eb.audio()) / 2 / OUT_RATE - 4.0) < 0.05
        # Back after SIGCONT: healthy again, and it takes a session.
        await health_rounds(engine, 2)
        assert engine.backends[0].healthy
        await b.close("done")
        await ea.stop()
        await eb.stop()


async def test_sessions_that_answer_pings_outlive_a_failing_health_path(backends: list[Gateway]) -> None:
    """A health path failing is not proof the backend is gone: a session whose socket answers stays."""
    async with remote_engine(backends, caps=(2, 2)) as engine:
        session = await engine.open_session("s1", SessionConfig())
        backend = engine.backends[narrow(session, RemoteSession).backend.index]
        backend.spec = replace(backend.spec, health_path="/no-such-health-path")
        try:
            await health_rounds(engine, 3)
            assert not backend.healthy and "404" in (backend.last_error or "")
            events = Events(session)
            await say(session, speech(0.3))
            done = await events.wait(lambda e: isinstance(e, port.EngineResponseDone), timeout=10)
            assert narrow(done, port.EngineResponseDone).status == "completed"
            assert not [e for e in events.events if isinstance(e, port.EngineError)]
            await events.stop()
        finally:
            backend.spec = replace(backend.spec, health_path="/readyz")
        await session.close("done")


async def test_drain_keeps_sessions_and_places_new_ones_elsewhere(backends: list[Gateway]) -> None:
    async with remote_engine(backends, caps=(4, 4)) as engine:
        first = await engine.open_session("first", SessionConfig())
        assert narrow(first, RemoteSession).backend.index == 0
        engine.drain(backends[0].ws_url + "/")
        assert engine.snapshot()[0]["draining"] is True and engine.ready
        others = [await engine.open_session(f"s{i}", SessionConfig()) for i in range(2)]
        assert [narrow(s, RemoteSession).backend.index for s in others] == [1, 1]
        # The drained backend's session carries on.
        events = Events(first)
        await say(first, speech(0.3))
        await events.wait(lambda e: isinstance(e, port.EngineResponseDone) and e.status == "completed")
        engine.undrain(backends[0].ws_url)
        again = await engine.open_session("again", SessionConfig())
        assert narrow(again, RemoteSession).backend.index == 0
        with pytest.raises(KeyError):
            engine.drain("ws://127.0.0.1:1")
        # Draining every backend: nothing can be placed.
        for gw in backends:
            engine.drain(gw.ws_url)
        assert not engine.ready
        with pytest.raises(port.EngineUnavailable):
            await engine.open_session("none", SessionConfig())
        for session in (first, again, *others):
            await session.close("done")
        await events.stop()


async def test_a_backend_that_refuses_or_fails_the_open_costs_one_retry(
    backends: list[Gateway], factory: GatewayFactory
) -> None:
    # A server that accepts TCP (so the TCP health probe passes) but closes every connection.
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    broken_url = f"ws://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    specs = [
        BackendSpec(url=broken_url, max_sessions=4, health_path=None),
        BackendSpec(url=backends[1].ws_url, max_sessions=4, health_path="/readyz"),
    ]
    engine = RemoteEngine(specs, health_interval_s=60, unhealthy_after=1)
    await engine.start()
    try:
        assert [b.healthy for b in engine.backends] == [True, True]
        session = await engine.open_session("s1", SessionConfig())
        assert narrow(session, RemoteSession).backend.index == 1
        assert not engine.backends[0].healthy and "cannot connect" in str(engine.backends[0].last_error)
        await session.close("done")
    finally:
        await engine.shutdown()
        server.close()
        await server.wait_closed()

    # A backend full by its own count answers session_limit: the placement moves on.
    small = factory.start({**BACKEND_CONFIG, "limits": {"max_sessions": 1}}, name="small")
    async with remote_engine([small, backends[1]], caps=(4, 4)) as engine:
        s1 = await engine.open_session("s1", SessionConfig())
        s2 = await engine.open_session("s2", SessionConfig())
        s3 = await engine.open_session("s3", SessionConfig())  # tried on "small" first: full there
        assert [narrow(s, RemoteSession).backend.index for s in (s1, s2, s3)] == [0, 1, 1]
        assert placed(engine) == [1, 2] and engine.backends[0].healthy
        await s2.close("done")
        await s3.close("done")
        engine.drain(backends[1].ws_url)
        with pytest.raises(port.EngineSessionLimit):
            await engine.open_session("s4", SessionConfig())
        await s1.close("done")


async def test_no_healthy_backend() -> None:
    from tests.e2e.helpers import free_port

    specs = [BackendSpec(url=f"ws://127.0.0.1:{free_port()}", health_path="/health")]
    engine = RemoteEngine(specs, health_timeout_s=0.5)
    await engine.start()
    try:
        assert not engine.ready
        with pytest.raises(port.EngineUnavailable, match="no healthy backend"):
            await engine.open_session("s", SessionConfig())
    finally:
        await engine.shutdown()


async def test_a_dropped_socket_is_resumed_without_losing_audio(backends: list[Gateway]) -> None:
    async with remote_engine(backends) as engine:
        session = await engine.open_session("s1", SessionConfig())
        assert isinstance(session, RemoteSession) and session.resumable
        events = Events(session)
        await say(session, speech(1.5), respond=False)
        await session.create_response(response_id="r1", instructions=None)
        await events.wait(is_(port.EngineAudio, response_id="r1"))
        old = session._ws
        old.transport.abort()  # the network drops the connection; the backend lives on
        await session.append_audio(speech(0.1))  # held while resuming, sent after
        done = await events.wait(is_(port.EngineResponseDone, response_id="r1"), timeout=10)
        assert narrow(done, port.EngineResponseDone).status == "completed"
        assert session._ws is not old
        assert not [e for e in events.events if isinstance(e, port.EngineError)]
        assert abs(len(events.audio("r1")) / 2 / OUT_RATE - 1.5) < 0.05  # nothing lost, nothing twice
        assert engine.backends[session.backend.index].healthy
        # The session goes on after the resume.
        await say(session, speech(0.3))
        await events.wait(lambda e: isinstance(e, port.EngineResponseDone) and e.response_id != "r1")
        await session.close("done")
        await events.stop()


async def test_quiet_sessions_send_heartbeats(backends: list[Gateway]) -> None:
    async with remote_engine(backends, health_interval_s=0.1, heartbeat_interval_s=0.2) as engine:
        session = await engine.open_session("s1", SessionConfig())
        assert isinstance(session, RemoteSession)
        seq = session._last_seq
        # Nothing else is said on a quiet session: only heartbeats' acknowledgements move it on.
        async with asyncio.timeout(5):
            while session._last_seq < seq + 2:
                await asyncio.sleep(0.05)
        await session.close("done")


async def test_admin_routes(backends: list[Gateway]) -> None:
    from starlette.applications import Starlette

    async with remote_engine(backends) as engine:
        app = Starlette(routes=engine.admin_routes(api_keys=("sekrit",)))
        auth = [("authorization", "Bearer sekrit")]

        status, body = await asgi(app, "GET", "/admin/backends")
        assert status == 401
        status, body = await asgi(app, "GET", "/admin/backends", headers=auth)
        assert status == 200
        assert [(b["url"], b["healthy"], b["draining"], b["sessions"], b["cap"]) for b in body] == [
            (gw.ws_url, True, False, 0, 2) for gw in backends
        ]
        status, body = await asgi(
            app, "POST", "/admin/backends/drain", {"url": backends[0].ws_url}, headers=auth
        )
        assert status == 200 and body["draining"] is True and engine.backends[0].draining
        status, body = await asgi(
            app, "POST", "/admin/backends/undrain", {"url": backends[0].ws_url}, headers=auth
        )
        assert status == 200 and body["draining"] is False
        status, _ = await asgi(app, "POST", "/admin/backends/drain", {"url": "ws://nowhere:1"}, headers=auth)
        assert status == 404
        status, _ = await asgi(app, "POST", "/admin/backends/drain", b"{", headers=auth)
        assert status == 400
        open_app = Starlette(routes=engine.admin_routes())  # no keys configured: open
        assert (await asgi(open_app, "GET", "/admin/backends"))[0] == 200


async def asgi(
    app: Any,
    method: str,
    path: str,
    body: dict[str, Any] | bytes = b"",
    headers: list[tuple[str, str]] | None = None,
) -> tuple[int, Any]:
    """One HTTP request straight through an ASGI app."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in (headers or [])]
        + [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    inbox = [{"type": "http.request", "body": raw, "more_body": False}]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], json.loads(payload) if payload else None


# ---------------------------------------------------------------------------------------
# A front gateway running --engine remote, with a websockets client


async def _client_turn(gw: Gateway, pcm24: bytes) -> tuple[Any, EventLog]:
    ws = await ws_connect(gw, "/v1/realtime", close_timeout=1)
    log = EventLog(ws.recv)
    await log.wait_for("session.created")
    await send_json(ws, {"type": "session.update", "session": {"turn_detection": None}})
    await log.wait_for("session.updated")
    for offset in range(0, len(pcm24), 960 * 5):
        await send_json(
            ws, {"type": "input_audio_buffer.append", "audio": b64(pcm24[offset : offset + 960 * 5])}
        )
    await send_json(ws, {"type": "input_audio_buffer.commit"})
    await send_json(ws, {"type": "response.create"})
    return ws, log


@pytest.fixture
def front(factory: GatewayFactory) -> Iterator[tuple[Gateway, list[Gateway]]]:
    pool = [factory.start(BACKEND_CONFIG, name=f"pool{i}") for i in range(2)]
    config = {
        "server": {"web_demo": False},
        "engine": {"name": "remote", "remote": {"health_path": "/readyz", "health_interval_s": 0.3}},
    }
    args = ["--engine", "remote"] + [arg for gw in pool for arg in ("--backend", gw.ws_url)]
    yield factory.start(config, args=args, name="front"), pool


@pytest.mark.e2e
async def test_front_gateway_spreads_clients_and_survives_a_backend_death(
    front: tuple[Gateway, list[Gateway]],
) -> None:
    gw, pool = front
    assert gw.readyz()["engine"] == "remote"
    pcm = speech(2.0, rate=24_000)
    clients = [await _client_turn(gw, pcm) for _ in range(2)]
    try:
        await asyncio.gather(*(p.wait_sessions(1) for p in pool))  # one client on each backend
        for _, log in clients:
            await log.wait_for("response.output_audio.delta", timeout=10)
        pool[0].proc.kill()
        killed_at = time.monotonic()
        outcomes = []
        for ws, log in clients:
            _, event = await log.wait_for(lambda e: e["type"] in ("error", "response.done"), timeout=10)
            outcomes.append((event["type"], time.monotonic() - killed_at, ws, log))
        failed = [o for o in outcomes if o[0] == "error"]
        finished = [o for o in outcomes if o[0] == "response.done"]
        assert len(failed) == 1 and len(finished) == 1, [(o[0], o[1]) for o in outcomes]
        _, took, ws_failed, log_failed = failed[0]
        assert took < 1.0, f"the client heard of the failure after {took:.3f} s"
        error = next(e for e in log_failed.events if e["type"] == "error")
        assert error["error"]["code"] == "engine_error"
        await asyncio.wait_for(ws_failed.wait_closed(), 5)
        assert ws_failed.close_code == 4003
        _, _, _, log_ok = finished[0]
        done = next(e for e in log_ok.events if e["type"] == "response.done")
        assert done["response"]["status"] == "completed"
        audio = b"".join(
            base64.b64decode(e["delta"]) for e in log_ok.events if e["type"] == "response.output_audio.delta"
        )
        assert abs(len(audio) / 2 / 24_000 - 2.0) < 0.1
        assert gw.readyz()["sessions"] == 1  # the survivor's client, still connected
        # A new client lands on the surviving backend.
        ws3, log3 = await _client_turn(gw, speech(0.3, rate=24_000))
        clients.append((ws3, log3))
        _, done3 = await log3.wait_for("response.done", timeout=10)
        assert done3["response"]["status"] == "completed"
        await pool[1].wait_sessions(2)
    finally:
        for ws, log in clients:
            await log.aclose()
            with contextlib.suppress(Exception):
                await ws.close()
