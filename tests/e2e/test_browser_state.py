"""The browser demo's assistant state, its voice meter and the gateway's latency breakdown.

Same set-up as :mod:`tests.e2e.test_browser_ui` (Debian Chromium headless under Playwright, the
looping fake microphone: 0.8 s of silence, the sentence, 2 s, the sentence, 4.5 s; every received
frame recorded; any console error fails a test). A sampler in the page records, every 50 ms, the
assistant's state and the assistant meter, so the checks read what the page showed over whole turns.

* over a real turn the assistant goes listening -> thinking -> speaking -> listening; its meter
  moves while it speaks and rests at zero while it listens; screen readers hear the settled state
  (a status line, a handful of times per turn, never per audio chunk);
* the page asks for ``turn.latency`` in every ``session.update`` (Settings › Apply too) and shows
  each reply's stages under its bar: with the embedded engine recognition / reply / speech, with
  echo one ``engine`` stage; the event log lists the event; the latency figure is not a live region;
* a gateway that sends no breakdown, or refuses the ``include``, leaves the panel as it was.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import (
    DESKTOP,
    WEBSOCKET_DEMO,
    _connect,
    _disconnect,
    chromium_page,
    open_settings,
)
from tests.e2e.test_browser_ui import UiBrowser, _apply

pytestmark = pytest.mark.e2e

#: The page's words for the gateway's stage names.
LABELS = {
    "turn_detection": "turn end",
    "recognition": "recognition",
    "reply": "reply",
    "speech": "speech",
    "engine": "engine",
    "other": "other",
}


class StateBrowser(UiBrowser):
    #: Every client event the page sent, audio appends left out.
    sent_events: list[dict[str, Any]]

    def updates(self) -> list[dict[str, Any]]:
        return [e for e in self.sent_events if e.get("type") == "session.update"]

    def samples(self) -> list[list[Any]]:
        """[t_ms, state, meter value] every 50 ms since the sampler started."""
        return self.js("window.__samples")  # type: ignore[no-any-return]


#: Runs in the page: what the assistant row shows, every 50 ms, and each write to its status line.
SAMPLER = """() => {
  window.__samples = [];
  window.__announcerWrites = 0;
  new MutationObserver((records) => { window.__announcerWrites += records.length; })
    .observe(document.getElementById('assistant-announce'), { childList: true, characterData: true, subtree: true });
  setInterval(() => {
    const state = document.getElementById('assistant-state').dataset.state;
    const level = Number(document.getElementById('out-meter').getAttribute('aria-valuenow'));
    window.__samples.push([Math.round(performance.now()), state, level]);
  }, 50);
}"""


def record_page(page: Any, browser: UiBrowser, sent: list[dict[str, Any]]) -> None:
    """Record the page's errors on ``browser``, and every frame but audio appends it gets and sends."""
    page.on("console", lambda m: browser.errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda exc: browser.errors.append(f"pageerror: {exc}"))

    def record(into: list[dict[str, Any]], payload: str | bytes) -> None:
        with contextlib.suppress(ValueError):
            event = json.loads(payload)
            if isinstance(event, dict) and event.get("type") != "input_audio_buffer.append":
                into.append(event)

    def on_socket(ws: Any) -> None:
        ws.on("framereceived", lambda payload: record(browser.received, payload))
        ws.on("framesent", lambda payload: record(sent, payload))

    page.on("websocket", on_socket)


@contextlib.contextmanager
def state_browser(tmp_path: Path, url: str, viewport: dict[str, int] = DESKTOP) -> Iterator[StateBrowser]:
    """:func:`tests.e2e.test_browser_ui.ui_browser`, also recording the frames the page sends."""
    with chromium_page(tmp_path, viewport=viewport) as page:
        browser = StateBrowser(page)
        browser.sent_events = []
        record_page(page, browser, browser.sent_events)
        page.goto(url, wait_until="load")
        browser.js(SAMPLER)
        yield browser
    assert browser.errors == [], browser.errors


def _runs(states: list[str]) -> list[str]:
    """Consecutive repeats collapsed: the sequence of states."""
    out: list[str] = []
    for state in states:
        if not out or out[-1] != state:
            out.append(state)
    return out


def _has_turn(sequence: list[str]) -> bool:
    pattern = ["listening", "thinking", "speaking", "listening"]
    return any(sequence[i : i + 4] == pattern for i in range(len(sequence) - 3))


def _wait_full_turn(browser: StateBrowser, timeout_s: float) -> None:
    browser.wait(
        """(() => {
          const s = window.__demo.assistantStates.map((e) => e.state);
          for (let i = 0; i + 3 < s.length; i++) {
            if (s[i] === 'listening' && s[i + 1] === 'thinking' && s[i + 2] === 'speaking' && s[i + 3] === 'listening') return true;
          }
          return false;
        })()""",
        timeout_s,
        "a turn: listening -> thinking -> speaking -> listening",
    )


def _check_state_and_meter(browser: StateBrowser) -> None:
    """The recorded transitions, the sampled meter and the screen-reader line agree with a real turn."""
    page = browser.page
    transitions = [e["state"] for e in browser.js("window.__demo.assistantStates")]
    assert _has_turn(_runs(transitions)), transitions

    samples = browser.samples()
    speaking = [level for _, state, level in samples if state == "speaking"]
    assert speaking and max(speaking) > 20, speaking  # the played voice moves the meter
    # While listening the meter rests at zero (after a short settle from the last frame of audio).
    resting = [
        samples[i] for i in range(4, len(samples)) if all(s[1] == "listening" for s in samples[i - 4 : i + 1])
    ]
    assert resting, samples[:40]
    assert all(level == 0 for _, _, level in resting), [s for s in resting if s[2] != 0][:10]

    # The visible state is not a live region; one polite status line says where things settled,
    # a few times per turn, not once per audio chunk.
    state = page.locator("#assistant-state")
    assert state.evaluate("el => el.closest('[aria-live]')") is None
    announcer = page.locator("#assistant-announce")
    assert announcer.get_attribute("role") == "status"
    # A state is announced once it has held 700 ms: a reply the looping microphone's next sentence
    # cut sooner (its first audio late on a busy machine) is never announced, so wait for one that
    # played that long.
    browser.wait(
        "window.__demo.announcements.includes('Assistant is speaking')",
        30,
        "a reply that played long enough to be announced",
    )
    # One read of all three, so an announcement in between cannot make them disagree.
    said, writes, transitions = browser.js(
        "[window.__demo.announcements.slice(), window.__announcerWrites,"
        " window.__demo.assistantStates.map((e) => e.state)]"
    )
    assert len(said) <= len(transitions), (said, transitions)
    assert all(a != b for a, b in itertools.pairwise(said)), said  # never the same twice running
    # The status line was written exactly when something was announced: audio did not touch it.
    assert writes == len(said), (writes, said)
    assert page.get_by_role("meter", name="Assistant voice level").count() == 1


def _check_breakdown(browser: StateBrowser, expected_engine_stages: list[str]) -> None:
    """Every turn the page measured shows the stages the gateway sent for its reply."""
    page = browser.page
    sent = {e["response_id"]: e for e in browser.events("turn.latency")}
    assert sent, [e["type"] for e in browser.received[-40:]]
    for event in sent.values():
        names = [s["name"] for s in event["stages"]]
        assert names[1:] == expected_engine_stages or names == expected_engine_stages, names

    turns = [t for t in browser.js("window.__demo.turns()") if t["responseId"] in sent]
    assert turns, (browser.js("window.__demo.turns()"), list(sent))
    for turn in turns:
        event = sent[turn["responseId"]]
        assert turn["server"]["stages"] == [{"name": s["name"], "ms": s["ms"]} for s in event["stages"]]
        row = page.locator(f"#timeline .turn[data-response-id='{turn['responseId']}']")
        if row.count() == 0:
            continue  # scrolled out of the last eight
        chips = row.locator(".stage")
        labels = chips.locator(".stage-name").all_inner_texts()
        assert labels == [LABELS[s["name"]] for s in event["stages"]], labels
        values = chips.locator(".stage-ms").all_inner_texts()
        assert values == [_shown_ms(s["ms"]) for s in event["stages"]], values
        label = row.get_attribute("aria-label") or ""
        assert "gateway's breakdown" in label and LABELS[expected_engine_stages[0]] in label, label
        # The page's own end-to-end figure stays what it measured.
        assert row.locator(".turn-ms").inner_text() == f"{turn['totalMs']} ms"
    assert page.locator("#stages-note").is_visible()

    # The figure is read when the panel is, not announced with every new value.
    assert page.locator("#latency-value").evaluate("el => el.closest('[aria-live]')") is None
    assert page.locator(".latency [aria-live]").count() == 0

    # The event log lists it like any other event.
    assert any(e["dir"] == "in" and e["type"] == "turn.latency" for e in browser.js("window.__demo.log"))
    browser.page.locator("#log-panel > summary").click()
    browser.page.fill("#log-filter", "turn.latency")
    browser.wait(
        "document.querySelector(\"#log li[data-type='turn.latency']\") !== null", 5, "turn.latency in the log"
    )
    assert "total_ms" in browser.page.locator("#log li[data-type='turn.latency']").first.inner_text()
    browser.page.fill("#log-filter", "")


def _shown_ms(ms: float) -> str:
    # Math.round: halves go up (Python's round() goes to even).
    return "<1" if 0 < ms < 0.5 else str(math.floor(ms + 0.5))


def _asks_for_latency(update: dict[str, Any]) -> bool:
    return "turn.latency" in (update.get("session", {}).get("include") or [])


# ---------------------------------------------------------------------------------------
# 1. Against the embedded engine: the engine's own stages


@pytest.fixture
def embedded(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start(
        {"engine": {"name": "embedded"}, "limits": {"max_sessions": 2}}, name="embedded-state"
    )


def test_embedded_turn_states_meter_and_recognition_reply_speech(embedded: Gateway, tmp_path: Path) -> None:
    with state_browser(tmp_path, embedded.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        assert page.locator("#assistant-state").inner_text() == "not connected"
        _connect(browser)
        browser.wait("window.__demo.stats.assistantState === 'listening'", 5, "listening once connected")
        assert page.locator("#assistant-state").inner_text() == "listening"
        assert all(_asks_for_latency(u) for u in browser.updates()), browser.updates()
        browser.wait(
            "window.__demo.events.some(e => e.type === 'session.updated')", 10, "the first session.updated"
        )
        assert browser.events("session.updated")[0]["session"]["include"] == ["turn.latency"]

        _wait_full_turn(browser, 60)
        browser.wait(
            "window.__demo.turns().some(t => t.server && t.server.stages.some(s => s.name === 'recognition'))",
            30,
            "a measured turn with the embedded engine's stages",
        )
        _check_state_and_meter(browser)
        _check_breakdown(browser, ["recognition", "reply", "speech", "other"])
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)
        browser.wait("window.__demo.stats.assistantState === 'idle'", 5, "idle after Disconnect")
        assert page.locator("#assistant-state").inner_text() == "not connected"
        browser.wait("window.__demo.stats.assistantLevel === 0", 5, "a flat meter after Disconnect")


# ---------------------------------------------------------------------------------------
# 2. Against echo: one engine stage; Settings keeps asking; no breakdown, a refused include


@pytest.fixture
def echo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start({"limits": {"max_sessions": 4}}, name="echo-state")


def test_echo_turn_shows_one_engine_stage_and_apply_keeps_asking(echo: Gateway, tmp_path: Path) -> None:
    with state_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        _wait_full_turn(browser, 40)
        browser.wait(
            "window.__demo.turns().some(t => t.server)", 20, "a measured turn with the gateway's stages"
        )
        _check_state_and_meter(browser)
        _check_breakdown(browser, ["engine"])

        # Settings › Apply sends the whole session again, include and all.
        open_settings(page)
        page.fill("#instructions", "Be brief.")
        _apply(browser, "applied to the live session")
        assert len(browser.updates()) >= 2 and all(_asks_for_latency(u) for u in browser.updates())
        assert browser.events("session.updated")[-1]["session"]["include"] == ["turn.latency"]
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)


#: The gateway's turn.latency never reaches the page (as with a gateway that has no such event).
DROP_LATENCY = """() => {
  const client = window.__demo.client;
  const onEvent = client.onEvent;
  client.onEvent = (ev) => { if (ev.type !== 'turn.latency') onEvent(ev); };
}"""

#: The page's include names something this gateway refuses (as another Realtime server would).
BOGUS_INCLUDE = """() => {
  const client = window.__demo.client;
  const send = client.send;
  client.send = (event, ws) => {
    if (event.type === 'session.update' && event.session && event.session.include) {
      event = { ...event, session: { ...event.session, include: ['no.such.event'] } };
    }
    return send(event, ws);
  };
}"""


@pytest.mark.parametrize("how", ["no_event", "include_refused"])
def test_without_a_breakdown_the_panel_shows_the_pages_own_figure(
    how: str, echo: Gateway, tmp_path: Path
) -> None:
    with state_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        browser.js(DROP_LATENCY if how == "no_event" else BOGUS_INCLUDE)
        _connect(browser)
        _wait_full_turn(browser, 40)
        browser.wait("window.__demo.turns().length >= 1", 20, "a measured turn")
        assert page.locator("#timeline .turn").count() >= 1
        assert page.locator("#timeline .stages").count() == 0
        assert page.locator("#stages-note").is_hidden()
        assert all(t["server"] is None for t in browser.js("window.__demo.turns()"))
        assert browser.js("/^\\d+$/.test(document.getElementById('latency-value').textContent)")
        if how == "include_refused":
            # Refused once, asked again without it: the session got its format and turn detection.
            updates = browser.updates()
            assert updates[0]["session"]["include"] == ["no.such.event"], updates[0]
            assert "include" not in updates[1]["session"], updates[1]
            refused = [
                e for e in browser.events("error") if e["error"].get("event_id") == updates[0]["event_id"]
            ]
            assert refused and "include" in (refused[0]["error"].get("param") or ""), refused
            assert not browser.events("turn.latency")
            assert page.locator("#status-bar").is_hidden()
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)
