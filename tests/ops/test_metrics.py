"""The metric families: names, labels, values, and one registry per gateway."""

from __future__ import annotations

import subprocess
import sys

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from duplex_gateway.ops.metrics import CLOSE_REASONS, GatewayMetrics, call_name, close_reason
from duplex_gateway.session.machine import AckPlayback, StartResponse


def value(metrics: GatewayMetrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, labels)


def test_session_families_count_by_dialect_engine_and_reason() -> None:
    m = GatewayMetrics("echo")
    labels = m.labels("realtime")
    m.session_admitted(labels)
    m.session_admitted(m.labels("twilio"))
    assert value(m, "duplex_gateway_sessions_active", dialect="realtime", engine="echo") == 1
    m.session_released(labels)
    m.session_ended(labels, "client_closed")
    assert value(m, "duplex_gateway_sessions_active", dialect="realtime", engine="echo") == 0
    assert value(m, "duplex_gateway_sessions_active", dialect="twilio", engine="echo") == 1
    assert (
        value(m, "duplex_gateway_sessions_total", dialect="realtime", engine="echo", reason="client_closed")
        == 1
    )


def test_latency_histograms_are_in_seconds() -> None:
    m = GatewayMetrics("embedded")
    m.first_audio(0.25)
    m.first_audio(0.75)
    m.speech_end_to_first_audio(0.8)
    assert value(m, "duplex_gateway_first_audio_seconds_count", engine="embedded") == 2
    assert value(m, "duplex_gateway_first_audio_seconds_sum", engine="embedded") == pytest.approx(1.0)
    assert value(m, "duplex_gateway_first_audio_seconds_bucket", engine="embedded", le="0.3") == 1
    assert value(m, "duplex_gateway_speech_end_to_first_audio_seconds_count", engine="embedded") == 1
    m.barge_in_cutoff(-0.5)  # the reply was all out before the caller spoke: nothing to cut
    assert value(m, "duplex_gateway_barge_in_cutoff_seconds_sum", engine="embedded") == 0


def test_engine_calls_auth_resumes_and_bytes() -> None:
    m = GatewayMetrics("echo")
    m.engine_call(call_name(StartResponse(response_id="r", instructions=None)), 0.01)
    m.engine_call_failed(call_name(AckPlayback(response_id="r", played_ms=1)), "timeout")
    m.auth_refused("invalid_key")
    m.resume("resumed")
    add_in, add_out = m.byte_counters()
    add_in(100)
    add_out(250)
    assert value(m, "duplex_gateway_engine_call_seconds_count", call="start_response") == 1
    assert value(m, "duplex_gateway_engine_call_errors_total", call="ack_playback", kind="timeout") == 1
    assert value(m, "duplex_gateway_auth_refusals_total", reason="invalid_key") == 1
    assert value(m, "duplex_gateway_resumes_total", outcome="resumed") == 1
    assert value(m, "duplex_gateway_client_bytes_total", direction="in") == 100
    assert value(m, "duplex_gateway_client_bytes_total", direction="out") == 250


def test_gauges_read_at_scrape_time() -> None:
    m = GatewayMetrics()
    open_sessions = [3]
    m.watch_engine_sessions(lambda: open_sessions[0])
    assert value(m, "duplex_gateway_engine_sessions") == 3
    open_sessions[0] = 0
    assert value(m, "duplex_gateway_engine_sessions") == 0
    m.draining(True)
    assert value(m, "duplex_gateway_draining") == 1
    tasks = [12]
    m.watch_tasks(lambda: tasks[0])
    assert value(m, "duplex_gateway_tasks") == 12


def test_each_gateway_has_its_own_registry_and_none_touches_the_global_one() -> None:
    a, b = GatewayMetrics("echo"), GatewayMetrics("echo")
    a.reply_done("completed")
    assert value(a, "duplex_gateway_replies_total", engine="echo", status="completed") == 1
    assert value(b, "duplex_gateway_replies_total", engine="echo", status="completed") is None
    assert (
        REGISTRY.get_sample_value("duplex_gateway_replies_total", {"engine": "echo", "status": "completed"})
        is None
    )


def test_the_exposition_parses_and_names_every_family() -> None:
    m = GatewayMetrics("echo")
    names = {family.name for family in text_string_to_metric_families(m.render().decode())}
    expected = {
        "duplex_gateway_sessions_active",
        "duplex_gateway_sessions",
        "duplex_gateway_replies",
        "duplex_gateway_barge_ins",
        "duplex_gateway_first_audio_seconds",
        "duplex_gateway_speech_end_to_first_audio_seconds",
        "duplex_gateway_barge_in_cutoff_seconds",
        "duplex_gateway_output_chunk_gap_seconds",
        "duplex_gateway_input_backpressure_seconds",
        "duplex_gateway_send_queue_depth",
        "duplex_gateway_client_bytes",
        "duplex_gateway_engine_call_seconds",
        "duplex_gateway_engine_call_errors",
        "duplex_gateway_auth_refusals",
        "duplex_gateway_resumes",
        "duplex_gateway_draining",
        "duplex_gateway_engine_sessions",
        "duplex_gateway_tasks",
    }
    assert expected <= names


@pytest.mark.parametrize(
    ("reason", "code", "label"),
    [
        ("server_shutdown", 1001, "server_shutdown"),
        ("slow consumer", 4002, "slow_consumer"),
        ("call_ended:stop", 1000, "call_ended"),
        ("whatever the client wrote", 1000, "client_closed"),
        ("the engine's own words", 4003, "engine_closed"),
        (None, None, "client_closed"),
        ("odd", 1234, "other"),
    ],
)
def test_close_reasons_fold_into_a_fixed_set(reason: str | None, code: int | None, label: str) -> None:
    assert close_reason(reason, code) == label
    assert label in CLOSE_REASONS | {"other"}


def test_the_sans_io_core_loads_no_metrics() -> None:
    """The session and the dialects stay pure: metrics are the session host's business."""
    code = (
        "import sys\nimport duplex_gateway.session.machine, duplex_gateway.dialects.realtime, duplex_gateway.telephony.dialect\n"
        "print(sorted(m for m in ('prometheus_client', 'duplex_gateway.ops.metrics') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
