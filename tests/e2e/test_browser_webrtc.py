"""Chromium running OpenAI's documented WebRTC snippet from a page on another origin, against a real gateway.

The page (``tests/e2e/pages/openai_webrtc.html``) is served by a plain HTTP server on another port
(another origin); it holds an ephemeral key the test minted with an API key, as the guide's
server does. Debian's Chromium, with a fake microphone looping the speech fixture, posts its
offer cross-origin (a CORS preflight first), talks and is answered on the track. Every packet
stays on 127.0.0.1 (``--allow-loopback-in-peer-connection``); any console error fails the test.

The demo page, at its defaults, makes the same call: it converses with the embedded engine over
WebRTC, says so, and is cut off by its looping microphone at the gateway.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import Gateway, GatewayFactory
from tests.e2e.test_browser import (
    CHROMIUM_FLAGS,
    Browser,
    _connect,
    _disconnect,
    _wait_sessions,
    chromium,
    chromium_page,
)

pytestmark = pytest.mark.e2e

PAGES = Path(__file__).resolve().parent / "pages"
KEY = "sk-webrtc-server"


@contextlib.contextmanager
def _page_server() -> Iterator[str]:
    """``tests/e2e/pages`` over HTTP on a port of its own: an origin that is not the gateway's."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(PAGES))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _mint(gateway: Gateway) -> str:
    request = urllib.request.Request(
        gateway.base_url + "/v1/realtime/client_secrets",
        data=json.dumps({"session": {"type": "realtime", "instructions": "Say it back."}}).encode(),
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return str(json.loads(response.read())["value"])


@pytest.fixture
def gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start(
        {
            "server": {"web_demo": False},
            "auth": {
                "keys": [{"name": "server", "key": KEY, "scopes": ["realtime", "client_secrets"]}],
                "token_secret": "a-token-secret-of-at-least-32-chars!",
            },
            "webrtc": {"host_addresses": ["127.0.0.1"]},
        },
        name="webrtc-browser",
    )


def _types(page: Any) -> list[str]:
    return page.evaluate("window.__events.map(e => e.type)")  # type: ignore[no-any-return]


def test_openais_browser_snippet_converses_from_another_origin(gateway: Gateway, tmp_path: Path) -> None:
    flags = [*CHROMIUM_FLAGS, "--allow-loopback-in-peer-connection"]
    with _page_server() as origin, chromium_page(tmp_path, flags=flags) as page:
        browser = Browser(page)
        page.on("console", lambda m: browser.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: browser.errors.append(f"pageerror: {exc}"))
        page.goto(
            f"{origin}/openai_webrtc.html?key={_mint(gateway)}&base={gateway.base_url}", wait_until="load"
        )
        state = "({failed: window.__failed, events: window.__events.map(e => e.type).slice(-30)})"

        def wait(expression: str, timeout_s: float, what: str) -> None:
            from playwright.sync_api import TimeoutError as PlaywrightTimeout

            try:
                page.wait_for_function(expression, timeout=timeout_s * 1000, polling=100)
            except PlaywrightTimeout:
                raise AssertionError(f"no {what} within {timeout_s} s: {page.evaluate(state)}") from None

        wait("window.__events.some(e => e.type === 'session.created')", 20, "session.created")
        created = page.evaluate("window.__events.find(e => e.type === 'session.created')")
        assert created["session"]["instructions"] == "Say it back."  # the client secret's session
        wait("window.__events.some(e => e.type === 'output_audio_buffer.started')", 30, "reply on the track")
        wait("window.__events.some(e => e.type === 'response.done')", 30, "response.done")
        wait(
            "window.__events.some(e => e.type === 'output_audio_buffer.stopped')", 30, "the reply played out"
        )
        heard = page.evaluate("window.__heard()")
        assert heard["packets"] > 50 and heard["energy"] > 0, heard
        location = page.evaluate("window.__location")
        assert location is not None and location.startswith("/v1/realtime/calls/rtc_")
        types = _types(page)
        assert "input_audio_buffer.speech_started" in types and "error" not in types, types
        assert "response.output_audio.delta" not in types
        assert page.evaluate("window.__failed") is None
    assert browser.errors == [], browser.errors


# ---------------------------------------------------------------------------------------
# The demo page, which calls over WebRTC by default


@pytest.fixture
def embedded_demo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start(
        {
            "engine": {"name": "embedded"},
            "limits": {"max_sessions": 2},
            "webrtc": {"host_addresses": ["127.0.0.1"]},
        },
        name="webrtc-demo",
    )


def test_the_demo_page_converses_over_webrtc_by_default(embedded_demo: Gateway, tmp_path: Path) -> None:
    flags = [*CHROMIUM_FLAGS, "--allow-loopback-in-peer-connection"]
    with chromium(tmp_path, embedded_demo.base_url + "/", flags=flags) as browser:
        page = browser.page
        _connect(browser)
        # It says which transport it uses, and it is WebRTC: the microphone is the call's track.
        assert page.locator("#transport-badge").inner_text() == "WebRTC"
        assert page.evaluate("window.__demo.transport") == "webrtc"
        assert "Opus" in page.locator("#session-info").inner_text()

        browser.wait(
            "window.__demo.transcript().some(e => e.role === 'user' && e.final && /weather/i.test(e.text))",
            40,
            "final caller transcript with 'weather'",
        )
        # The reply plays on the gateway's track and comes out of the page.
        browser.wait(
            "window.__demo.events.some(e => e.type === 'output_audio_buffer.started')", 30, "reply track"
        )
        browser.wait("window.__demo.stats.heardMs > 300", 20, "reply audio heard")
        browser.wait("window.__demo.stats.lastLatencyMs > 0", 10, "latency measurement")
        assert page.locator("#timeline .turn").count() >= 1

        # The looping microphone talks over a reply: the gateway stops its track and truncates the
        # item at what it played, with no truncate from the page.
        browser.wait(
            "window.__demo.events.some(e => e.type === 'output_audio_buffer.cleared')"
            " && window.__demo.events.some(e => e.type === 'conversation.item.truncated')",
            40,
            "barge-in: track cleared and item truncated by the gateway",
        )
        browser.wait(
            "document.querySelector('#transcript .msg.assistant.interrupted') !== null", 5, "cut bubble"
        )

        sent = page.evaluate("window.__demo.sent")
        assert "input_audio_buffer.append" not in sent and "conversation.item.truncate" not in sent, sent
        rtc = page.evaluate("window.__demo.stats.rtc")
        assert rtc is not None and rtc["packetsSent"] > 50 and rtc["packetsReceived"] > 50, rtc
        assert page.evaluate("window.__demo.errors") == []
        _disconnect(browser)
    _wait_sessions(embedded_demo, 0, 10)
