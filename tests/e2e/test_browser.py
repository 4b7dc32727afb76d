"""The browser demo end to end: a real browser talks to a real gateway.

Debian's Chromium (``/usr/bin/chromium``; ``.ci/run`` installs it) runs headless under Playwright
for Python with a fake microphone that loops a WAV made from the speech fixture ("Please send me
the weather report for Tuesday morning.") padded with silence. The page connects through its own
Connect button; everything is read back from its DOM and its ``window.__demo`` counters, and any
console error or uncaught exception on the page fails the test.

* With the embedded engine the caller speaks, is transcribed, hears the spoken reply, and, because
  the file loops, speaks again over a reply: a barge-in that flushes playback and truncates.
* With the echo engine (quick to start) a dropped socket is resumed with ``session.resume``, a
  refused resume falls back to a new session, and the page's resampler and codecs are checked
  in the browser's own JavaScript engine.

Set ``WEB_DEMO_SCREENSHOT=<path>`` to keep a screenshot of the conversation; the conversation test
always writes one into its temporary directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import soxr

from tests.e2e.helpers import SPEECH_WAV, Gateway, GatewayFactory

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")

#: The fake microphone's loop: the sentence twice, after a short and after a long pause.
#: The reply ("You said: please send me the weather report ...") lasts ~3 s and starts X s after
#: the VAD's 0.5 s of end-of-turn silence. After the short pause the next sentence talks over the
#: reply whenever X < ~2.3 s; after the long one the reply has time to start for X < ~4.8 s and is
#: still playing when the loop comes round for X > ~1.6 s. So a fast machine and a loaded one
#: both get a heard reply and a barge-in within one pass of the loop.
LEAD_S = 0.8
SHORT_PAUSE_S = 2.0
LONG_PAUSE_S = 4.5
MIC_RATE = 48_000

#: Flags from the reference setup; --user-data-dir is Playwright's user_data_dir argument.
CHROMIUM_FLAGS = [
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
    "--autoplay-policy=no-user-gesture-required",
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

#: The demo page pinned to its WebSocket transport (WebRTC is its default): the tests that read
#: the WebSocket path's own counters (frames, jitter buffer, truncates, resume) open this.
WEBSOCKET_DEMO = "/?transport=websocket"

#: What the page knows, for failure messages.
PAGE_STATE = (
    "({stats: window.__demo.stats, sent: window.__demo.sent, errors: window.__demo.errors,"
    " transcript: window.__demo.transcript(), events: window.__demo.events.slice(-25).map(e => e.type)})"
)


def _fake_mic_wav(path: Path) -> Path:
    speech, rate = sf.read(SPEECH_WAV, dtype="float32", always_2d=False)
    if speech.ndim > 1:
        speech = speech.mean(axis=1)
    speech = soxr.resample(speech, rate, MIC_RATE).astype(np.float32)

    def silence(seconds: float) -> np.ndarray:
        return np.zeros(int(seconds * MIC_RATE), dtype=np.float32)

    loop = [silence(LEAD_S), speech, silence(SHORT_PAUSE_S), speech, silence(LONG_PAUSE_S)]
    sf.write(path, np.concatenate(loop), MIC_RATE, subtype="PCM_16")
    return path


@dataclass
class Browser:
    page: Any
    #: Console messages of type error and uncaught page exceptions.
    errors: list[str] = field(default_factory=list)

    def wait(self, expression: str, timeout_s: float, what: str) -> None:
        """Wait for a JS expression to be truthy; on timeout, say what is missing and what the page saw."""
        from playwright.sync_api import TimeoutError as PlaywrightTimeout

        try:
            self.page.wait_for_function(expression, timeout=timeout_s * 1000, polling=100)
        except PlaywrightTimeout:
            raise AssertionError(
                f"no {what} within {timeout_s} s; page state: {self.page.evaluate(PAGE_STATE)}"
            ) from None

    def stats(self) -> dict[str, Any]:
        return self.page.evaluate("window.__demo.stats")  # type: ignore[no-any-return]


#: The desktop window the tests use.
DESKTOP = {"width": 1280, "height": 860}


@contextlib.contextmanager
def chromium_page(
    tmp_path: Path, *, flags: list[str] | None = None, viewport: dict[str, int] = DESKTOP, **context: Any
) -> Iterator[Any]:
    """A page of headless Debian Chromium with the looping fake microphone and a fresh profile.

    ``flags`` replace :data:`CHROMIUM_FLAGS`; ``context`` goes to Playwright's persistent context
    (``is_mobile``, ``ignore_https_errors``, ...).
    """
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is not installed (Debian package 'chromium'; .ci/run installs it)")
    from playwright.sync_api import sync_playwright

    wav = _fake_mic_wav(tmp_path / "mic.wav")
    profile = tmp_path / "chromium-profile"
    profile.mkdir()
    with sync_playwright() as pw:
        browser_context = pw.chromium.launch_persistent_context(
            user_data_dir=str(profile),
            executable_path=str(CHROMIUM),
            headless=True,
            args=[*(CHROMIUM_FLAGS if flags is None else flags), f"--use-file-for-fake-audio-capture={wav}"],
            viewport=viewport,
            timeout=30_000,
            **context,
        )
        try:
            page = browser_context.pages[0] if browser_context.pages else browser_context.new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser_context.close()


def evaluate_on_page(gateway: Gateway, tmp_path: Path, script: str) -> Any:
    """Run ``script`` (an async function's source) on the demo page ``gateway`` serves; its result.

    For the page's modules on their own: the script imports them from the page's origin. Fails
    the test on any error the page throws meanwhile.
    """
    with chromium_page(tmp_path) as page:
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(gateway.base_url + WEBSOCKET_DEMO, wait_until="load")
        result = page.evaluate(script)
    assert errors == [], errors
    return result


@contextlib.contextmanager
def chromium(tmp_path: Path, url: str, flags: list[str] | None = None) -> Iterator[Browser]:
    """:func:`chromium_page` showing ``url``; any console error or uncaught exception fails the test."""
    with chromium_page(tmp_path, flags=flags) as page:
        browser = Browser(page)
        page.on("console", lambda m: browser.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: browser.errors.append(f"pageerror: {exc}"))
        page.goto(url, wait_until="load")
        yield browser
    assert browser.errors == [], browser.errors


def open_settings(page: Any) -> None:
    """Open the Settings panel unless it is open."""
    if not page.evaluate("document.getElementById('settings-panel').open"):
        page.locator("#settings-panel > summary").click()


def _connect(browser: Browser) -> None:
    browser.page.get_by_role("button", name="Connect").click()
    browser.wait(
        "window.__demo.stats.state === 'connected' && window.__demo.stats.framesSent > 0",
        20,
        "connected session streaming microphone audio",
    )


def _wait_sessions(gateway: Gateway, expected: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (sessions := gateway.readyz()["sessions"]) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sessions == expected, f"the gateway holds {sessions} sessions, expected {expected}"


def _disconnect(browser: Browser) -> None:
    browser.page.get_by_role("button", name="Disconnect").click()
    browser.wait("window.__demo.stats.state === 'idle'", 10, "disconnected state")


# ---------------------------------------------------------------------------------------
# A spoken conversation through the embedded engine


@pytest.fixture
def embedded(gateway_factory: GatewayFactory) -> Gateway:
    # server.web_demo defaults to on: the page is served at /.
    return gateway_factory.start(
        {"engine": {"name": "embedded"}, "limits": {"max_sessions": 2}}, name="embedded"
    )


def test_voice_chat_page_transcribes_answers_and_is_interrupted(embedded: Gateway, tmp_path: Path) -> None:
    with chromium(tmp_path, embedded.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        assert page.locator("#conn-text").inner_text() == "Connected"

        # The caller's words, as the final transcript in a caller bubble.
        browser.wait(
            "window.__demo.transcript().some(e => e.role === 'user' && e.final && /weather/i.test(e.text))",
            40,
            "final caller transcript with 'weather'",
        )
        bubble = page.locator("#transcript .msg.user", has_text=re.compile("weather", re.IGNORECASE)).first
        assert "tuesday" in bubble.inner_text().lower()

        # The reply is heard: the playback worklet rendered samples.
        browser.wait("window.__demo.stats.samplesPlayed > 0", 20, "reply audio played")

        # The turn's latency is measured and shown, with a bar in the timeline.
        browser.wait("window.__demo.stats.lastLatencyMs > 0", 10, "latency measurement")
        browser.wait(
            "/^\\d+$/.test(document.getElementById('latency-value').textContent)", 2, "latency figure"
        )
        assert page.locator("#timeline .turn").count() >= 1

        # The looping microphone talks over a reply: playback is flushed and the gateway told how
        # much was heard (conversation.item.truncate, answered by conversation.item.truncated).
        browser.wait(
            "window.__demo.stats.flushes >= 1 && (window.__demo.sent['conversation.item.truncate'] || 0) >= 1",
            35,
            "barge-in flush + truncate",
        )
        browser.wait(
            "window.__demo.events.some(e => e.type === 'conversation.item.truncated')",
            5,
            "conversation.item.truncated",
        )
        assert page.locator("#transcript .msg.assistant.interrupted").count() >= 1
        browser.wait("document.getElementById('st-flushes').textContent !== '0'", 2, "barge-in count shown")

        page.wait_for_timeout(600)  # let the bars and bubbles settle for the picture
        shot = tmp_path / "screenshot.png"
        page.screenshot(path=str(shot))
        if target := os.environ.get("WEB_DEMO_SCREENSHOT"):
            shutil.copyfile(shot, target)

        gateway_errors = page.evaluate("window.__demo.errors")
        assert gateway_errors == [], gateway_errors
        _disconnect(browser)
        _wait_sessions(embedded, 0, 10)


# ---------------------------------------------------------------------------------------
# Reconnect and resume, and the page's DSP, against the echo engine


#: How long the echo gateway keeps a dropped session for session.resume.
RESUME_GRACE_S = 6


@pytest.fixture
def echo(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start(
        {"limits": {"max_sessions": 4, "resume_grace_s": RESUME_GRACE_S}}, name="echo"
    )


def test_dropped_connection_resumes_the_session_or_starts_a_new_one(echo: Gateway, tmp_path: Path) -> None:
    with chromium(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        page = browser.page
        _connect(browser)
        first = page.evaluate("window.__demo.client.sessionId")
        assert first and page.evaluate("window.__demo.client.resumeToken")

        # An abnormal close (not 1000/1001): the gateway keeps the session, the page resumes it.
        page.evaluate("window.__demo.client.ws.close(4999, 'simulated network drop')")
        browser.wait(
            "window.__demo.stats.resumes === 1 && window.__demo.stats.state === 'connected'",
            15,
            "resumed session",
        )
        assert page.evaluate("window.__demo.client.sessionId") == first
        assert page.evaluate("window.__demo.sent['session.resume']") == 1
        sent_before = browser.stats()["framesSent"]
        browser.wait(
            f"window.__demo.stats.framesSent > {sent_before + 10}", 5, "audio streaming after resume"
        )

        # A resume the gateway refuses (here: a wrong token) falls back to a fresh session.
        page.evaluate("window.__demo.client.resumeToken = 'not-the-token'")
        page.evaluate("window.__demo.client.ws.close(4999, 'simulated network drop')")
        browser.wait(
            f"window.__demo.stats.state === 'connected' && window.__demo.client.sessionId !== {first!r}",
            15,
            "new session after a refused resume",
        )
        assert page.evaluate("window.__demo.sent['session.resume']") == 2
        assert page.locator("#transcript .divider", has_text="New session").count() == 1
        # The refusal is handled, not reported as a failure.
        assert page.evaluate("window.__demo.errors") == []

        # Disconnect ends the live session at once (session.close + 1000), not after the grace;
        # the session abandoned by the refused resume waits out its grace and is freed too.
        _wait_sessions(echo, 2, 2)
        _disconnect(browser)
        _wait_sessions(echo, 1, 2)
        _wait_sessions(echo, 0, RESUME_GRACE_S + 4)


#: Runs in the page: the worklets' resampler (fed in uneven blocks, as audio arrives) and codecs.
DSP_CHECK = """async () => {
  const { StreamResampler } = await import('/lib/resampler.js');
  const { encode, decode } = await import('/lib/codecs.js');
  const sine = (n, f, rate) => Float32Array.from({ length: n }, (_, i) => 0.5 * Math.sin(2 * Math.PI * f * i / rate));
  const snr = (y, f, rate, skip) => {
    let e = 0, p = 0;
    for (let n = skip; n < y.length - skip; n++) {
      const ideal = 0.5 * Math.sin(2 * Math.PI * f * n / rate);
      e += (y[n] - ideal) ** 2; p += ideal ** 2;
    }
    return 10 * Math.log10(p / e);
  };
  const out = {};
  for (const [from, to, f] of [[48000, 24000, 1000], [44100, 16000, 3000], [24000, 44100, 2000], [22050, 48000, 5000]]) {
    const x = sine(from, f, from);
    const r = new StreamResampler(from, to);
    const parts = [];
    for (let i = 0, k = 0; i < x.length; k++) {
      const size = [128, 77, 1000, 3][k % 4];
      parts.push(r.process(x.subarray(i, i + size)));
      i += size;
    }
    parts.push(r.flush());
    const y = new Float32Array(parts.reduce((s, p) => s + p.length, 0));
    let o = 0;
    for (const p of parts) { y.set(p, o); o += p.length; }
    out[`${from}->${to}`] = { length: y.length, snr: snr(y, f, to, 200) };
  }
  // A tone above the new Nyquist must be filtered out, not folded into the speech band.
  const alias = new StreamResampler(48000, 16000).process(sine(48000, 11000, 48000));
  out.aliasRms = Math.sqrt(alias.slice(200, -200).reduce((s, v) => s + v * v, 0) / (alias.length - 400));
  const x = sine(4000, 440, 8000);
  for (const name of ['pcm16', 'pcm_f32le', 'g711_ulaw', 'g711_alaw']) {
    const y = decode(new Uint8Array(encode(x, name)), name);
    out[name] = { length: y.length, snr: snr(y, 440, 8000, 0) };
  }
  return out;
}"""


def test_page_resampler_and_codecs(echo: Gateway, tmp_path: Path) -> None:
    from tests.e2e.helpers import decode as reference_decode

    with chromium(tmp_path, echo.base_url + WEBSOCKET_DEMO) as browser:
        result = browser.page.evaluate(DSP_CHECK)
        # Reference check of the wire bytes: the page's G.711 and PCM16 decode like the test helpers'.
        wire = browser.page.evaluate(
            """async () => {
              const { encode } = await import('/lib/codecs.js');
              const x = Float32Array.from({ length: 2001 }, (_, i) => -1 + i / 1000);
              return Object.fromEntries(['pcm16', 'g711_ulaw', 'g711_alaw'].map(
                n => [n, Array.from(new Uint8Array(encode(x, n)))]));
            }"""
        )
    for pair in ("48000->24000", "44100->16000", "24000->44100", "22050->48000"):
        target = int(pair.split("->")[1])
        assert result[pair]["length"] == target, (pair, result[pair])  # one second in, one second out
        assert result[pair]["snr"] > 70, (pair, result[pair])
    assert result["aliasRms"] < 1e-3, result["aliasRms"]
    assert result["pcm16"]["snr"] > 80 and result["pcm_f32le"]["snr"] > 120, result
    assert result["g711_ulaw"]["snr"] > 30 and result["g711_alaw"]["snr"] > 30, result
    x = np.array([-1 + i / 1000 for i in range(2001)], dtype=np.float32)
    for name, data in wire.items():
        decoded = reference_decode(bytes(data), name)
        assert np.max(np.abs(decoded - x)) < (0.07 if name != "pcm16" else 1e-4), name
