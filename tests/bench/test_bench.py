"""A seconds-long run of ``duplex-gateway bench``: two callers, the floor and the gateway with ``echo``.

It checks that the bench runs end to end and reports every metric with no
errors; it asserts no timing (the machine is shared).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e

METRICS = (
    "first_audio_ms",
    "chunk_gap_ms",
    "barge_in_cutoff_ms",
    "send_lag_ms",
    "client_loop_lag_ms",
)


def run_bench(tmp_path: Path, levels: dict[str, int], duration_s: int) -> dict[str, Any]:
    """``duplex-gateway bench`` on ``levels`` (target: callers), a report beside its JSON; the results."""
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "duplex_gateway", "bench", "--targets", ",".join(levels)]
    for target, callers in levels.items():
        cmd += ["--levels", f"{target}={callers}"]
    cmd += ["--duration", str(duration_s), "--barge-in", "0.5", "--json", str(out)]
    cmd += ["--report", str(tmp_path / "bench.md"), "--quiet", "--fail-on-errors"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    assert data["skipped"] == {}
    return data


def test_smoke_run_measures_floor_and_gateway(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    data = run_bench(tmp_path, {"floor": 2, "gateway-echo": 2}, 3)
    assert [(r["target"], r["callers"]) for r in data["results"]] == [("floor", 2), ("gateway-echo", 2)]
    for r in data["results"]:
        assert r["connected"] == 2
        assert r["error_count"] == 0, r["errors"]
        assert r["stale_replies"] == 0
        assert r["turns"] >= 2
        assert r["first_audio_ms"]["n"] >= 1
        for name in METRICS:
            assert set(r[name]) == {"n", "p50", "p95", "p99", "max"}
        assert r["server_cpu_s"] >= 0
        assert r["server_rss_mb"] > 0
        assert "rss_per_session_kb" in r
    # CPU time comes in clock ticks (10 ms): the floor's two callers for 3 s may use less than one
    # (CI once read 0.0), the gateway's VAD alone uses several.
    assert data["results"][1]["server_cpu_s"] > 0
    report = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "`gateway-echo` / `floor`" in report

    # The report is written again from the results, with the analysis that explains them.
    analysis = tmp_path / "analysis.md"
    analysis.write_text("## Why a goal is missed\n\nThe profile says so.\n", encoding="utf-8")
    again = tmp_path / "again.md"
    cmd = [
        sys.executable,
        "-m",
        "duplex_gateway",
        "bench",
        "--rerender",
        str(out),
        "--analysis",
        str(analysis),
        "--report",
        str(again),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rewritten = again.read_text(encoding="utf-8")
    goals = rewritten.index("## Goals of the capacity work")
    assert goals < rewritten.index("## Why a goal is missed") < rewritten.index("## Every level")
    assert rewritten.replace("\n## Why a goal is missed\n\nThe profile says so.\n", "") == report


def test_webrtc_callers_are_measured_against_the_websocket(tmp_path: Path) -> None:
    """Two aiortc callers on ``POST /v1/realtime/calls`` and two on the WebSocket, to the same engine."""
    data = run_bench(tmp_path, {"gateway-echo": 2, "gateway-echo-webrtc": 2}, 4)
    webrtc = next(r for r in data["results"] if r["target"] == "gateway-echo-webrtc")
    assert webrtc["connected"] == 2
    assert webrtc["error_count"] == 0, webrtc["errors"]
    assert webrtc["turns"] >= 2
    # Each answered turn's first audio came (output_audio_buffer.started), and the server's CPU was read.
    assert webrtc["first_audio_ms"]["n"] >= 1
    assert webrtc["replies_completed"] + webrtc["replies_cancelled"] >= webrtc["first_audio_ms"]["n"]
    assert webrtc["server_cpu_s"] > 0
    report = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "`gateway-echo-webrtc` / `gateway-echo`" in report


def test_the_state_stores_cost_is_measured_against_the_same_sessions_without_it(tmp_path: Path) -> None:
    """Resumable sessions with and without ``server.state_store``: the bench starts a redis-server for the second."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    data = run_bench(tmp_path, {"gateway-echo-resumable": 2, "gateway-echo-store": 2}, 3)
    assert [r["target"] for r in data["results"]] == ["gateway-echo-resumable", "gateway-echo-store"]
    for r in data["results"]:
        assert r["connected"] == 2
        assert r["error_count"] == 0, r["errors"]
        assert r["first_audio_ms"]["n"] >= 1
    report = (tmp_path / "bench.md").read_text(encoding="utf-8")
    assert "`gateway-echo-store` / `gateway-echo-resumable`" in report
    assert "## The shared state store's cost (issue 26)" in report
