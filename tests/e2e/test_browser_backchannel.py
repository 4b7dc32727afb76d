"""The browser demo under semantic VAD: a backchannel over the assistant pauses its reply, which then goes on.

Debian Chromium headless under Playwright (as in :mod:`tests.e2e.test_browser`), against a real
gateway with the embedded engine. The fake microphone loops its own WAV: 1.5 s of silence, one
turn of three sentences from the turn test set (:data:`tests.fixtures.turn_set.COMPLETE`, 6.3 s),
4.5 s of silence (the reply, "You said: ...", about 7 s long, starts in it), "Yeah." from the
overlap test set (:data:`tests.fixtures.overlap_set.BACKCHANNELS`), then 8 s of silence while the
reply plays out. Where a loaded machine makes the reply start late (the backchannel comes before
its audio, or joins the caller's turn), the next pass of the loop tries again.

* Settings › Turn detection offers semantic VAD with its eagerness (shown only for it; the server
  VAD fields only for server VAD); the page asks for it with ``overlap.decision`` in the session's
  ``include`` and adopts what ``session.updated`` says;
* the gateway pauses the reply at the caller's "yeah" (``overlap.decision`` ``pause``) and resumes
  it (``resume``, ``short_ack``): the page shows the assistant "paused, listening" between the
  two and speaking after, marks the reply's bubble as resumed, pauses its playback worklet (which
  plays nothing while paused and keeps what it holds) and plays the whole reply: every sample the
  gateway sent, none twice; the reply completes, it is never cancelled;
* in the page's own JavaScript, without a gateway: the playback worklet's output is the audio it
  was given, in order, with silence where it was paused; a flush ends a pause.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from tests.e2e import test_browser
from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import (
    MIC_RATE,
    WEBSOCKET_DEMO,
    _connect,
    _disconnect,
    chromium_page,
    evaluate_on_page,
    open_settings,
)
from tests.e2e.test_browser_state import record_page
from tests.e2e.test_browser_ui import UiBrowser, _apply
from tests.fixtures.overlap_set import BACKCHANNELS
from tests.fixtures.turn_set import COMPLETE

pytestmark = pytest.mark.e2e

LEAD_S = 1.5
#: The caller's turn: three sentences of the turn test set, 6.3 s; the reply restates them (~7 s).
QUESTION = tuple(
    t for t in COMPLETE if t.file in ("complete_04.flac", "complete_08.flac", "complete_01.flac")
)
BREATH_S = 0.08
#: From the end of the turn to the backchannel. The reply's audio starts 1-4 s after the turn
#: (the turn model's judgement: with eagerness high at most 2 s; recognition; the first
#: synthesized words) and lasts ~7 s: the backchannel comes 0.5-3.5 s into it.
GAP_S = 4.5
#: The rest of the reply, the hold, and its last words played out.
TAIL_S = 8.0
BACKCHANNEL = next(b for b in BACKCHANNELS if b.text == "Yeah." and b.speaker == "piper")
#: A reply played "whole" may differ from what arrived by the resampler's rounding, no more.
PLAYED_TOLERANCE_MS = 5.0


def _backchannel_mic_wav(path: Path) -> Path:
    """The fake microphone's loop: silence, the question, silence, "yeah", silence."""

    def silence(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * MIC_RATE), dtype=np.float32)

    # Breaths too short for a judgement of the turn (200 ms): one turn, one long reply.
    question: list[np.ndarray] = []
    for sentence in QUESTION:
        question += [sentence.load(MIC_RATE), silence(BREATH_S)]
    loop = [silence(LEAD_S), *question, silence(GAP_S), BACKCHANNEL.load(MIC_RATE), silence(TAIL_S)]
    sf.write(path, np.concatenate(loop), MIC_RATE, subtype="PCM_16")
    return path


@dataclass
class BackchannelBrowser(UiBrowser):
    #: Every client event the page sent, audio appends left out.
    sent_events: list[dict[str, Any]] = field(default_factory=list)


#: Runs in the page: every text the assistant's state line showed, in order.
STATE_TEXTS = """() => {
  const el = document.getElementById('assistant-state');
  window.__stateTexts = [el.textContent];
  new MutationObserver(() => window.__stateTexts.push(el.textContent))
    .observe(el, { childList: true, characterData: true, subtree: true });
}"""


@contextlib.contextmanager
def backchannel_browser(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BackchannelBrowser]:
    """A page on ``url`` whose microphone loops :func:`_backchannel_mic_wav`; every frame either way recorded."""
    monkeypatch.setattr(test_browser, "_fake_mic_wav", _backchannel_mic_wav)
    with chromium_page(tmp_path) as page:
        browser = BackchannelBrowser(page)
        record_page(page, browser, browser.sent_events)
        page.goto(url, wait_until="load")
        browser.js(STATE_TEXTS)
        yield browser
    assert browser.errors == [], browser.errors


@pytest.fixture
def embedded(gateway_factory: GatewayFactory) -> Gateway:
    # The gateway's default backchannel rule (session.backchannels: policy auto) holds replies under semantic_vad.
    return gateway_factory.start(
        {"engine": {"name": "embedded"}, "limits": {"max_sessions": 2}}, name="embedded-backchannel"
    )


def _choose_semantic_vad(page: Any) -> None:
    """Settings › Turn detection: each mode shows its own fields; semantic VAD, eagerness high."""
    open_settings(page)
    assert page.locator("#eagerness-field").is_hidden()
    assert page.locator("#threshold").is_visible() and page.locator("#silence").is_visible()
    page.select_option("#turn", "semantic_vad")
    assert page.locator("#eagerness-field").is_visible()
    assert page.locator("#eagerness").input_value() == "auto"
    assert page.locator("#threshold-field").is_hidden() and page.locator("#silence-field").is_hidden()
    page.select_option("#turn", "server_vad")
    assert page.locator("#eagerness-field").is_hidden() and page.locator("#threshold").is_enabled()
    page.select_option("#turn", "semantic_vad")
    # High: the longest wait for a turn the model is unsure of is 2 s, so the reply starts in the gap.
    page.select_option("#eagerness", "high")


def _wait_resumed_reply(browser: UiBrowser, timeout_s: float) -> dict[str, Any]:
    """The first reply the gateway paused as it played and then resumed, once it has played to its end.

    A pass of the loop where the reply started late (the backchannel came before its audio, or
    joined the caller's turn) does not count: the next pass tries again.
    """
    found = """window.__demo.replies().find((r) =>
      r.decisions.some((d) => d.action === 'pause' && d.playing)
      && r.decisions.some((d) => d.action === 'resume') && r.playedMs !== null && r.status)"""
    browser.wait(
        f"({found}) !== undefined", timeout_s, "a reply paused as it played, resumed, played to its end"
    )
    return browser.js(found)  # type: ignore[no-any-return]


def _timeline(browser: UiBrowser) -> list[str]:
    """The page's received events, audio and transcripts left out, with when they came (ms): for failures."""
    skip = ("delta", "audio_transcript")
    return [
        f"{e['t']} {e['type']}"
        for e in browser.js("window.__demo.events")
        if not any(k in e["type"] for k in skip)
    ]


def test_backchannel_pauses_the_reply_and_it_resumes_whole(
    embedded: Gateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with backchannel_browser(tmp_path, embedded.base_url + WEBSOCKET_DEMO, monkeypatch) as browser:
        page = browser.page
        sent = browser.sent_events
        _choose_semantic_vad(page)
        _apply(browser, "Used when you connect")
        _connect(browser)
        browser.wait(
            "window.__demo.events.some(e => e.type === 'session.updated')", 10, "the first session.updated"
        )

        # Asked for, with the overlap events; and what the gateway reports is what the page shows.
        update = next(e for e in sent if e.get("type") == "session.update")
        assert update["session"]["audio"]["input"]["turn_detection"] == {
            "type": "semantic_vad",
            "eagerness": "high",
            "create_response": True,
            "interrupt_response": True,
        }
        assert update["session"]["include"] == ["turn.latency", "overlap.decision"]
        adopted = browser.events("session.updated")[-1]["session"]
        assert adopted["audio"]["input"]["turn_detection"]["type"] == "semantic_vad", adopted
        assert adopted["audio"]["input"]["turn_detection"]["eagerness"] == "high", adopted
        assert "overlap.decision" in adopted["include"], adopted
        browser.wait(
            "document.getElementById('session-info').textContent.includes('semantic VAD (high)')",
            5,
            "the session line naming semantic VAD",
        )

        reply = _wait_resumed_reply(browser, 60)
        response_id = reply["responseId"]

        # The gateway's account: paused for the caller's speech, resumed as a backchannel, completed.
        decisions = [e for e in browser.events("overlap.decision") if e.get("response_id") == response_id]
        actions = [(d["action"], d["reason"]) for d in decisions]
        assert actions[:2] == [("pause", "overlap_speech"), ("resume", "short_ack")], decisions
        done = [e for e in browser.events("response.done") if e["response"]["id"] == response_id]
        assert [d["response"]["status"] for d in done] == ["completed"], done
        assert reply["status"] == "completed"

        # The page showed it: paused between the two decisions, speaking again after the resume.
        pause_t = next(d["t"] for d in reply["decisions"] if d["action"] == "pause")
        resume_t = next(d["t"] for d in reply["decisions"] if d["action"] == "resume")
        states = browser.js("window.__demo.assistantStates")
        during = [s for s in states if pause_t <= s["t"] <= resume_t]
        assert during and during[0]["state"] == "paused", (pause_t, resume_t, states)
        after = [s["state"] for s in states if s["t"] >= resume_t]
        assert after and after[0] == "speaking", (resume_t, states, _timeline(browser))
        texts = browser.js("window.__stateTexts")
        shown = texts.index("paused, listening")
        assert "speaking" in texts[shown + 1 :], texts
        bubble = next(e for e in browser.js("window.__demo.transcript()") if e["itemId"] == reply["itemId"])
        assert bubble["resumes"] >= 1 and not bubble["interrupted"], bubble
        meta = page.locator(f"#transcript .msg[data-item-id='{reply['itemId']}'] .meta").inner_text()
        assert "resumed" in meta, meta

        # The worklet paused (nothing played while paused, nothing dropped) and resumed ...
        worklet = [(w["type"], w) for w in reply["worklet"]]
        assert [t for t, _ in worklet][:2] == ["paused", "resumed"], worklet
        paused, resumed = worklet[0][1], worklet[1][1]
        assert resumed["samplesPlayed"] == paused["samplesPlayed"], worklet
        assert resumed["bufferedSamples"] >= paused["bufferedSamples"], worklet
        # ... and played every sample the gateway sent for the reply, none twice.
        sent_ms = sum(
            len(base64.b64decode(e["delta"])) / 48  # PCM16 at 24 kHz: 48 bytes a millisecond
            for e in browser.events("response.output_audio.delta")
            if e.get("response_id") == response_id
        )
        assert sent_ms > 1000, sent_ms
        assert reply["receivedMs"] == pytest.approx(sent_ms, abs=0.1), (reply, sent_ms)
        assert abs(reply["playedMs"] - sent_ms) <= PLAYED_TOLERANCE_MS, (reply, sent_ms)
        acks = [e for e in sent if e.get("type") == "playback.ack" and e.get("response_id") == response_id]
        assert len(acks) == 1 and abs(acks[0]["played_ms"] - sent_ms) <= PLAYED_TOLERANCE_MS, (acks, sent_ms)
        assert not [
            e
            for e in sent
            if e.get("type") == "conversation.item.truncate" and e.get("item_id") == reply["itemId"]
        ]

        assert browser.js("window.__demo.stats.holdsResumed") >= 1
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)


#: Runs in the page: the playback worklet fed a ramp (every sample distinct), paused mid-reply,
#: resumed, drained; then paused again and flushed, and a next reply must still play. A recorder
#: worklet behind it keeps every sample it output.
WORKLET_PAUSE = """async () => {
  const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
  const ctx = new AudioContext();
  await ctx.audioWorklet.addModule('/worklets/playback-processor.js');
  const recorder = `class Recorder extends AudioWorkletProcessor {
    process(inputs) { const x = inputs[0][0]; if (x) this.port.postMessage(x.slice(0)); return true; }
  }
  registerProcessor('recorder', Recorder);`;
  await ctx.audioWorklet.addModule(URL.createObjectURL(new Blob([recorder], { type: 'text/javascript' })));
  const rate = ctx.sampleRate; // the stream at the context's rate: no resampling, samples compare exactly
  const play = new AudioWorkletNode(ctx, 'playback-processor', {
    numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1], processorOptions: { rate, targetMs: 40 },
  });
  const rec = new AudioWorkletNode(ctx, 'recorder', { numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1] });
  const out = [];
  rec.port.onmessage = (e) => out.push(e.data);
  const reports = [];
  play.port.onmessage = (e) => reports.push(e.data);
  play.connect(rec).connect(ctx.destination);
  if (ctx.state !== 'running') await ctx.resume();
  const until = async (pred, what) => {
    for (let i = 0; i < 200; i++) { if (pred()) return; await sleep(25); }
    throw new Error(`no ${what}: ${JSON.stringify(reports.map((r) => r.type))}`);
  };
  const n = Math.round(rate * 0.6);
  const ramp = new Float32Array(n).map((_, i) => 0.1 + (0.8 * i) / n);
  for (let i = 0; i < n; i += 960) {
    const chunk = ramp.slice(i, Math.min(n, i + 960));
    play.port.postMessage({ type: 'push', itemId: 'a', responseId: 'r1', samples: chunk }, [chunk.buffer]);
  }
  await until(() => reports.some((r) => r.type === 'started'), 'start');
  await sleep(150);
  play.port.postMessage({ type: 'pause', responseId: 'r1' });
  await until(() => reports.some((r) => r.type === 'paused'), 'paused report');
  await sleep(300);
  play.port.postMessage({ type: 'resume', responseId: 'r1' });
  await until(() => reports.some((r) => r.type === 'resumed'), 'resumed report');
  play.port.postMessage({ type: 'end', itemId: 'a' });
  await until(() => reports.some((r) => r.type === 'drained'), 'drained report');
  await sleep(50);
  const first = out.splice(0);
  const flat = new Float32Array(first.reduce((k, b) => k + b.length, 0));
  let at = 0;
  for (const b of first) { flat.set(b, at); at += b.length; }
  const nonzero = flat.filter((x) => x !== 0);
  let same = nonzero.length === n;
  for (let i = 0; same && i < n; i++) same = nonzero[i] === ramp[i];
  // The longest run of silence between the reply's first and last sample: the pause.
  const firstAt = flat.findIndex((x) => x !== 0);
  let lastAt = flat.length - 1;
  while (lastAt > 0 && flat[lastAt] === 0) lastAt--;
  let run = 0, longest = 0;
  for (let i = firstAt; i <= lastAt; i++) { run = flat[i] === 0 ? run + 1 : 0; longest = Math.max(longest, run); }

  // Paused, then flushed (a barge-in): the next reply plays without a resume.
  const more = ramp.slice();
  play.port.postMessage({ type: 'push', itemId: 'b', responseId: 'r2', samples: more }, [more.buffer]);
  await until(() => reports.some((r) => r.type === 'started' && r.itemId === 'b'), 'second start');
  play.port.postMessage({ type: 'pause', responseId: 'r2' });
  play.port.postMessage({ type: 'flush', reason: 'test' });
  await until(() => reports.some((r) => r.type === 'flushed'), 'flushed report');
  const next = ramp.slice(0, 2400);
  play.port.postMessage({ type: 'push', itemId: 'c', responseId: 'r3', samples: next }, [next.buffer]);
  play.port.postMessage({ type: 'end', itemId: 'c' });
  await until(() => reports.some((r) => r.type === 'drained' && r.itemId === 'c'), 'the reply after the flush');
  await ctx.close();
  const pick = (type) => reports.find((r) => r.type === type);
  return {
    n, rate, same, nonzero: nonzero.length, pauseSamples: longest,
    paused: pick('paused'), resumed: pick('resumed'),
    drained: reports.filter((r) => r.type === 'drained').map((r) => [r.itemId, r.playedSamples]),
    flushed: pick('flushed'),
  };
}"""


@pytest.fixture
def echo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start({"limits": {"max_sessions": 2}}, name="echo-worklet")


def test_playback_worklet_pauses_without_losing_or_repeating_audio(echo: Gateway, tmp_path: Path) -> None:
    result = evaluate_on_page(echo, tmp_path, WORKLET_PAUSE)
    n, rate = result["n"], result["rate"]
    # Every sample given, in order, each once (the ramp's values are all distinct and non-zero).
    assert result["same"], result
    paused, resumed = result["paused"], result["resumed"]
    assert 0 < paused["samplesPlayed"] < n, result
    assert resumed["samplesPlayed"] == paused["samplesPlayed"], result  # nothing played while paused
    assert paused["samplesPlayed"] + paused["bufferedSamples"] == n, result  # nothing dropped at the pause
    assert resumed["bufferedSamples"] == paused["bufferedSamples"], result
    # Silence in the middle of the reply for about the 300 ms it was paused (timers are loose).
    assert result["pauseSamples"] >= 0.2 * rate, result
    assert result["drained"][0] == ["a", n], result
    # A flush ends the pause: the next reply played to its end.
    assert result["flushed"]["droppedSamples"] > 0, result
    assert result["drained"][-1] == ["c", 2400], result
