"""The bench report's reading of a run: each target's knee, and the goals it meets or misses."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from duplex_gateway.bench.report import knee, knee_text, render

REPO = Path(__file__).resolve().parents[2]


def _result(target: str, callers: int, p99: float, **extra: Any) -> dict[str, Any]:
    """A result as the bench writes one, from the shape of a real run's first."""
    run = json.loads((REPO / "docs" / "benchmarks.json").read_text(encoding="utf-8"))
    result: dict[str, Any] = copy.deepcopy(run["results"][0])
    result.update(target=target, callers=callers, **extra)
    result["first_audio_ms"] = {"n": 10, "p50": p99 / 2, "p95": p99, "p99": p99, "max": p99}
    result["barge_in_cutoff_ms"] = {"n": 4, "p50": 1.0, "p95": 2.0, "p99": 2.0, "max": 2.0}
    return result


def test_the_knee_is_the_first_level_whose_p99_passes_the_limit() -> None:
    results = [
        _result("gateway-echo", 1, 2.0),
        _result("gateway-echo", 150, 142.0),
        _result("gateway-echo", 100, 6.6),
        _result("gateway-echo", 300, 994.0),
        _result("floor", 300, 2.0),
        _result("floor", 1, 1.0),
    ]
    assert knee(results, "gateway-echo") == (100, 150)
    assert knee_text(knee(results, "gateway-echo")) == "between 100 and 150 callers"
    assert knee(results, "floor") == (300, None)
    assert knee_text(knee(results, "floor")) == "beyond 300 callers (the most measured)"
    assert knee([_result("x", 10, 500.0)], "x") == (None, 10)
    assert knee_text(knee(results, "nobody")) == "not measured"


def _run(echo_p99: dict[int, float], floor_cpu: float, echo_cpu: float) -> dict[str, Any]:
    results = []
    for n, p99 in echo_p99.items():
        results.append(_result("floor", n, 2.0, server_cpu_per_caller_s=floor_cpu))
        results.append(_result("gateway-echo", n, p99, server_cpu_per_caller_s=echo_cpu))
    return {
        "targets": [
            {
                "name": "floor",
                "title": "floor",
                "peer": None,
                "turn_end": "commit",
                "wire": "realtime",
                "input_rate": 24000,
                "levels": list(echo_p99),
            },
            {
                "name": "gateway-echo",
                "title": "echo",
                "peer": "floor",
                "turn_end": "commit",
                "wire": "realtime",
                "input_rate": 24000,
                "levels": list(echo_p99),
            },
        ],
        "skipped": {},
        "results": results,
        "wall_s": 1.0,
        "options": {"turn_ms": 1000, "barge_in": 0.4},
        "machine": {},
    }


def _goal_rows(report: str) -> dict[str, str]:
    section = report.split("## Goals of twice the callers per core (issue 25)")[1].split("\n## ")[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return {cells[0].lstrip("| "): cells[-1].rstrip(" |") for cells in rows[1:]}


def test_the_report_says_which_goals_of_issue_25_a_run_meets() -> None:
    missed = render(_run({1: 2.0, 100: 6.6, 150: 142.2, 300: 994.0}, floor_cpu=0.0015, echo_cpu=0.0041))
    assert (
        "| `gateway-echo` | between 100 and 150 callers | 1: 2.0, 100: 6.6, 150: 142.2, 300: 994.0 |"
        in missed
    )
    goals = _goal_rows(missed)
    assert goals["engine echo, 300 callers: first audio p99 ≤ 20 ms"] == "no"
    assert goals["engine echo, 100 callers: CPU per caller ≤ 1.3× the floor"] == "no"
    assert goals["the gateway's knee (first audio p99 past 100 ms) at 300 callers or beyond"] == "no"
    # Nothing of the in-process vllm-omni engine was measured: neither met nor missed.
    assert goals["first audio p50 with engine vllm-omni ≤ 0.8× vLLM-Omni's server, 8 sessions"] == "–"

    met = _goal_rows(render(_run({1: 2.0, 100: 5.0, 300: 12.0}, floor_cpu=0.0015, echo_cpu=0.0018)))
    assert met["engine echo, 300 callers: first audio p99 ≤ 20 ms"] == "yes"
    assert met["engine echo, 300 callers: CPU per caller ≤ 1.3× the floor"] == "yes"
    assert met["the gateway's knee (first audio p99 past 100 ms) at 300 callers or beyond"] == "yes"
    assert (
        met[
            "engine echo, 300 callers: barge-in cut-off p99 ≤ 10 ms, no late frame, no byte after response.done"
        ]
        == "yes"
    )


def test_the_report_says_what_the_state_store_costs() -> None:
    def results(store_cpu: float, store_p99: float) -> dict[str, Any]:
        data = _run({100: 5.0}, floor_cpu=0.0015, echo_cpu=0.0018)
        data["results"] += [
            _result("gateway-echo-resumable", 100, 10.0, server_cpu_per_caller_s=0.0020),
            _result("gateway-echo-store", 100, store_p99, server_cpu_per_caller_s=store_cpu),
        ]
        return data

    def row(report: str) -> str:
        section = report.split("## The shared state store's cost (issue 26)")[1].split("\n## ")[0]
        (line,) = [line for line in section.splitlines() if "100 callers" in line]
        return line

    assert row(render(results(0.0021, 10.5))).endswith("| CPU 1.05×, p99 1.05× | yes |")
    assert row(render(results(0.0030, 10.5))).endswith("| CPU 1.50×, p99 1.05× | no |")
