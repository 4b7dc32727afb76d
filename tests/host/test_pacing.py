"""The pacer: a paced dialect's frames go out when it says they are due, from one loop timer."""

from __future__ import annotations

import asyncio

import pytest

from duplex_gateway.host.pacing import Pacer
from duplex_gateway.vocabulary.commands import Command
from duplex_gateway.vocabulary.frames import Frame


class Playout:
    """A paced dialect holding ``frames``, one due every ``step_s`` from the first pump."""

    def __init__(self, frames: list[str], step_s: float = 0.01) -> None:
        self.frames = frames
        self.step_s = step_s
        self.pumps: list[float] = []
        self.ticks: list[float] = []
        self.fail = False
        self.wants_pump = False

    def pump(self, now: float) -> tuple[list[Frame], float | None]:
        if self.fail:
            raise RuntimeError("a bug")
        self.pumps.append(now)
        if not self.frames:
            return [], None
        return [self.frames.pop(0)], (now + self.step_s if self.frames else None)

    def tick(self, now: float) -> None:
        self.ticks.append(now)

    def take_commands(self) -> list[Command]:
        return []


def _pacer(dialect: Playout, sent: list[Frame], stopped: list[bool], failed: list[bool]) -> Pacer:
    return Pacer(
        dialect,
        send=sent.append,
        stopped=lambda: bool(stopped),
        failed=lambda: failed.append(True),
        name="sess_1",
    )


async def test_frames_go_out_at_the_pace_the_dialect_asks_for() -> None:
    dialect, sent = Playout(["a", "b", "c"], step_s=0.02), list[Frame]()
    pacer = _pacer(dialect, sent, [], [])
    pacer.pump_soon()
    pacer.pump_soon()  # already due: one pump, not two
    await asyncio.sleep(0)
    assert sent == ["a"]
    for _ in range(100):  # two steps of 20 ms, however loaded the machine
        if len(sent) == 3:
            break
        await asyncio.sleep(0.02)
    assert sent == ["a", "b", "c"]
    gaps = [later - earlier for earlier, later in zip(dialect.pumps, dialect.pumps[1:], strict=False)]
    assert all(gap >= 0.019 for gap in gaps)


async def test_the_clock_and_the_commands_pass_through() -> None:
    dialect = Playout([])
    pacer = _pacer(dialect, [], [], [])
    pacer.clock(12.5)
    assert dialect.ticks == [12.5] and list(pacer.take_commands()) == [] and not pacer.wants_pump


async def test_nothing_is_pumped_once_stopped_or_cancelled() -> None:
    dialect, sent, stopped = Playout(["a", "b"]), list[Frame](), [True]
    pacer = _pacer(dialect, sent, stopped, [])
    pacer.pump_soon()
    await asyncio.sleep(0)
    assert sent == [] and dialect.pumps == []
    stopped.clear()
    pacer.pump_soon()
    pacer.cancel()
    await asyncio.sleep(0.05)
    assert sent == []


async def test_a_pump_that_fails_costs_the_session_only(caplog: pytest.LogCaptureFixture) -> None:
    dialect, failed = Playout(["a"]), list[bool]()
    dialect.fail = True
    pacer = _pacer(dialect, [], [], failed)
    pacer.pump_soon()
    await asyncio.sleep(0)
    assert failed == [True]
    assert any("pacing the output of session sess_1 failed" in m for m in caplog.messages)
