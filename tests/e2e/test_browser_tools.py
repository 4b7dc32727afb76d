"""The browser demo's function calling: the demo tool, its row in the conversation, its result spoken.

Same set-up as :mod:`tests.e2e.test_browser_ui` (Debian Chromium headless under Playwright, every
frame recorded both ways, any console error fails a test), against the embedded engine: its
offline tool router calls a client's function when the caller's words match it, and the next
reply speaks from the function's output. The page runs in push-to-talk mode so that the looping
fake microphone adds no spoken turns: the typed messages are the only turns.

* Settings › "Demo tool: time in a city" (off by default) offers ``get_time_in_city`` live;
  "What time is it in Tokyo?" is called, shown as a tool-call row with its arguments, run in the
  page (Asia/Tokyo), answered with ``function_call_output`` + ``response.create``, and the reply
  speaks the result; an unknown city gets an error output and the conversation goes on; the rows
  are exported (.txt, .json) and cleared; turned off, the question is answered without a call;
* the setting is kept across a reload; at phone size, in the dark theme, the row fits and axe-core
  finds no serious violation with it on the page.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import DESKTOP, WEBSOCKET_DEMO, _disconnect, open_settings
from tests.e2e.test_browser_a11y import AXE, AXE_RUN, _contrast, _luminance
from tests.e2e.test_browser_ui import PHONE, UiBrowser, _no_sideways_scroll, ui_browser

pytestmark = pytest.mark.e2e

TOOL_NAME = "get_time_in_city"
WEEKDAYS = {"Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"}


@pytest.fixture(scope="module")
def embedded(module_gateway_factory: GatewayFactory) -> Gateway:
    return module_gateway_factory.start(
        {"engine": {"name": "embedded"}, "limits": {"max_sessions": 2}}, name="embedded-tools"
    )


@dataclass
class ToolsBrowser(UiBrowser):
    #: Every client event the page sent over its WebSocket(s), in order.
    sent_events: list[dict[str, Any]] = field(default_factory=list)

    def sent_of(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.sent_events if e.get("type") == event_type]

    def outputs(self) -> list[dict[str, Any]]:
        """The function_call_output items the page sent."""
        return [
            e["item"]
            for e in self.sent_of("conversation.item.create")
            if e.get("item", {}).get("type") == "function_call_output"
        ]


@contextlib.contextmanager
def tools_browser(
    tmp_path: Path, url: str, viewport: dict[str, int] = DESKTOP, *, mobile: bool = False
) -> Iterator[ToolsBrowser]:
    """:func:`ui_browser`, also recording what the page sends."""
    with ui_browser(tmp_path, url, viewport, mobile=mobile) as ui:
        # The same lists: ui_browser's listeners fill them and its exit checks the console errors.
        browser = ToolsBrowser(ui.page, ui.errors, ui.received)

        def on_sent(payload: str | bytes) -> None:
            with contextlib.suppress(ValueError):
                event = json.loads(payload)
                if isinstance(event, dict):
                    browser.sent_events.append(event)

        ui.page.on("websocket", lambda ws: ws.on("framesent", on_sent))
        yield browser


def _connect_push_to_talk(browser: ToolsBrowser) -> None:
    """Connect with turn detection off: no spoken turns, typed messages only."""
    page = browser.page
    open_settings(page)
    page.select_option("#turn", "none")
    page.get_by_role("button", name="Connect").click()
    browser.wait(
        "window.__demo.stats.state === 'connected' && !document.getElementById('text-input').disabled",
        30,
        "a connected push-to-talk session ready for typed messages",
    )


def _apply(browser: ToolsBrowser) -> None:
    browser.page.locator("#apply").click()
    browser.wait(
        "document.getElementById('settings-status').textContent.includes('applied to the live session')",
        10,
        "settings applied to the live session",
    )


def _ask(browser: ToolsBrowser, text: str) -> None:
    page = browser.page
    page.fill("#text-input", text)
    page.locator("#send-text").click()
    browser.wait(
        f"window.__demo.transcript().some(e => e.role === 'user' && e.text === {text!r})",
        10,
        f"the typed message {text!r}",
    )


def _wait_replies(browser: ToolsBrowser, count: int, timeout_s: float = 45) -> None:
    """``count`` replies in all are done, and no other is under way."""
    browser.wait(
        f"window.__demo.stats.responses >= {count} && window.__demo.stats.assistantState === 'listening'",
        timeout_s,
        f"{count} finished replies",
    )


def _last_tool_row(browser: ToolsBrowser) -> dict[str, Any]:
    rows = [e for e in browser.js("window.__demo.transcript()") if e["role"] == "tool"]
    assert rows, browser.js("window.__demo.transcript()")
    return rows[-1]  # type: ignore[no-any-return]


def _calls(browser: ToolsBrowser) -> list[dict[str, Any]]:
    return browser.events("response.function_call_arguments.done")


def test_demo_tool_is_called_run_in_the_page_and_its_result_spoken(embedded: Gateway, tmp_path: Path) -> None:
    with tools_browser(tmp_path, embedded.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect_push_to_talk(browser)
        # The engine says it calls functions; the line under the header says so.
        assert browser.events("session.created")[0]["session"]["capabilities"]["function_calling"] is True
        abilities = page.locator("#abilities").inner_text()
        assert "function calling" in abilities, abilities

        # Off by default: the first session.update offers no tools.
        checkbox = page.get_by_role("checkbox", name="Demo tool: time in a city")
        assert not checkbox.is_checked()
        assert all("tools" not in e["session"] for e in browser.sent_of("session.update"))
        # On, applied live: the update offers the function and the gateway takes it.
        checkbox.check()
        _apply(browser)
        update = browser.sent_of("session.update")[-1]["session"]
        assert update["tool_choice"] == "auto"
        assert update["tools"] == [
            {
                "type": "function",
                "name": TOOL_NAME,
                "description": "The current local time in a named city.",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string", "description": "The city"}},
                    "required": ["city"],
                },
            }
        ]
        assert [t["name"] for t in browser.events("session.updated")[-1]["session"]["tools"]] == [TOOL_NAME]

        # The question: the model calls the function, the page shows the call in its own row.
        _ask(browser, "What time is it in Tokyo?")
        browser.wait(
            "window.__demo.transcript().some(e => e.role === 'tool' && e.output !== null)",
            30,
            "a tool-call row with its result",
        )
        (call,) = _calls(browser)
        assert call["name"] == TOOL_NAME and json.loads(call["arguments"]) == {"city": "Tokyo"}
        row = _last_tool_row(browser)
        assert row["name"] == TOOL_NAME and row["call_id"] == call["call_id"] and row["final"], row
        assert json.loads(row["arguments"]) == {"city": "Tokyo"}
        assert row["text"] == f"{TOOL_NAME}({row['arguments']})"
        # As the arguments streamed: the deltas put together are the row's arguments.
        deltas = [e["delta"] for e in browser.events("response.function_call_arguments.delta")]
        assert "".join(deltas) == row["arguments"]
        tool_li = page.locator("#transcript .msg.tool").last
        shown = tool_li.inner_text()
        assert TOOL_NAME in shown and '"city"' in shown and "Tokyo" in shown, shown
        # Its label is words; the wrench is decoration.
        assert tool_li.locator(".who").inner_text().lower() == "tool call"
        assert tool_li.locator(".icon").get_attribute("aria-hidden") == "true"

        # The page ran it and answered: the output names Tokyo's zone and its local time.
        (output,) = browser.outputs()
        assert output["call_id"] == call["call_id"]
        result = json.loads(output["output"])
        assert result["city"] == "Tokyo" and result["time_zone"] == "Asia/Tokyo", result
        assert re.fullmatch(r"\d{1,2}:\d{2} [AP]M", result["local_time"]), result
        assert result["day"] in WEEKDAYS, result
        assert "Asia/Tokyo" in tool_li.locator(".result").inner_text()
        # Output first, then the reply that uses it.
        kinds = [e["type"] for e in browser.sent_events]
        i_output = next(
            i
            for i, e in enumerate(browser.sent_events)
            if e["type"] == "conversation.item.create" and e["item"]["type"] == "function_call_output"
        )
        assert "response.create" in kinds[i_output + 1 :], kinds[i_output:]

        # The second reply speaks the function's result.
        browser.wait(
            "window.__demo.transcript().some(e => e.role === 'assistant' && e.final && /Tokyo/.test(e.text))",
            45,
            "a spoken reply about Tokyo",
        )
        _wait_replies(browser, 2)
        roles = [e["role"] for e in browser.js("window.__demo.transcript()")]
        assert roles[-3:] == ["user", "tool", "assistant"], roles
        done = [e for e in browser.events("response.done") if e["response"]["status"] == "completed"]
        assert [o["type"] for o in done[-1]["response"]["output"]] == ["message"]

        # A city the page does not know: an error output, and the conversation goes on.
        _ask(browser, "What time is it in Atlantis?")
        browser.wait("window.__demo.stats.toolOutputsSent === 2", 30, "the second function output")
        assert json.loads(browser.outputs()[-1]["output"]) == {"error": "unknown city: Atlantis"}
        assert json.loads(_calls(browser)[-1]["arguments"]) == {"city": "Atlantis"}
        assert "unknown city: Atlantis" in page.locator("#transcript .msg.tool").last.inner_text()
        _wait_replies(browser, 4)
        last = browser.js("window.__demo.transcript()")[-1]
        assert last["role"] == "assistant" and last["final"] and "Atlantis" in last["text"], last

        # Export: the calls and their results are in both files.
        with page.expect_download() as info:
            page.locator("#export-txt").click()
        text = Path(info.value.path()).read_text(encoding="utf-8")
        calls = re.findall(rf"^\[[^\]]+\] Tool call: {TOOL_NAME}\((.*)\)$", text, re.MULTILINE)
        assert [json.loads(args) for args in calls] == [{"city": "Tokyo"}, {"city": "Atlantis"}], text
        results = re.findall(r"^\[[^\]]+\] Tool result: (.*)$", text, re.MULTILINE)
        assert [json.loads(r).get("time_zone") for r in results] == ["Asia/Tokyo", None], text
        assert "You: What time is it in Tokyo?" in text, text
        with page.expect_download() as info:
            page.locator("#export-json").click()
        doc = json.loads(Path(info.value.path()).read_text(encoding="utf-8"))
        tools = [i for i in doc["items"] if i["role"] == "tool"]
        assert [json.loads(i["arguments"]) for i in tools] == [{"city": "Tokyo"}, {"city": "Atlantis"}], tools
        assert json.loads(tools[0]["output"])["time_zone"] == "Asia/Tokyo"
        assert tools[0]["name"] == TOOL_NAME and tools[0]["call_id"] == call["call_id"]

        # Clear takes the rows too.
        page.locator("#clear-transcript").click()
        assert page.locator("#transcript .msg").count() == 0
        assert browser.js("window.__demo.transcript()") == []

        # Off again, applied live: `tools: []`, and the question is answered without a call.
        checkbox.uncheck()
        _apply(browser)
        assert browser.sent_of("session.update")[-1]["session"]["tools"] == []
        assert browser.events("session.updated")[-1]["session"]["tools"] == []
        replies = browser.js("window.__demo.stats.responses")
        _ask(browser, "What time is it in Tokyo?")
        _wait_replies(browser, replies + 1)
        assert len(_calls(browser)) == 2 and len(browser.outputs()) == 2
        answer = browser.js("window.__demo.transcript()")[-1]
        assert answer["role"] == "assistant" and answer["final"] and answer["text"], answer
        assert page.locator("#transcript .msg.tool").count() == 0

        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)


def test_tool_row_fits_a_phone_in_the_dark_and_passes_axe(embedded: Gateway, tmp_path: Path) -> None:
    assert AXE.exists(), f"axe-core is not installed: run `npm ci --prefix tests/browser` (looked for {AXE})"
    with tools_browser(tmp_path, embedded.base_url + WEBSOCKET_DEMO, PHONE, mobile=True) as browser:
        page = browser.page
        page.emulate_media(color_scheme="dark")
        # Kept like the other settings: saved with Apply, still on after a reload.
        open_settings(page)
        checkbox = page.get_by_role("checkbox", name="Demo tool: time in a city")
        assert not checkbox.is_checked()
        checkbox.check()
        page.locator("#apply").click()
        browser.wait(
            "document.getElementById('settings-status').textContent.includes('Used when you connect')",
            5,
            "settings saved",
        )
        page.reload(wait_until="load")
        open_settings(page)
        assert checkbox.is_checked()

        # Offered from the first session.update on.
        _connect_push_to_talk(browser)
        assert [t["name"] for t in browser.sent_of("session.update")[0]["session"]["tools"]] == [TOOL_NAME]
        _ask(browser, "What time is it in São Paulo?")
        browser.wait("window.__demo.stats.toolOutputsSent === 1", 30, "the function output")
        assert json.loads(browser.outputs()[0]["output"])["time_zone"] == "America/Sao_Paulo"
        _wait_replies(browser, 2)

        row = page.locator("#transcript .msg.tool").last
        row.scroll_into_view_if_needed()
        box = row.bounding_box()
        assert box and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, box
        _no_sideways_scroll(page)
        # Dark: the row's code and its label are readable on it.
        colors = row.evaluate(
            """(el) => ({ row: getComputedStyle(el).backgroundColor,
                          code: getComputedStyle(el.querySelector('code')).color,
                          label: getComputedStyle(el.querySelector('.who')).color })"""
        )
        assert _luminance(colors["row"]) < 0.05, colors  # the dark theme's row, not a light patch
        assert _contrast(colors["code"], colors["row"]) >= 7, colors
        assert _contrast(colors["label"], colors["row"]) >= 4.5, colors

        page.add_script_tag(path=str(AXE))
        for scheme in ("dark", "light"):
            page.emulate_media(color_scheme=scheme)
            violations = page.evaluate(AXE_RUN)
            assert violations == [], (scheme, json.dumps(violations, indent=1))
        assert browser.js("window.__demo.errors") == []
        _disconnect(browser)
