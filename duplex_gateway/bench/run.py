"""One side-by-side run: every target, every concurrency level, results as plain data.

Per target the server is started once; per level the callers connect (the
server's RSS is read once all are connected and idle, against its RSS before),
then talk for the level's duration (the server's CPU seconds are read before and
after), then hang up. A progress line on stderr says where the run is.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from duplex_gateway.bench.audio import CallerAudio, load_caller_audio
from duplex_gateway.bench.callers import CallerPlan, CallerStats, SimulatedCaller
from duplex_gateway.bench.metrics import LoopLag, ProcessProbe, summarize
from duplex_gateway.bench.targets import RunningServer, Target, TargetUnavailable, start
from duplex_gateway.bench.webrtc_caller import WebRtcCaller

__all__ = ["RunOptions", "run_all", "run_level"]

#: Time for a server to let go of the previous level's sessions before the next is measured.
_SETTLE_S = 1.0


@dataclass(frozen=True)
class RunOptions:
    """Knobs shared by every target of a run."""

    duration_s: float | None = None  # None: each target's own
    turn_ms: int = 1000
    barge_in: float = 0.2
    audio: str = "speech"
    speech: Path | None = None
    seed: int = 1
    progress: bool = True
    #: The turn-taking part: the first this many sentences of each kind (None: all).
    turn_sentences: int | None = None


class Progress:
    """One status line on stderr, rewritten in place on a terminal, every few seconds otherwise."""

    def __init__(self, enabled: bool, stream: TextIO = sys.stderr) -> None:
        self._enabled = enabled
        self._stream = stream
        self._tty = stream.isatty()
        self._last = 0.0

    def line(self, text: str, *, force: bool = False) -> None:
        """Show ``text`` as the current state."""
        if not self._enabled:
            return
        now = time.monotonic()
        if self._tty:
            self._stream.write("\r\x1b[2K" + text)
            if force:
                self._stream.write("\n")
        elif force or now - self._last >= 5.0:
            self._stream.write(text + "\n")
            self._last = now
        self._stream.flush()

    def note(self, text: str) -> None:
        """A line that stays."""
        if self._enabled:
            self._stream.write(("\r\x1b[2K" if self._tty else "") + text + "\n")
            self._stream.flush()


def _merge(stats: Sequence[CallerStats]) -> CallerStats:
    total = CallerStats()
    for s in stats:
        for name in ("first_audio_ms", "gaps_ms", "cutoff_ms", "send_lag_ms"):
            getattr(total, name).extend(getattr(s, name))
        for name in (
            "frames",
            "late_frames",
            "turns",
            "completed",
            "cancelled",
            "barge_ins",
            "timeouts",
            "stale_replies",
            "stale_bytes",
            "late_cancels",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.errors.update(s.errors)
    return total


async def run_level(
    server: RunningServer,
    audio: CallerAudio,
    callers: int,
    duration_s: float,
    options: RunOptions,
    progress: Progress,
) -> dict[str, Any]:
    """``callers`` callers against ``server`` for ``duration_s``; the level's result."""
    target = server.target
    probe = ProcessProbe(server.proc.pid)
    rng = random.Random(f"{options.seed}:{target.name}:{callers}")
    plan = CallerPlan(
        url=server.ws_url,
        wire=target.wire,
        turn_end=target.turn_end,
        audio=audio,
        turn_ms=options.turn_ms,
        barge_in=options.barge_in,
    )
    lag = LoopLag()
    lag.start()
    rss_before = probe.rss_bytes()
    kind = WebRtcCaller if target.wire == "webrtc" else SimulatedCaller
    group = [kind(plan, rng=random.Random(rng.random())) for _ in range(callers)]
    handshake_errors: Counter[str] = Counter()
    connected: list[SimulatedCaller] = []
    progress.line(f"[bench] {target.name} x{callers}: connecting")
    outcomes = await asyncio.gather(*(c.connect() for c in group), return_exceptions=True)
    for caller, outcome in zip(group, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            handshake_errors[f"connect:{type(outcome).__name__}"] += 1
            await caller.close()
        else:
            connected.append(caller)
    await asyncio.sleep(0.5)
    rss_connected = probe.rss_bytes()
    loop = asyncio.get_running_loop()
    # Turns start spread over one turn's length, as callers who did not dial in together.
    spread_s = options.turn_ms / 1000.0 * 2 if target.turn_end == "commit" else 2.0
    cpu_before, wall_before = probe.cpu_seconds(), loop.time()
    stop_at = wall_before + duration_s
    talks = [
        asyncio.create_task(c.talk(start_in_s=rng.uniform(0, spread_s), stop_at=stop_at)) for c in connected
    ]
    while not all(t.done() for t in talks):
        await asyncio.wait(talks, timeout=0.5)
        turns = sum(c.stats.turns for c in connected)
        errors = sum(sum(c.stats.errors.values()) for c in connected) + sum(handshake_errors.values())
        left = max(0.0, stop_at - loop.time())
        progress.line(
            f"[bench] {target.name} x{callers}: {duration_s - left:4.1f}/{duration_s:.0f} s, "
            f"turns {turns}, errors {errors}"
        )
    wall = loop.time() - wall_before
    cpu = probe.cpu_seconds() - cpu_before
    for caller, task in zip(connected, talks, strict=True):
        exc = task.exception()
        if exc is not None:
            caller.stats.errors[f"caller:{type(exc).__name__}"] += 1
    rss_peak = probe.rss_bytes()
    await asyncio.gather(*(c.close() for c in connected))
    await lag.stop()
    total = _merge([c.stats for c in connected])
    total.errors.update(handshake_errors)
    n = max(1, len(connected))
    result: dict[str, Any] = {
        "target": target.name,
        "callers": callers,
        "connected": len(connected),
        "duration_s": round(wall, 2),
        "turns": total.turns,
        "replies_completed": total.completed,
        "replies_cancelled": total.cancelled,
        "barge_ins": total.barge_ins,
        "turn_timeouts": total.timeouts,
        "first_audio_ms": summarize(total.first_audio_ms),
        "chunk_gap_ms": summarize(total.gaps_ms),
        "barge_in_cutoff_ms": summarize(total.cutoff_ms),
        "stale_replies": total.stale_replies,
        "stale_bytes": total.stale_bytes,
        "late_cancels": total.late_cancels,
        "errors": dict(total.errors),
        "error_count": sum(total.errors.values()),
        "frames": total.frames,
        "late_frames": total.late_frames,
        "send_lag_ms": summarize(total.send_lag_ms),
        "client_loop_lag_ms": summarize(lag.samples_ms),
        "server_cpu_s": round(cpu, 3),
        "server_cpu_per_caller_s": round(cpu / (n * wall), 5) if wall > 0 else None,
        "server_rss_mb": round(rss_peak / 2**20, 1),
        "server_rss_before_mb": round(rss_before / 2**20, 1),
        "rss_per_session_kb": round((rss_connected - rss_before) / 1024 / n, 1),
        "samples": {
            "first_audio_ms": [round(v, 2) for v in total.first_audio_ms],
            "barge_in_cutoff_ms": [round(v, 2) for v in total.cutoff_ms],
        },
    }
    # When the load generator's own loop runs late, its latencies measure the client, not the server.
    # Late frames alone do not say that: a server that reads slowly holds the sender back too.
    lag_p99 = result["client_loop_lag_ms"]["p99"] or 0.0
    result["client_bound"] = bool(lag_p99 > 20.0)
    progress.note(_one_line(result))
    return result


def _one_line(r: dict[str, Any]) -> str:
    fa = r["first_audio_ms"]
    return (
        f"[bench] {r['target']} x{r['callers']}: first audio p50 {fa['p50']} p99 {fa['p99']} ms, "
        f"turns {r['turns']}, errors {r['error_count']}, server CPU {r['server_cpu_s']} s"
        + (", CLIENT-BOUND" if r["client_bound"] else "")
    )


async def run_all(
    targets: Sequence[Target], options: RunOptions, *, turn_taking: bool = False
) -> dict[str, Any]:
    """Every target at every level, then the turn-taking part if asked; what :mod:`duplex_gateway.bench.report` renders."""
    progress = Progress(options.progress)
    results: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    audio_cache: dict[int, CallerAudio] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="duplex-bench-") as tmp:
        for target in targets:
            if target.input_rate not in audio_cache:
                audio_cache[target.input_rate] = load_caller_audio(
                    target.input_rate,
                    kind=options.audio if target.turn_end == "commit" else "speech",
                    path=options.speech,
                )
            audio = audio_cache[target.input_rate]
            duration = options.duration_s or target.duration_s
            progress.line(f"[bench] {target.name}: starting", force=False)
            try:
                # Room for every level at once: a server may hold a closed session for a while (resume).
                with start(target, Path(tmp), max_callers=sum(target.levels)) as server:
                    for callers in target.levels:
                        if not server.alive():
                            raise TargetUnavailable(f"exited during the run:\n{server.log_tail()}")
                        results.append(await run_level(server, audio, callers, duration, options, progress))
                        await asyncio.sleep(_SETTLE_S)
            except TargetUnavailable as exc:
                reason = str(exc).strip()
                skipped[target.name] = reason
                progress.note(f"[bench] {target.name}: skipped: {reason.splitlines()[0]}")
                with contextlib.suppress(Exception):
                    progress.note("\n".join(reason.splitlines()[1:][-10:]))
        turns: dict[str, Any] | None = None
        if turn_taking:
            turns = await _turn_taking(Path(tmp), options, progress, skipped)
    return {
        "targets": [
            {
                "name": t.name,
                "title": t.title,
                "peer": t.peer,
                "turn_end": t.turn_end,
                "wire": t.wire,
                "input_rate": t.input_rate,
                "levels": list(t.levels),
            }
            for t in targets
        ],
        "skipped": skipped,
        "results": results,
        "wall_s": round(time.monotonic() - started, 1),
        "options": {
            "duration_s": options.duration_s,
            "turn_ms": options.turn_ms,
            "barge_in": options.barge_in,
            "audio": options.audio,
            "seed": options.seed,
            "turn_sentences": options.turn_sentences,
        },
        **({"turn_taking": turns} if turns is not None else {}),
    }


async def _turn_taking(
    workdir: Path, options: RunOptions, progress: Progress, skipped: dict[str, str]
) -> dict[str, Any] | None:
    from duplex_gateway.bench import turns

    progress.line(f"[bench] {turns.TURN_TAKING}: starting")
    try:
        data = await turns.measure(workdir, limit=options.turn_sentences, progress=progress.line)
    except TargetUnavailable as exc:
        reason = str(exc).strip()
        skipped[turns.TURN_TAKING] = reason
        progress.note(f"[bench] {turns.TURN_TAKING}: skipped: {reason.splitlines()[0]}")
        return None
    summary = turns.summarize_turns(data)
    for mode, s in summary["modes"].items():
        progress.note(
            f"[bench] {turns.TURN_TAKING} {mode}: paused cut {len(s['paused_cut'])}/{s['paused']}, "
            f"first reply audio p50 {s['first_audio_ms']['p50']} p90 {s['first_audio_ms']['p90']} ms"
        )
    return data
