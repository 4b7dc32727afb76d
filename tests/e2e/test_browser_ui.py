"""The browser demo's controls as a user meets them: phone layout, mute, push-to-talk, settings, transcript.

Same set-up as :mod:`tests.e2e.test_browser` (Debian Chromium headless under Playwright, the looping
fake microphone: 0.8 s of silence, the sentence, 2 s, the sentence, 4.5 s; a real echo gateway; any
console error fails a test). The WebSocket frames the page receives are recorded through Playwright,
so a test can compare what the page shows with what the gateway actually sent.

* at 390×844 the top bar wraps, nothing scrolls sideways, Connect and the status line are on screen
  and Settings opens;
* mute flattens the meter, hides "speaking…", ends the turn it cut and keeps the session past the
  gateway's idle timeout;
* push-to-talk: switching mid-utterance (and Disconnect) clears "speaking…" and "listening…", the
  microphone is sent only while Talk is pressed, Commit turn / Respond are explained, VAD fields
  are disabled;
* settings: Apply confirms, applies live, says URL/key need a reconnect; Voice lists the engine's
  voices from session.created; G.711 switches the rate to 8 kHz;
* the "Press Connect" hint goes on connect, counters restart with a new session, and a reply cut
  off before any of it was heard shows none of its words.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import (
    DESKTOP,
    WEBSOCKET_DEMO,
    Browser,
    _connect,
    _disconnect,
    _wait_sessions,
    chromium_page,
    open_settings,
)

pytestmark = pytest.mark.e2e

PHONE = {"width": 390, "height": 844}

#: The gateway's idle timeout in the mute / push-to-talk tests: a muted page must outlive it.
IDLE_TIMEOUT_S = 3


@dataclass
class UiBrowser(Browser):
    #: Every server event the page received over its WebSocket(s), in order.
    received: list[dict[str, Any]] = field(default_factory=list)

    def js(self, expression: str) -> Any:
        return self.page.evaluate(expression)

    def sent(self, event_type: str) -> int:
        return int(self.js(f"window.__demo.sent[{event_type!r}] || 0"))

    def events(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.received if e.get("type") == event_type]


@contextlib.contextmanager
def ui_browser(
    tmp_path: Path, url: str, viewport: dict[str, int] = DESKTOP, *, mobile: bool = False
) -> Iterator[UiBrowser]:
    """Like :func:`tests.e2e.test_browser.chromium`, at ``viewport``, recording received frames."""
    with chromium_page(tmp_path, viewport=viewport, is_mobile=mobile, has_touch=mobile) as page:
        browser = UiBrowser(page)
        page.on("console", lambda m: browser.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: browser.errors.append(f"pageerror: {exc}"))

        def on_frame(payload: str | bytes) -> None:
            with contextlib.suppress(ValueError):
                event = json.loads(payload)
                if isinstance(event, dict):
                    browser.received.append(event)

        page.on("websocket", lambda ws: ws.on("framereceived", on_frame))
        page.goto(url, wait_until="load")
        yield browser
    assert browser.errors == [], browser.errors


def _apply(browser: UiBrowser, expect: str, timeout_s: float = 10) -> str:
    browser.page.locator("#apply").click()
    browser.wait(
        f"document.getElementById('settings-status').textContent.includes({expect!r})",
        timeout_s,
        f"settings confirmation {expect!r}",
    )
    return browser.page.locator("#settings-status").inner_text()  # type: ignore[no-any-return]


def _wait_speaking(browser: UiBrowser, timeout_s: float = 20) -> None:
    """The fake microphone is mid-sentence: "speaking…" and a "listening…" caller bubble are up."""
    browser.wait(
        "document.getElementById('speaking').textContent === 'speaking…'"
        " && document.querySelector('#transcript .msg.user.listening') !== null",
        timeout_s,
        "'speaking…' with a listening caller bubble",
    )


def _no_stale_turn(browser: UiBrowser) -> None:
    page = browser.page
    assert page.locator("#speaking").inner_text() == ""
    assert page.locator("#transcript .msg.user.listening").count() == 0
    assert page.locator("#transcript .msg.user.partial").count() == 0


@pytest.fixture
def echo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start(
        {"limits": {"max_sessions": 4, "idle_timeout_s": IDLE_TIMEOUT_S, "resume_grace_s": 5}}, name="echo-ui"
    )


# ---------------------------------------------------------------------------------------
# 1. Phone layout


#: Visible elements that stick out of the viewport sideways (should be none).
OVERFLOWING = """() => {
  const w = document.documentElement.clientWidth;
  return [...document.querySelectorAll('body *')]
    .filter((el) => el.getClientRects().length && getComputedStyle(el).visibility !== 'hidden')
    .filter((el) => { const r = el.getBoundingClientRect(); return r.width > 0 && (r.right > w + 1 || r.left < -1); })
    .map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className}`);
}"""


def _within_viewport(page: Any, selector: str) -> dict[str, float]:
    box = page.locator(selector).bounding_box()
    assert box, selector
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, (selector, box)
    assert box["y"] >= 0 and box["y"] + box["height"] <= PHONE["height"], (selector, box)
    return box  # type: ignore[no-any-return]


def _no_sideways_scroll(page: Any) -> None:
    widths = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert widths[0] <= widths[1], f"the page scrolls sideways: {widths}"
    assert page.evaluate(OVERFLOWING) == []


def test_phone_layout_wraps_keeps_connect_and_status_on_screen(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO, PHONE, mobile=True) as browser:
        page = browser.page
        assert page.evaluate("innerWidth") == PHONE["width"]
        _no_sideways_scroll(page)
        _within_viewport(page, "#connect")
        _within_viewport(page, "#conn")
        # The top bar wrapped: the title sits above the connection controls.
        title = page.locator(".brand").bounding_box()
        connect = page.locator("#connect").bounding_box()
        assert title and connect and connect["y"] >= title["y"] + title["height"] - 1, (title, connect)

        _connect(browser)
        _no_sideways_scroll(page)
        _within_viewport(page, "#connect")
        assert page.locator("#connect").inner_text() == "Disconnect"
        # An error lands in the status line, right under the top bar, above the fold.
        browser.js("window.__demo.client.send({type: 'no.such.event'})")
        browser.wait(
            "!document.getElementById('status-bar').hidden", 10, "status line with the gateway's error"
        )
        status = _within_viewport(page, "#status-bar")
        assert status["y"] < connect["y"] + connect["height"] + 40, (status, connect)
        _no_sideways_scroll(page)
        page.screenshot(path=str(tmp_path / "phone.png"), full_page=True)

        # Settings can be reached and used.
        open_settings(page)
        page.locator("#url").scroll_into_view_if_needed()
        assert page.locator("#url").is_visible() and page.locator("#apply").is_visible()
        page.locator("#apply").scroll_into_view_if_needed()
        _within_viewport(page, "#apply")
        _no_sideways_scroll(page)
        _apply(browser, "applied to the live session")
        browser.js("window.__demo.errors.length = 0")  # the bogus event's error was on purpose
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 2. Mute


def test_mute_flattens_meter_ends_the_turn_and_outlives_the_idle_timeout(
    echo: Gateway, tmp_path: Path
) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        mute = page.locator("#mute")
        assert mute.inner_text() == "Mute mic" and mute.get_attribute("aria-pressed") == "false"

        # Mid-sentence: the caller is speaking and the gateway opened a turn.
        _wait_speaking(browser)
        stopped_before = len(browser.events("input_audio_buffer.speech_stopped"))
        mute.click()
        assert mute.inner_text() == "Mute mic", "the label stays; aria-pressed says it is on"
        assert mute.get_attribute("aria-pressed") == "true"
        assert page.get_by_role("button", name="Mute mic", pressed=True).count() == 1

        # Muted for more than twice the idle timeout: meter flat, never "speaking…", silence sent.
        samples = []
        deadline = time.monotonic() + 2 * IDLE_TIMEOUT_S + 1
        while time.monotonic() < deadline:
            samples.append(
                browser.js(
                    "[document.getElementById('meter').getAttribute('aria-valuenow'),"
                    " document.querySelector('#meter .meter-fill').style.width,"
                    " document.getElementById('speaking').textContent, window.__demo.stats.state]"
                )
            )
            time.sleep(0.2)
        assert all(s[0] == "0" and s[1] in ("0%", "") and s[2] == "" for s in samples[2:]), samples
        assert {s[3] for s in samples} == {"connected"}, samples

        # The cut turn ended cleanly: the gateway's VAD heard the silence, no bubble is left "listening…".
        assert len(browser.events("input_audio_buffer.speech_stopped")) > stopped_before, [
            e["type"] for e in browser.received[-30:]
        ]
        assert page.locator("#transcript .msg.user.listening").count() == 0
        # Alive past the idle timeout: the page streamed silence, the gateway kept the session.
        assert browser.js("window.__demo.stats.silentFramesSent") > 10
        assert not browser.events("session.closed")
        assert echo.readyz()["sessions"] == 1
        assert browser.js("window.__demo.errors") == []

        # Unmuted: the microphone's own audio again, same label.
        mute.click()
        assert mute.get_attribute("aria-pressed") == "false" and mute.inner_text() == "Mute mic"
        silent = browser.js("window.__demo.stats.silentFramesSent")
        frames = browser.js("window.__demo.stats.framesSent")
        browser.wait(f"window.__demo.stats.framesSent > {frames + 10}", 5, "audio after unmuting")
        assert browser.js("window.__demo.stats.silentFramesSent") == silent
        _disconnect(browser)
        _wait_sessions(echo, 0, 5)


# ---------------------------------------------------------------------------------------
# 3. Push-to-talk


def test_push_to_talk_switch_clears_stale_state_and_streams_only_while_talking(
    echo: Gateway, tmp_path: Path
) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        open_settings(page)
        assert page.locator("#threshold").is_enabled() and page.locator("#silence").is_enabled()

        # Switch to push-to-talk mid-utterance: "speaking…" and the listening bubble go.
        _wait_speaking(browser)
        page.select_option("#turn", "none")
        assert page.locator("#threshold").is_disabled() and page.locator("#silence").is_disabled()
        _apply(browser, "applied to the live session")
        browser.wait(
            "document.getElementById('session-info').textContent.includes('push-to-talk')", 5, "PTT session"
        )
        _no_stale_turn(browser)

        # The buttons are explained.
        assert page.locator("#ptt-hint").is_visible()
        hint = page.locator("#ptt-hint").inner_text()
        assert "Commit turn" in hint and "Respond" in hint and "Talk" in hint, hint
        assert "no reply" in (page.locator("#commit").get_attribute("title") or "")
        assert "answer" in (page.locator("#respond").get_attribute("title") or "")

        # Not talking: no audio goes out (heartbeats keep the session), the meter is flat.
        appends = browser.sent("input_audio_buffer.append")
        time.sleep(IDLE_TIMEOUT_S + 1.5)
        assert browser.sent("input_audio_buffer.append") == appends
        assert browser.sent("session.heartbeat") >= 2
        assert browser.js("document.getElementById('meter').getAttribute('aria-valuenow')") == "0"
        assert browser.js("window.__demo.stats.state") == "connected" and echo.readyz()["sessions"] == 1

        # Talking streams; Respond stops it, commits and asks for the reply.
        talk = page.locator("#talk")
        talk.click()
        assert talk.get_attribute("aria-pressed") == "true"
        browser.wait(
            f"(window.__demo.sent['input_audio_buffer.append'] || 0) > {appends + 25}",
            10,
            "audio while talking",
        )
        page.locator("#respond").click()
        assert talk.get_attribute("aria-pressed") == "false"
        assert browser.sent("input_audio_buffer.commit") == 1 and browser.sent("response.create") == 1
        browser.wait("window.__demo.stats.responses >= 1", 15, "the reply to the push-to-talk turn")
        appends = browser.sent("input_audio_buffer.append")
        time.sleep(1.5)
        assert browser.sent("input_audio_buffer.append") == appends

        # Back to server VAD, mid-utterance Disconnect: nothing is left "speaking…" or "listening…".
        page.select_option("#turn", "server_vad")
        assert page.locator("#threshold").is_enabled()
        _apply(browser, "applied to the live session")
        assert page.locator("#ptt").is_hidden() and page.locator("#ptt-hint").is_hidden()
        _wait_speaking(browser, 25)
        _disconnect(browser)
        _no_stale_turn(browser)


# ---------------------------------------------------------------------------------------
# 4. Settings


def test_settings_confirm_apply_live_offer_engine_voices_and_g711_rate(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        open_settings(page)
        assert _apply(browser, "Saved") == "Saved. Used when you connect."
        assert page.evaluate("document.getElementById('voice').tagName") == "SELECT"

        _connect(browser)
        created = browser.events("session.created")[0]["session"]
        voices = created["capabilities"]["voices"]
        offered = page.evaluate("[...document.getElementById('voice').options].map(o => o.value)")
        assert offered == voices, (offered, voices)
        assert page.input_value("#voice") == created["audio"]["output"]["voice"]

        # G.711 is narrowband: choosing it switches the rate to 8 kHz; leaving it goes back to 24 kHz.
        page.select_option("#in-format", "g711_ulaw")
        assert page.input_value("#in-rate") == "8000"
        page.select_option("#out-format", "g711_alaw")
        assert page.input_value("#out-rate") == "8000"
        page.select_option("#out-format", "pcm16")
        assert page.input_value("#out-rate") == "24000"

        # Apply while connected: sent as session.update and confirmed once the gateway applied it.
        updates = browser.sent("session.update")
        text = _apply(browser, "applied to the live session")
        assert "reconnect" not in text, text
        assert browser.sent("session.update") == updates + 1
        update = browser.events("session.updated")[-1]["session"]["audio"]
        fmt = update["input"]["format"]
        assert fmt["type"] == "audio/pcmu" and fmt.get("rate", 8000) == 8000, (
            update
        )  # G.711 is 8 kHz by definition
        assert "in g711_ulaw 8 kHz" in page.locator("#session-info").inner_text()
        frames = browser.js("window.__demo.stats.framesSent")
        browser.wait(f"window.__demo.stats.framesSent > {frames + 10}", 5, "G.711 audio streaming")

        # URL / key changes are saved but need a reconnect, and the page says so.
        page.fill("#url", echo.ws_url + "/v1/realtime")
        assert page.locator("#settings-status").inner_text() == "", "editing clears the old confirmation"
        text = _apply(browser, "reconnect")
        assert "take effect on reconnect" in text, text
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)
        assert _apply(browser, "Saved") == "Saved. Used when you connect."


# ---------------------------------------------------------------------------------------
# 5. Hint, counters, interrupted reply


#: Barge in on the first audio of the first reply, before the jitter buffer lets any of it play.
BARGE_ON_FIRST_AUDIO = """() => {
  const client = window.__demo.client;
  const onEvent = client.onEvent;
  let done = false;
  client.onEvent = (ev) => {
    onEvent(ev);
    if (!done && (ev.type === 'response.output_audio.delta' || ev.type === 'response.audio.delta')) {
      done = true;
      window.__bargedItem = ev.item_id;
      document.getElementById('barge').click();
    }
  };
}"""


def test_hint_goes_counters_restart_and_cut_reply_shows_what_was_heard(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        assert page.locator("#empty-hint").is_visible()
        _connect(browser)
        assert page.locator("#empty-hint").is_hidden()
        assert page.locator("#transcript .msg").count() == 0  # gone on connect, not with the first bubble

        # The first reply is cut off before any of it played.
        browser.js(BARGE_ON_FIRST_AUDIO)
        browser.wait(
            "window.__bargedItem && window.__demo.events.some(e => e.type === 'conversation.item.retrieved')",
            30,
            "barge-in on the first reply, truncated and its kept transcript retrieved",
        )
        item_id = browser.js("window.__bargedItem")
        truncated = [e for e in browser.events("conversation.item.truncated") if e["item_id"] == item_id]
        assert truncated and truncated[0]["audio_end_ms"] == 0, truncated
        spoken = "".join(
            e["delta"]
            for e in browser.received
            if e.get("item_id") == item_id
            and e["type"] in ("response.output_audio_transcript.delta", "response.audio_transcript.delta")
        )
        assert spoken.startswith("(echo of"), spoken  # the gateway did send the reply's words...
        kept = [
            e["item"] for e in browser.events("conversation.item.retrieved") if e["item"]["id"] == item_id
        ]
        assert kept and kept[-1]["content"][0].get("transcript", "") == "", kept
        bubble = page.locator(f"#transcript .msg.assistant[data-item-id='{item_id}']")
        browser.wait(
            f"document.querySelector(\"#transcript .msg.assistant[data-item-id='{item_id}'] .meta\").textContent.includes('before any words')",
            5,
            "the cut bubble's note",
        )
        # ...but none was heard, so the bubble shows none of them.
        assert "interrupted" in (bubble.get_attribute("class") or "")
        assert bubble.locator(".text").inner_text() == "", bubble.inner_text()
        assert "echo of" not in bubble.inner_text()
        browser.wait(
            "window.__demo.stats.flushes >= 1 && window.__demo.stats.truncatesSent >= 1",
            5,
            "counted barge-in",
        )
        browser.wait("window.__demo.stats.responses >= 1", 10, "counted reply")

        # A new session (a refused resume): every per-session counter starts again from zero.
        first = browser.js("window.__demo.client.sessionId")
        browser.js("window.__demo.client.resumeToken = 'not-the-token'")
        browser.js("window.__demo.client.ws.close(4999, 'simulated network drop')")
        browser.wait(
            f"window.__demo.stats.state === 'connected' && window.__demo.client.sessionId !== {first!r}",
            15,
            "new session",
        )
        stats = browser.stats()
        for key in (
            "flushes",
            "truncatesSent",
            "responses",
            "responsesCancelled",
            "acksSent",
            "underruns",
            "turns",
        ):
            assert stats[key] == 0, (key, stats)
        assert stats["lastLatencyMs"] is None and stats["medianLatencyMs"] is None, stats
        assert stats["framesSent"] < 100, stats
        browser.wait(
            "document.getElementById('st-flushes').textContent === '0'"
            " && document.getElementById('st-responses').textContent === '0'",
            2,
            "stats card reset",
        )
        assert page.locator("#latency-value").inner_text() == "—"
        assert page.locator("#timeline .turn").count() == 0
        assert page.locator("#empty-hint").is_hidden()
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)
