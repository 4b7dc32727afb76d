"""The bench's turn-taking part without a gateway: the test set as it loads it, the summary, the report.

The measurement itself runs in real time for minutes (``duplex-gateway bench --targets
turn-taking``); here its results are made up, so every number the summary prints is known.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from duplex_gateway.bench import cli, report, turns
from tests.fixtures.turn_set import COMPLETE, PAUSED


def test_the_bench_loads_the_test_set_as_the_tests_know_it() -> None:
    paused, complete = turns.load_turn_set()
    assert [s.name for s in paused] == [t.file.removesuffix(".flac") for t in PAUSED]
    assert [s.name for s in complete] == [t.file.removesuffix(".flac") for t in COMPLETE]
    frame = turns.RATE * turns.FRAME_MS // 1000
    for sentence, turn in zip([*paused, *complete], [*PAUSED, *COMPLETE], strict=True):
        assert abs(sentence.duration_ms - turn.duration_ms) <= 1, sentence.name
        assert len(sentence.frames) == -(-turn.load(turns.RATE).size // frame)  # the last one padded
        if turn.pause_ms is None:
            assert sentence.pause_ms is None
        else:
            # The pause is found in the audio: its digital silence, less the fades' near-zero samples.
            assert sentence.pause_ms is not None
            assert abs(sentence.pause_ms[0] - turn.pause_ms[0]) <= 8, sentence.name
            assert abs(sentence.pause_ms[1] - turn.pause_ms[1]) <= 8, sentence.name
    assert turns.load_turn_set(limit=2)[1] == complete[:2]


def test_a_pause_is_the_longest_digital_silence_of_300_ms_or_more() -> None:
    rng = np.random.default_rng(1)
    voiced = rng.integers(1, 2000, 16_000, dtype=np.int16)
    pcm = voiced.copy()
    pcm[1_600:1_700] = 0  # 6 ms: a zero crossing's length, no pause
    pcm[4_800:12_800] = 0  # 500 ms
    assert turns.find_pause(pcm, 16_000) == (300, 800)
    short = voiced.copy()
    short[4_800:9_000] = 0  # 262 ms
    assert turns.find_pause(short, 16_000) is None
    assert turns.find_pause(voiced, 16_000) is None


def _paused(name: str, *early: int) -> dict[str, Any]:
    return {"sentence": name, "pause_ms": [1000, 1900], "early_stops_ms": list(early), "end_ms": 500}


def _answered(name: str, first: float, wait: float, model: float | None = None) -> dict[str, Any]:
    stages = {"turn_detection": wait, "recognition": 300.0, "speech": 20.0}
    if model is not None:
        stages["turn_model"] = model
    stages["total"] = sum(stages.values()) + 10.0
    return {
        "sentence": name,
        "early_stops": 0,
        "failed": None,
        "judged_ms": int(wait),
        "turn_end_ms": wait + 15.0,
        "first_audio_ms": first,
        "stages": stages,
    }


def _results() -> dict[str, Any]:
    return {
        "target": "turn-taking",
        "title": "t",
        "modes": {mode: dict(td) for mode, td in turns.MODES.items()},
        "lead_ms": 600,
        "input_rate": 24_000,
        "paused": {
            "server_vad": [_paused("p0", 560), _paused("p1", 570), _paused("p2"), _paused("p3", 580, 1200)],
            "semantic_vad": [
                _paused("p0"),
                _paused("p1", 300),
                _paused("p2"),
                {**_paused("p3"), "end_ms": None},
            ],
        },
        "complete": {
            "server_vad": [_answered(f"c{i}", 800.0 + 100 * i, 520.0) for i in range(5)],
            "semantic_vad": [
                _answered("c0", 400.0, 220.0, 60.0),
                _answered("c1", 500.0, 220.0, 80.0),
                _answered("c2", 600.0, 1200.0),  # the words' veto: no judgement ended it
                _answered("c3", 300.0, 210.0, 70.0),
                {"sentence": "c4", "early_stops": 1, "failed": "no reply"},
            ],
        },
        "errors": {"server_vad": {}, "semantic_vad": {"engine_error": 1}},
        "frames": 1000,
        "late_frames": 2,
        "client_loop_lag_ms": {"n": 10, "p50": 1.0, "p95": 2.0, "p99": 3.0, "max": 4.0},
        "wall_s": 12.5,
        "command": "duplex-gateway bench --targets turn-taking",
    }


def test_the_summary_counts_cuts_and_spreads_the_complete_sentences() -> None:
    summary = turns.summarize_turns(_results())
    server, semantic = summary["modes"]["server_vad"], summary["modes"]["semantic_vad"]
    assert server["paused_cut"] == ["p0", "p1", "p3"]
    assert semantic["paused_cut"] == ["p1"]
    assert semantic["paused_unended"] == ["p3"]
    assert server["first_audio_ms"] == {"n": 5, "p50": 1000.0, "p90": 1160.0}
    # The failed sentence is counted, not timed.
    assert semantic["complete_failed"] == {"c4": "no reply"}
    assert semantic["complete_cut"] == ["c4"]
    assert semantic["first_audio_ms"] == {"n": 4, "p50": 450.0, "p90": 570.0}
    assert semantic["wait_ms"] == {"n": 4, "p50": 220.0, "p90": 906.0}
    assert semantic["turn_model_ms"] == {"n": 3, "p50": 70.0, "p90": 78.0}
    assert server["turn_model_ms"] == {"n": 0, "p50": None, "p90": None}
    # After the wait and the judgement: recognition, speech and the 10 ms the stages do not name.
    assert semantic["engine_ms"]["p50"] == 330.0
    assert summary["ratio"] == {"first_audio_p50": 0.45, "first_audio_p90": 0.49}
    goals = {what: (text, ok) for what, text, ok in summary["goals"]}
    assert goals["semantic_vad (auto) cuts no paused sentence in its pause"] == ("1 of 4 cut", False)
    assert goals["complete sentences: first reply audio p50, semantic_vad / server_vad ≤ 0.75"] == (
        "0.45×",
        True,
    )
    assert goals["engine embedded, semantic_vad: first reply audio p50 ≤ 450 ms"] == ("450 ms", True)


def test_goals_with_nothing_measured_say_so() -> None:
    data = _results()
    data["complete"] = {"server_vad": [], "semantic_vad": []}
    data["paused"] = {"server_vad": [], "semantic_vad": []}
    summary = turns.summarize_turns(data)
    assert [(text, ok) for _, text, ok in summary["goals"]] == [("not measured", None)] * 3


def test_the_section_prints_both_modes_the_ratio_and_the_goals() -> None:
    text = "\n".join(report.turn_section(_results()))
    assert text.startswith(report.TURN_HEADING + "\n")
    assert text.count("\n## ") == 0  # one heading: the section ends at the report's next one
    assert "| | `server_vad` (500 ms) | `semantic_vad` (auto) | semantic / server |" in text
    assert "| paused sentences cut | 3 of 4 | 1 of 4 |  |" in text
    assert "| 1000 / 1160 | 450 / 570 | **0.45** / **0.49** |" in text
    assert "| 70 / 78, n 3 |" in text
    assert "`semantic_vad` (auto) cut: p1." in text
    assert "`semantic_vad` (auto), c4: no reply." in text
    assert "**Errors** (semantic_vad): engine_error 1." in text
    assert "| semantic_vad (auto) cuts no paused sentence in its pause | 1 of 4 cut | no |" in text


REPORT = "# Benchmarks\n\nintro\n\n## Goals\n\n| a |\n\n## Plots\n\n![p](p.png)\n\n## Every level\n\nrows\n"


def test_the_section_goes_in_before_the_plots_then_replaces_itself() -> None:
    first = report.replace_turn_section(REPORT, report.turn_section(_results()))
    assert first.index("## Goals") < first.index(report.TURN_HEADING) < first.index("## Plots")
    assert first.replace("\n".join(report.turn_section(_results())) + "\n\n", "") == REPORT
    data = _results()
    data["complete"]["semantic_vad"] = data["complete"]["server_vad"]
    second = report.replace_turn_section(first, report.turn_section(data))
    assert second.count(report.TURN_HEADING) == 1
    assert "| 1000 / 1160 | 1000 / 1160 | **1.00** / **1.00** |" in second
    assert second.replace("\n".join(report.turn_section(data)) + "\n\n", "") == REPORT
    # At the end of a report that has none of the headings it goes before.
    tail = report.replace_turn_section("# Only\n", report.turn_section(data))
    assert tail == "# Only\n\n" + "\n".join(report.turn_section(data)) + "\n"


def test_a_full_report_holds_the_section_and_one_of_the_part_alone_only_it() -> None:
    data = {
        "targets": [],
        "skipped": {},
        "results": [],
        "wall_s": 1.0,
        "options": {"turn_ms": 1000, "barge_in": 0.2},
        "turn_taking": _results(),
    }
    text = report.render(data)
    assert report.TURN_HEADING in text
    assert "## Goals of the capacity work" not in text
    assert "## What is measured" not in text


def _bench(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return cli.main(parser.parse_args(argv), argv)


def test_update_report_rewrites_only_the_turn_taking_section_and_results(tmp_path: Path) -> None:
    earlier = {"results": [{"target": "floor"}], "turn_taking": {"old": True}}
    source = tmp_path / "turns.json"
    source.write_text(json.dumps({"results": [], "turn_taking": _results()}), encoding="utf-8")
    target_json = tmp_path / "bench.json"
    target_json.write_text(json.dumps(earlier), encoding="utf-8")
    md = tmp_path / "bench.md"
    md.write_text(REPORT, encoding="utf-8")
    argv = ["--rerender", str(source), "--update-report", "--report", str(md), "--json", str(target_json)]
    assert _bench(argv) == 0
    assert json.loads(target_json.read_text(encoding="utf-8")) == {
        "results": [{"target": "floor"}],
        "turn_taking": _results(),
    }
    text = md.read_text(encoding="utf-8")
    assert text.replace("\n".join(report.turn_section(_results())) + "\n\n", "") == REPORT
    # With errors in the part, --fail-on-errors says so.
    assert _bench([*argv, "--fail-on-errors"]) == 1


def test_update_report_refuses_a_run_that_measures_more_than_the_part() -> None:
    with pytest.raises(SystemExit, match="--update-report needs --targets turn-taking alone"):
        _bench(["--targets", "floor,turn-taking", "--update-report", "--report", "x.md"])
    with pytest.raises(SystemExit, match="unknown target"):
        _bench(["--targets", "turn-talking"])
