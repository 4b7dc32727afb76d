"""The browser demo's look and its playground panels: themes, accessibility, abilities, log, text, export, volume.

Same set-up as :mod:`tests.e2e.test_browser_ui` (Debian Chromium headless under Playwright, the
looping fake microphone, a real echo gateway, every received frame recorded, any console error
fails a test).

* the dark theme follows ``prefers-color-scheme: dark``; the light one is the default;
* axe-core, run inside the page, finds no serious or critical violation in either theme (connected,
  with a conversation, the assistant's state and meter, a turn with the gateway's latency breakdown,
  Settings and the event log open). axe-core comes from the npm registry
  through ``tests/browser/package.json`` (``npm ci --prefix tests/browser``); without it that test
  is skipped and says so;
* the line under the header says what the running engine does;
* the event log records events both ways, elides audio and filters by type;
* a typed message becomes a user item and asks for a reply; instructions go out with session.update;
* the transcript exports as .txt and .json and clears; the volume slider sets the playback gain;
* at phone size the new panels fit without sideways scrolling.

Set ``WEB_DEMO_SCREENSHOTS=<dir>`` to write ``screenshot.png`` (desktop) and
``screenshot-phone.png`` there (the README's pictures).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import WEBSOCKET_DEMO, _connect, _disconnect, open_settings
from tests.e2e.test_browser_ui import PHONE, UiBrowser, _no_sideways_scroll, ui_browser

pytestmark = pytest.mark.e2e

AXE = Path(__file__).resolve().parents[1] / "browser" / "node_modules" / "axe-core" / "axe.min.js"
SCREENSHOTS = os.environ.get("WEB_DEMO_SCREENSHOTS")


@pytest.fixture(scope="module")
def echo(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start({"limits": {"max_sessions": 4}}, name="echo-a11y")


def _open(page: Any, panel: str) -> None:
    if not page.evaluate(f"document.getElementById({panel!r}).open"):
        page.locator(f"#{panel} > summary").click()


def _colors(page: Any) -> dict[str, str]:
    return page.evaluate(  # type: ignore[no-any-return]
        """() => {
          const cs = (sel) => getComputedStyle(document.querySelector(sel));
          return {
            body: cs('body').backgroundColor, ink: cs('body').color, card: cs('.card').backgroundColor,
            field: cs('#url').borderTopColor, scheme: cs(':root').colorScheme,
          };
        }"""
    )


def _luminance(css: str) -> float:
    channels = [int(c) / 255 for c in css[css.index("(") + 1 : css.index(")")].split(",")[:3]]
    lin = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def _contrast(a: str, b: str) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def _wait_reply(browser: UiBrowser, at_least: int = 1) -> None:
    browser.wait(f"window.__demo.stats.responses >= {at_least}", 30, f"{at_least} finished repl(ies)")


# ---------------------------------------------------------------------------------------
# 1. Themes


def test_dark_theme_follows_the_system_and_stays_readable(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        page.emulate_media(color_scheme="light")
        light = _colors(page)
        assert light["scheme"] == "light", light
        assert _luminance(light["body"]) > 0.8 and _luminance(light["ink"]) < 0.05, light

        page.emulate_media(color_scheme="dark")
        dark = _colors(page)
        assert dark["scheme"] == "dark", dark
        assert _luminance(dark["body"]) < 0.02 and _luminance(dark["card"]) < 0.02, dark
        assert _luminance(dark["ink"]) > 0.7, dark
        for colors in (light, dark):
            assert _contrast(colors["ink"], colors["card"]) >= 7, colors
            assert _contrast(colors["field"], colors["card"]) >= 3, colors  # text-field borders


# ---------------------------------------------------------------------------------------
# 2. axe-core in the page, both themes

AXE_RUN = """async () => {
  const result = await axe.run(document, { resultTypes: ['violations'] });
  return result.violations
    .filter((v) => v.impact === 'serious' || v.impact === 'critical')
    .map((v) => ({ id: v.id, impact: v.impact, help: v.help,
                   nodes: v.nodes.slice(0, 5).map((n) => [n.target.join(' '), n.failureSummary]) }));
}"""


def test_axe_finds_no_serious_violation_in_light_and_dark(echo: Gateway, tmp_path: Path) -> None:
    # make test installs it; its absence is a broken set-up, not a reason to skip the check.
    assert AXE.exists(), f"axe-core is not installed: run `npm ci --prefix tests/browser` (looked for {AXE})"
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        page.add_script_tag(path=str(AXE))
        _connect(browser)
        _wait_reply(browser)  # a caller bubble and a reply bubble are on the page
        # A measured turn with the gateway's breakdown under its bar, and the assistant's row.
        browser.wait(
            "document.querySelector('#timeline .stages') !== null", 30, "a turn with the gateway's stages"
        )
        assert page.locator("#assistant-state").inner_text() in ("listening", "thinking…", "speaking")
        open_settings(page)
        _open(page, "log-panel")
        page.locator("#mute").click()  # a pressed toggle is checked too
        browser.wait("document.querySelectorAll('#log li').length > 5", 5, "event log rows")
        for scheme in ("light", "dark"):
            page.emulate_media(color_scheme=scheme)
            violations = page.evaluate(AXE_RUN)
            assert violations == [], (scheme, json.dumps(violations, indent=1))
        # The "▸" of a collapsible heading is not read out; "speaking…", the assistant's state and
        # the latency figure are not live regions (a status line announces the settled state).
        assert page.locator("summary .chevron[aria-hidden='true']").count() == 3
        for quiet in ("#speaking", "#assistant-state", "#latency-value", "#timeline"):
            assert page.locator(quiet).evaluate("el => el.closest('[aria-live]')") is None, quiet
        assert page.locator("#assistant-announce").get_attribute("role") == "status"
        assert page.get_by_role("meter", name="Assistant voice level").count() == 1
        assert page.get_by_role("button", name="Mute mic", pressed=True).count() == 1
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 3. What the assistant does


def test_abilities_line_says_what_the_echo_engine_does(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        assert page.locator("#abilities").is_hidden()
        _connect(browser)
        created = browser.events("session.created")[0]["session"]
        assert created["capabilities"]["engine"] == "echo"
        browser.wait("!document.getElementById('abilities').hidden", 5, "the abilities line")
        text = page.locator("#abilities").inner_text()
        assert "echo engine" in text and "plays each of your turns back" in text, text
        # Right under the header, above the conversation.
        header = page.locator(".topbar").bounding_box()
        line = page.locator("#abilities").bounding_box()
        chat = page.locator(".chat").bounding_box()
        assert header and line and chat and header["y"] + header["height"] <= line["y"] < chat["y"], (
            header,
            line,
            chat,
        )
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 4. Event log


def test_event_log_records_both_ways_elides_audio_and_filters(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        _wait_reply(browser)
        log = browser.js("window.__demo.log")
        kinds = {(e["dir"], e["type"]) for e in log}
        for expected in [
            ("in", "session.created"),
            ("out", "session.update"),
            ("in", "session.updated"),
            ("out", "input_audio_buffer.append"),
            ("in", "input_audio_buffer.speech_started"),
            ("in", "response.done"),
        ]:
            assert expected in kinds, (expected, sorted(kinds))
        times = [e["t"] for e in log]
        assert times == sorted(times) and times[0] >= 0, times[:20]
        appends = [e for e in log if e["type"] == "input_audio_buffer.append"]
        assert max(e["count"] for e in appends) > 10, appends  # a run of frames is one entry
        assert all(e["body"] == "" and e["audioBytes"] > 0 for e in appends), appends[:3]

        _open(page, "log-panel")
        browser.wait("document.querySelectorAll('#log li').length > 5", 5, "event log rows")
        rows = page.locator("#log li")
        text = page.locator("#log").inner_text()
        assert "session.created" in text and "bytes of audio" in text, text[:2000]
        # No audio payload is shown: audio would be a long run of base64.
        assert not re.search(r"[A-Za-z0-9+/]{120,}", text), text[:2000]
        assert page.locator("#log li.dir-out[data-type='session.update'] .d").first.inner_text() == "↑"
        assert page.locator("#log li.dir-in[data-type='session.created'] .d").first.inner_text() == "↓"

        page.fill("#log-filter", "session.")
        browser.wait(
            "[...document.querySelectorAll('#log li')].every(li => li.dataset.type.includes('session.'))",
            5,
            "filtered rows",
        )
        types = set(rows.evaluate_all("els => els.map(el => el.dataset.type)"))
        assert {"session.created", "session.update", "session.updated"} <= types, types
        assert "of" in page.locator("#log-count").inner_text()

        # Capped: never more than 500 entries, however long the call.
        browser.js("for (let i = 0; i < 700; i++) window.__demo.client.send({type: 'session.heartbeat'})")
        assert 0 < browser.js("window.__demo.log.length") <= 500
        page.fill("#log-filter", "")
        browser.wait("document.querySelectorAll('#log li').length > 400", 5, "the capped log rendered")
        assert rows.count() <= 500

        # Collapsible: closing the panel hides it.
        page.locator("#log-panel > summary").click()
        assert page.locator("#log").is_hidden()
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 5. Text input and instructions, export, clear


def test_typed_message_instructions_export_and_clear(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        assert page.locator("#text-input").is_disabled()
        _connect(browser)
        # One spoken turn and its reply first (echo replays the last spoken turn).
        _wait_reply(browser)
        page.locator("#mute").click()  # no more spoken turns: the typed one is the only new turn
        time.sleep(1.5)  # the turn the mute cut ends, its reply (if any) is created
        browser.wait(
            "document.getElementById('speaking').textContent === ''"
            " && !document.querySelector('#transcript .msg.user.listening')",
            15,
            "no caller turn in progress",
        )
        browser.wait(
            f"window.__demo.stats.responses >= {len(browser.events('response.created'))}", 30, "replies done"
        )

        # Instructions travel with session.update and the gateway keeps them.
        open_settings(page)
        page.fill("#instructions", "Answer in one short sentence.")
        page.locator("#apply").click()
        browser.wait(
            "document.getElementById('settings-status').textContent.includes('applied to the live session')",
            10,
            "instructions applied",
        )
        assert (
            browser.events("session.updated")[-1]["session"].get("instructions")
            == "Answer in one short sentence."
        )

        # A typed message: a user item with its text, then a reply is asked for and comes.
        replies = browser.js("window.__demo.stats.responses")
        creates = browser.sent("response.create")
        page.fill("#text-input", "What time is it?")
        page.locator("#send-text").click()
        assert page.input_value("#text-input") == ""
        assert (
            browser.sent("conversation.item.create") == 1 and browser.sent("response.create") == creates + 1
        )
        browser.wait(
            "window.__demo.transcript().some(e => e.role === 'user' && e.text === 'What time is it?')",
            10,
            "the typed message's bubble",
        )
        items = [
            e["item"]
            for e in browser.received
            if e["type"] in ("conversation.item.added", "conversation.item.created")
            and e["item"].get("role") == "user"
            and e["item"]["content"]
            and e["item"]["content"][0].get("type") == "input_text"
        ]
        assert items and items[-1]["content"][0]["text"] == "What time is it?", items
        _wait_reply(browser, replies + 1)
        assert browser.js("window.__demo.errors") == []

        if SCREENSHOTS:
            page.locator("#settings-panel > summary").click()
            page.locator("#transcript").evaluate("el => { el.scrollTop = el.scrollHeight; }")
            page.locator(".side").evaluate("el => { el.scrollTop = 0; }")  # Settings had scrolled it
            page.screenshot(path=str(Path(SCREENSHOTS) / "screenshot.png"))

        # Export: a .txt and a .json file with the conversation.
        with page.expect_download() as info:
            page.locator("#export-txt").click()
        download = info.value
        assert download.suggested_filename.startswith(
            "conversation-"
        ) and download.suggested_filename.endswith(".txt")
        text = Path(download.path()).read_text(encoding="utf-8")
        assert "You: What time is it?" in text and "Assistant: (echo of" in text, text
        with page.expect_download() as info:
            page.locator("#export-json").click()
        doc = json.loads(Path(info.value.path()).read_text(encoding="utf-8"))
        assert doc["engine"] == "echo" and doc["session_id"] == browser.js("window.__demo.client.sessionId")
        assert any(i["role"] == "user" and i["text"] == "What time is it?" for i in doc["items"]), doc
        assert any(i["role"] == "assistant" and i["text"].startswith("(echo of") for i in doc["items"]), doc

        # Clear: the bubbles go, the session stays.
        page.locator("#clear-transcript").click()
        assert page.locator("#transcript .msg").count() == 0
        assert browser.js("window.__demo.transcript()") == []
        assert browser.js("window.__demo.stats.state") == "connected"
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 6. Volume and speaker


def test_volume_sets_the_playback_gain(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        gain = "window.__demo.audio.gain.gain.value"
        assert abs(browser.js(gain) - 1) < 1e-6
        volume = page.get_by_role("slider", name="Volume")
        volume.evaluate("el => { el.value = '25'; el.dispatchEvent(new Event('input', {bubbles: true})); }")
        browser.wait(f"Math.abs({gain} - 0.25) < 0.01", 3, "playback gain 0.25")
        volume.focus()
        page.keyboard.press("Home")
        browser.wait(f"{gain} < 0.01", 3, "playback gain 0 (Home)")
        # The reply still plays (samples counted) but through a silent gain; back up for the rest.
        page.keyboard.press("End")
        browser.wait(f"Math.abs({gain} - 1) < 0.01", 3, "playback gain 1 (End)")
        # Speaker choice: offered where the browser can route audio (setSinkId), hidden otherwise.
        can_pick = browser.js("'setSinkId' in AudioContext.prototype")
        open_settings(page)
        assert page.locator("#speaker-field").is_hidden() != can_pick
        _disconnect(browser)
        # The volume is kept for the next connection.
        volume.evaluate("el => { el.value = '40'; el.dispatchEvent(new Event('input', {bubbles: true})); }")
        _connect(browser)
        browser.wait(f"Math.abs({gain} - 0.4) < 0.01", 3, "playback gain 0.4 after reconnecting")
        _disconnect(browser)


# ---------------------------------------------------------------------------------------
# 7. Phone size


def test_phone_fits_the_new_panels(echo: Gateway, tmp_path: Path) -> None:
    with ui_browser(tmp_path, echo.base_url + WEBSOCKET_DEMO, PHONE, mobile=True) as browser:
        page = browser.page
        _connect(browser)
        browser.wait("!document.getElementById('abilities').hidden", 5, "the abilities line")
        _wait_reply(browser)
        browser.wait(
            "document.querySelector('#timeline .stages') !== null", 30, "a turn with the gateway's stages"
        )
        _no_sideways_scroll(page)
        if SCREENSHOTS:
            # The picture shows the assistant talking, its meter up.
            browser.wait(
                "window.__demo.stats.assistantState === 'speaking' && window.__demo.stats.assistantLevel > 30",
                30,
                "the assistant speaking",
            )
            page.screenshot(path=str(Path(SCREENSHOTS) / "screenshot-phone.png"))
        _open(page, "log-panel")
        open_settings(page)
        browser.wait("document.querySelectorAll('#log li').length > 5", 5, "event log rows")
        _no_sideways_scroll(page)
        for selector in (
            "#out-meter",
            "#assistant-state",
            "#timeline .stages >> nth=-1",
            "#text-input",
            "#send-text",
            "#volume",
            "#export-txt",
            "#log-filter",
            "#instructions",
        ):
            page.locator(selector).scroll_into_view_if_needed()
            box = page.locator(selector).bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, (selector, box)
        _disconnect(browser)
