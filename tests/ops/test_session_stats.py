"""One session's numbers: barge-in cut-off, chunk gaps, first audio, and the summary line."""

from __future__ import annotations

import pytest

from duplex_gateway.ops.metrics import GatewayMetrics
from duplex_gateway.ops.session_stats import SessionStats, describe
from duplex_gateway.session.machine import ReportLatency
from duplex_gateway.vocabulary import events as ev


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def report(first_audio_ms: float, speech_end_ms: float | None) -> ReportLatency:
    latency = ev.TurnLatency(
        response_id="r", item_id=None, total_ms=speech_end_ms or first_audio_ms, stages=()
    )
    return ReportLatency(latency=latency, first_audio_ms=first_audio_ms, speech_end_ms=speech_end_ms)


def barge_in(stats: SessionStats, response_id: str, now: float) -> None:
    stats.event(ev.ResponseDone(response_id=response_id, status="cancelled", reason="turn_detected"), now)


def test_cutoff_waits_for_the_last_queued_chunk_of_the_cancelled_reply() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=0.0)
    sent = [stats.audio_queued("r1") for _ in range(3)]
    sent[0](1.00)
    stats.event(ev.SpeechStarted(audio_start_ms=0, item_id="i"), 1.05)
    barge_in(stats, "r1", 1.10)
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_count", engine="echo") is None  # still queued
    sent[1](1.12)
    sent[2](1.15)  # the last of it is out 100 ms after the caller started speaking
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_sum", engine="echo") == pytest.approx(0.10)
    assert value(m, "duplex_gateway_barge_ins_total", engine="echo") == 1
    # Gaps between its chunks: 120 ms, then 30 ms.
    assert value(m, "duplex_gateway_output_chunk_gap_seconds_count", engine="echo") == 2
    assert value(m, "duplex_gateway_output_chunk_gap_seconds_sum", engine="echo") == pytest.approx(0.15)
    assert stats.barge_ins == 1 and stats.replies == 1


def test_cutoff_is_zero_when_the_reply_was_all_out_before_the_caller_spoke() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=0.0)
    stats.audio_queued("r1")(1.0)
    stats.event(ev.SpeechStarted(audio_start_ms=0, item_id="i"), 2.0)
    barge_in(stats, "r1", 2.0)
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_count", engine="echo") == 1
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_sum", engine="echo") == 0


def test_a_cancel_by_the_client_is_no_barge_in() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=0.0)
    stats.audio_queued("r1")
    stats.event(ev.ResponseDone(response_id="r1", status="cancelled", reason="client_cancelled"), 1.0)
    assert stats.barge_ins == 0 and value(m, "duplex_gateway_barge_ins_total", engine="echo") is None


def test_the_caller_is_mid_turn_from_speech_start_to_commit() -> None:
    stats = SessionStats(GatewayMetrics(), started_at=0.0)
    stats.event(ev.SpeechStarted(audio_start_ms=0, item_id="i"), 0.0)
    assert stats.caller_speaking
    stats.event(ev.InputAudioCommitted(item_id="i", previous_item_id=None), 1.0)
    assert not stats.caller_speaking and stats.turns == 1


def test_summary_fields_and_sentence() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=10.0)
    stats.admitted(m.labels("realtime"))
    for ms, end in ((200.0, 700.0), (400.0, None), (300.0, 800.0)):
        stats.latency(report(ms, end))
    stats.frame_in("é" * 10)  # 20 bytes of UTF-8
    stats.frame_in(b"\x00" * 5)
    stats.written(100)
    label = stats.ended("server_shutdown", 1001, "realtime")
    stats.released()
    summary = stats.summary(
        now=12.5, session_id="sess_1", reason=label, code=1001, dialect="realtime", engine="echo"
    )
    assert summary["duration_s"] == 2.5 and summary["bytes_in"] == 25 and summary["bytes_out"] == 100
    assert summary["first_audio_ms"] == {"count": 3, "min": 200.0, "median": 300.0, "max": 400.0}
    assert summary["speech_end_to_first_audio_ms"] == {
        "count": 2,
        "min": 700.0,
        "median": 750.0,
        "max": 800.0,
    }
    assert summary["close_reason"] == "server_shutdown" and summary["close_code"] == 1001
    assert (
        value(m, "duplex_gateway_sessions_total", dialect="realtime", engine="echo", reason="server_shutdown")
        == 1
    )
    assert value(m, "duplex_gateway_sessions_active", dialect="realtime", engine="echo") == 0
    assert value(m, "duplex_gateway_first_audio_seconds_count", engine="echo") == 3
    assert value(m, "duplex_gateway_speech_end_to_first_audio_seconds_count", engine="echo") == 2
    text = describe(summary)
    assert text.startswith("session sess_1 ended after 2.5 s") and "200/300/400 ms" in text


def test_a_refused_session_is_counted_under_its_dialect() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=0.0)
    assert stats.ended("session_limit", 1013, "duplex") == "session_limit"
    assert (
        value(m, "duplex_gateway_sessions_total", dialect="duplex", engine="echo", reason="session_limit")
        == 1
    )
    summary = stats.summary(
        now=0.0, session_id="s", reason="session_limit", code=1013, dialect="duplex", engine="e"
    )
    assert summary["first_audio_ms"] is None and "no audio" in describe(summary)


def test_a_barge_in_the_client_declared_counts_from_now_not_from_an_old_turn() -> None:
    m = GatewayMetrics("echo")
    stats = SessionStats(m, started_at=0.0)
    stats.event(ev.SpeechStarted(audio_start_ms=0, item_id="i"), 1.0)  # an earlier turn
    stats.event(ev.InputAudioCommitted(item_id="i", previous_item_id=None), 2.0)
    written = stats.audio_queued("r1")
    barge_in(stats, "r1", 10.0)  # vLLM-Omni's barge_in: no speech start of its own
    written(10.02)
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_sum", engine="echo") == pytest.approx(0.02)
