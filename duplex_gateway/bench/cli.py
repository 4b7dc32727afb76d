"""``duplex-gateway bench``: the command line of the side-by-side benchmark."""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from duplex_gateway.bench.run import RunOptions, run_all
from duplex_gateway.bench.targets import Target, default_targets
from duplex_gateway.bench.turns import TURN_TAKING

__all__ = ["add_arguments", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's options."""
    names = ", ".join([*(t.name for t in default_targets()), TURN_TAKING])
    parser.add_argument(
        "--targets",
        help=f"comma-separated targets to run (default: all of {names}; {TURN_TAKING}: server_vad "
        "against semantic_vad on the embedded engine, the turn-taking test set in real time)",
    )
    parser.add_argument(
        "--levels",
        action="append",
        default=[],
        metavar="TARGET=N,N,...",
        help="concurrency levels of one target, e.g. gateway-echo=1,50 (repeatable)",
    )
    parser.add_argument(
        "--duration", type=float, help="seconds of talk per level (default: per target, 8-20 s)"
    )
    parser.add_argument("--turn-ms", type=int, default=1000, help="audio per committed turn (default 1000)")
    parser.add_argument(
        "--barge-in", type=float, default=0.2, help="share of replies interrupted (default 0.2)"
    )
    parser.add_argument(
        "--audio",
        choices=("speech", "tone"),
        default="speech",
        help="what callers say on committed turns (server-VAD turns are always speech)",
    )
    parser.add_argument(
        "--speech", type=Path, help="WAV file the callers speak (default: the test recording)"
    )
    parser.add_argument("--seed", type=int, default=1, help="seed of the callers' random choices")
    parser.add_argument(
        "--turn-sentences",
        type=int,
        metavar="N",
        help=f"{TURN_TAKING}: say only the first N sentences of each kind (default: all 16)",
    )
    parser.add_argument("--json", type=Path, help="write the results as JSON here")
    parser.add_argument(
        "--report", type=Path, help="write the markdown report here (e.g. docs/benchmarks.md)"
    )
    parser.add_argument("--plots", type=Path, help="write the PNG plots into this folder (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="no progress line")
    parser.add_argument(
        "--analysis",
        type=Path,
        help="markdown file included in the report after the goals (why a goal is missed, with the profile)",
    )
    parser.add_argument(
        "--fail-on-errors",
        action="store_true",
        help="exit 1 when any level saw an error (the report marks such levels either way)",
    )
    parser.add_argument(
        "--update-report",
        action="store_true",
        help=f"replace only the {TURN_TAKING} section of the existing --report (and its results in the "
        f"existing --json), keeping the rest: `--targets {TURN_TAKING} --update-report` refreshes it "
        "without rerunning the load benchmark (--plots and --analysis are not used)",
    )
    parser.add_argument(
        "--rerender",
        type=Path,
        metavar="JSON",
        help="measure nothing: write the report (and plots) from the results of an earlier run",
    )


def _targets(args: argparse.Namespace) -> tuple[list[Target], bool]:
    """The load targets chosen, and whether the turn-taking part is."""
    targets = {t.name: t for t in default_targets()}
    for spec in args.levels:
        name, _, levels = spec.partition("=")
        if name not in targets or not levels:
            raise SystemExit(f"duplex-gateway bench: bad --levels {spec!r} (targets: {', '.join(targets)})")
        targets[name] = replace(targets[name], levels=tuple(int(v) for v in levels.split(",")))
    if not args.targets:
        return list(targets.values()), True
    chosen = [n.strip() for n in args.targets.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in targets and n != TURN_TAKING]
    if unknown:
        raise SystemExit(
            f"duplex-gateway bench: unknown target(s) {', '.join(unknown)} "
            f"(targets: {', '.join([*targets, TURN_TAKING])})"
        )
    return [targets[n] for n in chosen if n != TURN_TAKING], TURN_TAKING in chosen


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(args: argparse.Namespace, argv: Sequence[str] | None = None) -> int:
    """Run the bench as ``args`` say; 0 once the results are written (with ``--fail-on-errors``: and error-free)."""
    from duplex_gateway.bench.report import machine, render

    options = RunOptions(
        duration_s=args.duration,
        turn_ms=args.turn_ms,
        barge_in=args.barge_in,
        audio=args.audio,
        speech=args.speech,
        seed=args.seed,
        progress=not args.quiet,
        turn_sentences=args.turn_sentences,
    )
    command = "duplex-gateway bench " + " ".join(
        shlex.quote(a) for a in (argv if argv is not None else sys.argv[2:])
    )
    if args.rerender is not None:
        data = json.loads(args.rerender.read_text(encoding="utf-8"))
    else:
        targets, turn_taking = _targets(args)
        if args.update_report and (targets or not turn_taking):
            raise SystemExit(f"duplex-gateway bench: --update-report needs --targets {TURN_TAKING} alone")
        data = _run(run_all(targets, options, turn_taking=turn_taking))
        data["command"] = command.strip()
        data["machine"] = machine()
        if "turn_taking" in data:
            # Its section may be put into a report of another run: it says its own run.
            data["turn_taking"].update(command=data["command"], machine=data["machine"])
    if args.update_report:
        return _update(args, data)
    plots: list[Path] = []
    if args.plots is not None:
        from duplex_gateway.bench.plots import write_plots

        plots = write_plots(data, args.plots)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    analysis = args.analysis.read_text(encoding="utf-8") if args.analysis is not None else None
    text = render(
        data, plots=plots, relative_to=args.report.parent if args.report else None, analysis=analysis
    )
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text, encoding="utf-8")
    else:
        print(text)
    return 1 if args.fail_on_errors and _errors(data) else 0


def _errors(data: dict[str, Any]) -> bool:
    turns = data.get("turn_taking") or {}
    return any(r["error_count"] for r in data["results"]) or any(
        e for e in (turns.get("errors") or {}).values()
    )


def _update(args: argparse.Namespace, data: dict[str, Any]) -> int:
    """Write ``data``'s turn-taking results into the existing report and JSON; the rest of both stays."""
    from duplex_gateway.bench.report import replace_turn_section, turn_section

    turns = data.get("turn_taking")
    if not turns:
        reason = data.get("skipped", {}).get(TURN_TAKING, "no turn-taking results")
        print(f"duplex-gateway bench: nothing to update: {reason}", file=sys.stderr)
        return 1
    if args.json is not None:
        earlier = json.loads(args.json.read_text(encoding="utf-8")) if args.json.exists() else {}
        earlier["turn_taking"] = turns
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(earlier, indent=1) + "\n", encoding="utf-8")
    section = turn_section(turns)
    if args.report is None:
        print("\n".join(section))
    else:
        earlier_report = args.report.read_text(encoding="utf-8") if args.report.exists() else ""
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(replace_turn_section(earlier_report, section), encoding="utf-8")
    return 1 if args.fail_on_errors and _errors(data) else 0
