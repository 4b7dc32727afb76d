"""The demo's latency tracker (``web_demo/lib/latency.js``) in Chromium, on its own.

Semantic VAD reports no ``silence_duration_ms``: the page learns how long the turn model let the
caller's silence run only from the gateway's ``turn.latency`` breakdown, which may come before or
after the reply's first sample plays. Either way the turn's figure must start where the caller
stopped talking, not where the turn ended.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import evaluate_on_page

pytestmark = pytest.mark.e2e

TRACKER = """async () => {
  const { LatencyTracker } = await import('/lib/latency.js');
  const breakdown = {
    total_ms: 900,
    stages: [
      { name: 'turn_detection', ms: 240 },
      { name: 'turn_model', ms: 130 },
      { name: 'recognition', ms: 480 },
      { name: 'speech', ms: 50 },
    ],
  };
  const run = (order, waitKnown) => {
    const done = [];
    const t = new LatencyTracker((turn) => done.push(turn));
    // The turn ended (speech_stopped) at 10.0 s; the page placed its end there.
    t.turnEnded(10.0, 10.0, 'vad', { waitKnown });
    t.responseCreated('r1', 10.01);
    t.firstAudio('r1', 10.5);
    if (order === 'before') t.serverBreakdown('r1', breakdown);
    t.playbackStarted('r1', 10.55);
    if (order === 'after') t.serverBreakdown('r1', breakdown);
    const turn = t.turns[0];
    return { calls: done.length, totalMs: turn.totalMs, parts: turn.parts, median: t.median() };
  };
  // The breakdown before the responseCreated that claims it (kept as unclaimed).
  const early = new LatencyTracker(() => {});
  early.turnEnded(10.0, 10.0, 'vad', { waitKnown: false });
  early.serverBreakdown('r1', breakdown);
  early.responseCreated('r1', 10.01);
  early.playbackStarted('r1', 10.55);
  return {
    before: run('before', false),
    after: run('after', false),
    known: run('after', true),
    unclaimed: early.turns[0].totalMs,
  };
}"""


@pytest.fixture
def echo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start({"limits": {"max_sessions": 1}}, name="echo-latency")


def test_a_semantic_turn_is_measured_from_where_the_caller_stopped(echo: Gateway, tmp_path: Path) -> None:
    result = evaluate_on_page(echo, tmp_path, TRACKER)
    waited_ms = 240 + 130
    for order in ("before", "after"):
        turn = result[order]
        assert turn["calls"] == 1, result
        assert turn["totalMs"] == 550 + waited_ms, result
        assert turn["parts"]["endpointMs"] == waited_ms, result
        assert turn["parts"]["serverMs"] == 500, result
        assert turn["median"] == 550 + waited_ms, result
    assert result["unclaimed"] == 550 + waited_ms, result
    # A turn whose wait the page knew (server VAD) is not moved by the breakdown.
    assert result["known"]["totalMs"] == 550, result
    assert result["known"]["parts"]["endpointMs"] == 0, result
