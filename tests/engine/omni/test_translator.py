"""The vLLM-Omni translator both engines share: server events -> port events, reply audio, the session object.

Each decision taken once for the ``vllm-omni`` and ``remote`` engines (where their
copies had drifted) has a test here, on the translator and on the remote engine's wire.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
import pytest

from duplex_gateway.audio import codec
from duplex_gateway.engine import port
from duplex_gateway.engine.omni.audio import ReplyAudio, decode_audio
from duplex_gateway.engine.omni.events import OmniReply, error_fields, late_report, reply_done, translate
from duplex_gateway.engine.omni.fields import changed_fields
from duplex_gateway.engine.omni.session import engine_session, session_object
from duplex_gateway.engine.remote.protocol import BackendKind, BackendWire
from duplex_gateway.vocabulary.formats import Encoding
from duplex_gateway.vocabulary.session_config import SessionConfig

OUT_RATE = 24_000


def _reply(gateway_id: str = "resp_1") -> OmniReply:
    return OmniReply(gateway_id=gateway_id, audio=ReplyAudio(OUT_RATE))


def _same(item: object) -> str:
    return item if isinstance(item, str) else ""


def _audio(data: bytes, **fields: Any) -> dict[str, Any]:
    return {
        "type": "response.output_audio.delta",
        "response_id": "r1",
        "delta": base64.b64encode(data).decode(),
        **fields,
    }


def _pcm(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    return codec.encode((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), Encoding.PCM16)


# -- audio: decided once -------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["audio/pcm", "pcm16", "pcm", None])
def test_every_pcm16_name_either_engine_took_is_taken_by_both(fmt: str | None) -> None:
    replies = {"r1": _reply()}
    data = _pcm(0.1, OUT_RATE)
    (out,) = translate(_audio(data, format=fmt), replies, caller_item=_same) or []
    assert out == port.EngineAudio(response_id="resp_1", pcm=data)  # already at the rate: passed as is


@pytest.mark.parametrize("fmt", ["g711_ulaw", "audio/pcmu", "g711_alaw", "audio/pcma"])
def test_g711_without_a_rate_is_8_khz(fmt: str) -> None:
    replies = {"r1": _reply()}
    law = Encoding.G711_ULAW if "u" in fmt.split("_")[-1] or fmt.endswith("pcmu") else Encoding.G711_ALAW
    data = codec.encode(np.zeros(800, dtype=np.float32), law)  # 100 ms at 8 kHz
    translate(_audio(data, format=fmt), replies, caller_item=_same)
    reply_done(replies["r1"], {"type": "response.done", "response": {"id": "r1", "status": "completed"}})
    assert replies["r1"].audio.produced_ms == pytest.approx(100.0, abs=1.0)  # not 33 ms (read as 24 kHz)
    samples, rate = decode_audio(data, fmt, None)
    assert (samples.size, rate) == (800, 8_000)


def test_a_chunk_at_another_rate_is_resampled_and_one_in_an_unknown_format_dropped() -> None:
    replies = {"r1": _reply()}
    (out,) = translate(_audio(_pcm(0.1, 16_000), sample_rate_hz=16_000), replies, caller_item=_same) or []
    done = reply_done(replies["r1"], {"type": "response.done", "response": {"id": "r1"}})
    tail = done[0].pcm if isinstance(done[0], port.EngineAudio) else b""
    assert isinstance(out, port.EngineAudio) and (len(out.pcm) + len(tail)) // 2 == 2_400
    assert translate(_audio(b"\0" * 10, format="mp3"), replies, caller_item=_same) == []


def test_the_playback_ledger_is_read_as_vllm_omni_reports_it_cumulatively() -> None:
    """vLLM-Omni's ``audio_duration_ms`` on a chunk counts the reply so far (its session adds
    the earlier chunks): two chunks of 100 ms at speed 0.5 say 200 then 400, not 600."""
    replies = {"r1": _reply()}
    for ledger in (200, 400):
        translate(
            _audio(_pcm(0.1, OUT_RATE), metadata={"audio_duration_ms": ledger}), replies, caller_item=_same
        )
    audio = replies["r1"].audio
    assert (audio.produced_ms, audio.ledger_total(), audio.ledger_played(100)) == (200.0, 400, 200)
    # Without a report, the ledger counts what came.
    plain = {"r1": _reply()}
    translate(_audio(_pcm(0.1, OUT_RATE)), plain, caller_item=_same)
    assert plain["r1"].audio.ledger_total() == 100


def test_the_remote_engine_acknowledges_a_reply_by_vllm_omnis_cumulative_ledger() -> None:
    wire = BackendWire(kind=BackendKind.VLLM_OMNI, input_rate=16_000, output_rate=OUT_RATE)
    wire.commit(item_id="i1", response_id="resp_1")
    wire.receive({"type": "response.created", "response": {"id": "r1"}})
    for ledger in (200, 400):
        wire.receive(_audio(_pcm(0.1, OUT_RATE), metadata={"audio_duration_ms": ledger}))
    wire.receive({"type": "response.done", "response": {"id": "r1", "status": "completed"}})
    (ack,) = wire.ack_playback(response_id="resp_1", played_ms=200)
    assert (ack["type"], ack["played_ms"]) == ("playback.ack", 400)


# -- events: decided once ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cls"),
    [
        ("response.output_audio_transcript.delta", port.EngineTranscript),
        ("response.audio_transcript.delta", port.EngineTranscript),
        ("response.output_text.delta", port.EngineText),
        ("response.text.delta", port.EngineText),
    ],
)
def test_reply_text_under_its_ga_and_beta_names(kind: str, cls: type) -> None:
    replies = {"r1": _reply()}
    assert translate({"type": kind, "response_id": "r1", "delta": "hi"}, replies, caller_item=_same) == [
        cls(response_id="resp_1", delta="hi")
    ]
    replies["r1"].dropped = True  # cancelled: what still comes for it is dropped
    assert translate({"type": kind, "response_id": "r1", "delta": "hi"}, replies, caller_item=_same) == []


def test_the_callers_transcript_deltas_pass_and_an_empty_final_one_does_not() -> None:
    mapped = {"item_b": "item_gw"}

    def caller(item: object) -> str:
        return mapped.get(str(item), str(item))

    delta = {"type": "conversation.item.input_audio_transcription.delta", "item_id": "item_b", "delta": "he"}
    assert translate(delta, {}, caller_item=caller) == [
        port.EngineInputTranscript(item_id="item_gw", text="he")
    ]
    done = {
        "type": "conversation.item.input_audio_transcription.completed",
        "item_id": "item_b",
        "transcript": "",
    }
    assert translate(done, {}, caller_item=caller) == []
    assert translate({**done, "transcript": "hello"}, {}, caller_item=caller) == [
        port.EngineInputTranscript(item_id="item_gw", text="hello", final=True)
    ]


def test_speech_events_are_the_callers_only_where_the_engines_vad_finds_turns() -> None:
    started = {"type": "input_audio_buffer.speech_started", "audio_start_ms": 120, "item_id": "item_1"}
    assert translate(started, {}, caller_item=_same) == []
    assert translate(started, {}, caller_item=_same, engine_vad=True) == [
        port.EngineSpeechStarted(audio_start_ms=120, item_id="item_1")
    ]


def test_listen_speak_and_overlap_decisions() -> None:
    replies = {"r1": _reply()}
    listen = {
        "type": "response.listen",
        "response_id": "r1",
        "response": {"id": "r1", "status": "listening", "metadata": {"reason": "backchannel"}},
    }
    assert translate(listen, replies, caller_item=_same) == [
        port.EngineListen(response_id="resp_1", reason="backchannel")
    ]
    assert translate({"type": "response.speak", "response_id": "r1"}, replies, caller_item=_same) == [
        port.EngineSpeak(response_id="resp_1")
    ]
    overlap = {"type": "overlap.decision", "policy": "barge_in", "action": "yield", "reason": None}
    assert translate(overlap, replies, caller_item=_same) == [
        port.EngineOverlapDecision(policy="barge_in", action="yield", reason=None)
    ]
    assert translate({"type": "response.created"}, replies, caller_item=_same) is None  # the engine's own


def test_a_reply_ends_with_its_status_reason_and_usage() -> None:
    done = {
        "type": "response.done",
        "response": {
            "id": "r1",
            "status": "incomplete",
            "status_details": {"reason": "max_output_tokens"},
            "usage": {"input_tokens": 7, "output_tokens": 9},
        },
    }
    assert reply_done(_reply(), done) == [
        port.EngineResponseDone(
            response_id="resp_1", status="failed", reason="max_output_tokens", input_tokens=7, output_tokens=9
        )
    ]


def test_errors_read_whatever_their_nesting_and_late_reports_are_no_news() -> None:
    nested = {"type": "error", "error": {"code": "bad", "message": "no", "event_id": "e1"}}
    assert error_fields(nested) == ("bad", "no", "e1")
    assert error_fields({"type": "error", "message": "x"}, "engine_error") == ("engine_error", "x", None)
    assert late_report("playback_ack_out_of_range") and late_report("response_not_active")
    assert not late_report("rate_limited")


def test_the_remote_engine_drops_a_cancel_of_a_finished_reply_that_names_no_event() -> None:
    wire = BackendWire(kind=BackendKind.VLLM_OMNI, input_rate=16_000, output_rate=OUT_RATE)
    late = {"type": "error", "error": {"code": "response_not_active", "message": "no active response"}}
    assert wire.receive(late) == []
    other = {"type": "error", "error": {"code": "rate_limited", "message": "slow down"}}
    assert wire.receive(other) == [port.EngineError(code="rate_limited", message="slow down")]


# -- the session object: decided once ------------------------------------------------------


def test_speed_is_always_sent_so_an_update_back_to_normal_speed_says_so() -> None:
    fast, normal = SessionConfig(speed=1.5), SessionConfig()
    for build in (
        lambda c: session_object(c, input_rate=16_000, output_rate=OUT_RATE, initial=False),
        lambda c: engine_session(c, initial=False, detects_turns=False),
    ):
        assert changed_fields(build(fast), build(normal)) == {"speed": 1.0}
    wire = BackendWire(kind=BackendKind.VLLM_OMNI, input_rate=16_000, output_rate=OUT_RATE)
    wire.session_update(fast, initial=True)
    update = wire.session_update(normal, initial=False)
    assert update is not None and update["session"] == {"speed": 1.0}


def test_both_session_objects_carry_the_same_session_fields() -> None:
    config = SessionConfig(instructions="be brief", voice="alloy", auto_response=True)
    wire = session_object(config, input_rate=16_000, output_rate=OUT_RATE, initial=True)
    engine = engine_session(config, initial=True, detects_turns=False)
    for key in ("modalities", "instructions", "speed", "voice", "extra_body", "turn_detection"):
        assert wire[key] == engine[key], key
    assert wire["extra_body"]["auto_response"] is True
