"""The browser demo when things go wrong: it says what happened, where the user looks, and what to do.

Same set-up as :mod:`tests.e2e.test_browser` (Debian Chromium headless under Playwright, a looping
fake microphone, a real gateway; any console error fails a test), with the browser varied per case:

* an insecure origin (plain http to a name other than localhost, through a host-resolver rule):
  the page says to use https, localhost or an SSH tunnel, and Connect is disabled;
* the microphone blocked (no fake permission prompt, prompts denied): "allow the microphone";
* a wrong API key: the gateway's own message, no retry, the key printed nowhere;
* a key with a space, "/" and "=" (not a subprotocol token): sent encoded, accepted end to end;
* a full gateway (``limits.max_sessions: 1``): "the gateway is full, try again later", no retry;
* an unreachable URL: a countdown that counts, a Retry button, and the attempts stop;
* the gateway stopped after the page loaded: "cannot reach the gateway", not a busy microphone;
* the gateway serving https/wss itself (``serve --ssl-certfile/--ssl-keyfile``), used from a
  non-localhost name.

Resuming a dropped session is :func:`tests.e2e.test_browser.test_dropped_connection_resumes_the_session_or_starts_a_new_one`.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import ipaddress
import json
import re
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.helpers import PYTHON, REPO, Gateway, GatewayFactory, free_port, gateway_env
from tests.e2e.test_browser import (
    CHROMIUM_FLAGS,
    WEBSOCKET_DEMO,
    Browser,
    _connect,
    _disconnect,
    chromium_page,
    open_settings,
)

pytestmark = pytest.mark.e2e

#: Console errors Chromium itself logs for a WebSocket it could not open (not the page's own).
BROWSER_WS_FAILURE = re.compile(r"^WebSocket connection to '[^']*' failed")
#: What Chromium itself logs for a handshake the gateway refuses before the upgrade (the failed
#: WebSocket), and for the refusal ``GET /v1/auth/check`` then answers with (a status it logs as an error).
BROWSER_REFUSAL = re.compile(
    r"^WebSocket connection to '[^']*' failed"
    r"|^Failed to load resource: the server responded with a status of (401|403|429|503) "
)


@dataclass
class Page(Browser):
    #: Every console message, of any type (the API key must appear in none).
    console: list[str] = field(default_factory=list)

    def notice(self) -> str:
        return self.page.locator("#status-bar").inner_text()  # type: ignore[no-any-return]

    def demo(self, expression: str) -> Any:
        return self.page.evaluate(expression)


@contextlib.contextmanager
def browser_at(
    tmp_path: Path,
    url: str,
    *,
    extra_flags: tuple[str, ...] = (),
    fake_permission_ui: bool = True,
    ignore_https_errors: bool = False,
    allowed_errors: re.Pattern[str] | None = None,
) -> Iterator[Page]:
    """Like :func:`tests.e2e.test_browser.chromium`, with flags to vary the browser."""
    flags = [f for f in CHROMIUM_FLAGS if fake_permission_ui or f != "--use-fake-ui-for-media-stream"]
    with chromium_page(
        tmp_path, flags=[*flags, *extra_flags], ignore_https_errors=ignore_https_errors
    ) as page:
        browser = Page(page)

        def on_console(message: Any) -> None:
            browser.console.append(f"{message.type}: {message.text}")
            if message.type == "error" and not (allowed_errors and allowed_errors.search(message.text)):
                browser.errors.append(message.text)

        page.on("console", on_console)
        page.on("pageerror", lambda exc: browser.errors.append(f"pageerror: {exc}"))
        page.goto(url, wait_until="load")
        yield browser
    assert browser.errors == [], browser.errors


def _set_api_key(page: Any, key: str) -> None:
    open_settings(page)
    page.fill("#api-key", key)


def _assert_key_hidden(browser: Page, key: str) -> None:
    """The key is in no text, markup, console message or recorded error of the page."""
    page = browser.page
    assert key not in page.content()
    assert key not in page.evaluate("document.body.innerText")
    assert key not in json.dumps(page.evaluate("window.__demo.errors"))
    leaked = [m for m in browser.console if key in m]
    assert leaked == [], leaked


def _status_next_to_connect(page: Any) -> None:
    """The status line is shown right under the top bar with Connect, not in a side card."""
    assert page.locator(".card #notice").count() == 0
    status = page.locator("#status-bar").bounding_box()
    connect = page.locator("#connect").bounding_box()
    assert status and connect and status["y"] < connect["y"] + connect["height"] + 40, (status, connect)


def _observe(
    browser: Page, seconds: float, until: str | None = None
) -> list[tuple[str, int | None, int, str]]:
    """(state, countdown seconds, reconnects, status text) every 100 ms for ``seconds`` or until ``until``."""
    samples: list[tuple[str, int | None, int, str]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        state, seconds_left, reconnects, text = browser.demo(
            "[window.__demo.stats.state, window.__demo.stats.retryInS, window.__demo.stats.reconnects,"
            " document.getElementById('status-bar').innerText]"
        )
        samples.append((state, seconds_left, reconnects, text))
        if state == until:
            break
        time.sleep(0.1)
    return samples


@pytest.fixture
def echo_gateway(gateway_factory: GatewayFactory) -> Gateway:
    return gateway_factory.start({"limits": {"max_sessions": 2}}, name="echo")


# ---------------------------------------------------------------------------------------
# Remote use over plain http, and the gateway serving https itself


def test_insecure_origin_says_what_to_do_and_disables_connect(echo_gateway: Gateway, tmp_path: Path) -> None:
    url = f"http://gw.test:{echo_gateway.port}/"
    flags = ("--host-resolver-rules=MAP gw.test 127.0.0.1",)
    with browser_at(tmp_path, url, extra_flags=flags) as browser:
        page = browser.page
        assert page.evaluate("window.isSecureContext") is False
        browser.wait("!document.getElementById('status-bar').hidden", 5, "status line")
        text = browser.notice()
        for words in (
            "secure",
            "https",
            "--ssl-certfile",
            f"http://localhost:{echo_gateway.port}/",
            "127.0.0.1",
        ):
            assert words in text, (words, text)
        assert f"ssh -L {echo_gateway.port}:localhost:{echo_gateway.port} gw.test" in text, text
        assert page.locator("#connect").is_disabled()
        _status_next_to_connect(page)
        assert echo_gateway.readyz()["sessions"] == 0


def _self_signed(tmp_path: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gw.test")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("gw.test"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


@contextlib.contextmanager
def tls_gateway(tmp_path: Path, cert: Path, key: Path) -> Iterator[int]:
    """``serve --ssl-certfile --ssl-keyfile`` (echo engine); yields its port once https ``/readyz`` answers."""
    port = free_port()
    config = tmp_path / "tls.yaml"
    config.write_text(yaml.safe_dump({"engine": {"name": "echo"}, "limits": {"resume_grace_s": 0}}))
    stderr = tmp_path / "tls.stderr.log"
    cmd = [PYTHON, "-m", "duplex_gateway", "serve", "--config", str(config)]
    cmd += [
        "--ssl-certfile",
        str(cert),
        "--ssl-keyfile",
        str(key),
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    trust = ssl.create_default_context(cafile=str(cert))
    with open(stderr, "wb") as err:
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=gateway_env(), stdout=err, stderr=err, stdin=subprocess.DEVNULL
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, stderr.read_text(errors="replace")[-4000:]
            try:
                with urllib.request.urlopen(
                    f"https://127.0.0.1:{port}/readyz", timeout=1, context=trust
                ) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, stderr.read_text(errors="replace")[-4000:]
            time.sleep(0.1)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    log = stderr.read_text(errors="replace")
    assert "Traceback" not in log, log[-6000:]


def test_gateway_serves_https_and_wss_for_remote_browsers(tmp_path: Path) -> None:
    from websockets.sync.client import connect

    cert, key = _self_signed(tmp_path)
    with tls_gateway(tmp_path, cert, key) as port:
        trust = ssl.create_default_context(cafile=str(cert))
        with urllib.request.urlopen(f"https://127.0.0.1:{port}/", timeout=5, context=trust) as r:
            assert r.status == 200 and b"Duplex Gateway" in r.read()
        with connect(f"wss://127.0.0.1:{port}/v1/realtime", ssl=trust, open_timeout=5) as ws:
            assert json.loads(ws.recv(timeout=5))["type"] == "session.created"
        # A browser on another machine: https to a name that is not localhost is a secure context.
        flags = ("--host-resolver-rules=MAP gw.test 127.0.0.1",)
        with browser_at(
            tmp_path,
            f"https://gw.test:{port}/?transport=websocket",
            extra_flags=flags,
            ignore_https_errors=True,
        ) as browser:
            assert browser.page.evaluate("window.isSecureContext") is True
            assert browser.page.locator("#connect").is_enabled()
            _connect(browser)
            assert browser.page.evaluate("window.__demo.client.ws.url").startswith(f"wss://gw.test:{port}/")
            _disconnect(browser)


# ---------------------------------------------------------------------------------------
# The microphone blocked


def test_blocked_microphone_says_to_allow_it(echo_gateway: Gateway, tmp_path: Path) -> None:
    with browser_at(
        tmp_path,
        echo_gateway.base_url + WEBSOCKET_DEMO,
        fake_permission_ui=False,
        extra_flags=("--deny-permission-prompts",),
    ) as browser:
        page = browser.page
        page.get_by_role("button", name="Connect").click()
        browser.wait(
            "/allow the microphone/.test(document.getElementById('status-bar').innerText)",
            10,
            "'allow the microphone' in the status line",
        )
        assert page.locator("#status-bar").is_visible()
        _status_next_to_connect(page)
        assert "Permission denied" not in browser.notice()
        assert browser.demo("window.__demo.stats.state") == "idle"
        assert page.locator("#connect").inner_text() == "Connect"
        assert echo_gateway.readyz()["sessions"] == 0


# ---------------------------------------------------------------------------------------
# API keys


RIGHT_KEY = "right-key-8Hq2"
WRONG_KEY = "wrong-key-Zq93xv"
ODD_KEY = "my secret/key=with spaces=="


def test_wrong_api_key_shows_the_servers_message_and_is_not_retried(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    # The gateway refuses the handshake with HTTP 401 before the upgrade, which a page script cannot
    # read (its WebSocket just fails, close 1006): the page asks GET /v1/auth/check with the same key
    # and shows what the gateway says there.
    gw = gateway_factory.start({"auth": {"api_keys": [RIGHT_KEY]}}, name="auth")
    with browser_at(tmp_path, gw.base_url + WEBSOCKET_DEMO, allowed_errors=BROWSER_REFUSAL) as browser:
        page = browser.page
        _set_api_key(page, WRONG_KEY)
        page.get_by_role("button", name="Connect").click()
        browser.wait("window.__demo.stats.state === 'closed'", 15, "refused by the gateway")
        text = browser.notice()
        assert "check the API key" in text, text
        assert "the API key is not valid" in text, text  # the gateway's own words
        assert "401" in text and "unauthorized" in text, text
        _status_next_to_connect(page)
        assert page.locator("#retry").is_visible()
        # Refused is final: no reconnect loop.
        samples = _observe(browser, 2.5)
        assert {s[0] for s in samples} == {"closed"}, samples
        assert browser.demo("window.__demo.stats.reconnects") == 0
        assert gw.readyz()["sessions"] == 0
        _assert_key_hidden(browser, WRONG_KEY)


def test_api_key_with_space_slash_and_equals_is_accepted(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    gw = gateway_factory.start({"auth": {"api_keys": [ODD_KEY]}}, name="auth")
    with browser_at(tmp_path, gw.base_url + WEBSOCKET_DEMO) as browser:
        _set_api_key(browser.page, ODD_KEY)
        _connect(browser)
        assert browser.page.locator("#status-bar").is_hidden()
        assert gw.readyz()["sessions"] == 1
        _assert_key_hidden(browser, ODD_KEY)
        _disconnect(browser)


async def test_gateway_accepts_the_encoded_key_subprotocol(gateway_factory: GatewayFactory) -> None:
    """The form the page sends a non-token key in; the plain forms keep working."""
    from websockets.exceptions import InvalidStatus

    from tests.e2e.helpers import recv_event, ws_connect

    gw = gateway_factory.start({"auth": {"api_keys": [ODD_KEY, RIGHT_KEY]}}, name="auth")
    encoded = base64.urlsafe_b64encode(ODD_KEY.encode()).decode().rstrip("=")
    for protocol in (f"openai-insecure-api-key.b64.{encoded}", f"openai-insecure-api-key.{RIGHT_KEY}"):
        async with ws_connect(gw, subprotocols=["realtime", protocol]) as ws:
            assert (await recv_event(ws))["type"] == "session.created", protocol
    wrong = base64.urlsafe_b64encode(b"not the key").decode().rstrip("=")
    for protocol in (
        f"openai-insecure-api-key.b64.{wrong}",
        "openai-insecure-api-key.b64.%%%",
        "openai-insecure-api-key.b64.A",
    ):
        # Refused before the upgrade: HTTP 401 and the JSON error.
        with pytest.raises(InvalidStatus) as refused:
            async with ws_connect(gw, subprotocols=["realtime", protocol]):
                pass
        assert refused.value.response.status_code == 401, protocol
        assert json.loads(refused.value.response.body)["error"]["code"] == "unauthorized", protocol


# ---------------------------------------------------------------------------------------
# A full gateway, an unreachable one


def test_full_gateway_says_try_later_and_is_not_retried(
    gateway_factory: GatewayFactory, tmp_path: Path
) -> None:
    from websockets.sync.client import connect

    gw = gateway_factory.start({"limits": {"max_sessions": 1}}, name="full")
    with connect(gw.ws_url + "/v1/realtime", open_timeout=5) as held:
        assert json.loads(held.recv(timeout=5))["type"] == "session.created"
        with browser_at(tmp_path, gw.base_url + WEBSOCKET_DEMO) as browser:
            page = browser.page
            page.get_by_role("button", name="Connect").click()
            browser.wait("window.__demo.stats.state === 'closed'", 15, "closed by the gateway")
            text = browser.notice()
            assert "the gateway is full, try again later" in text.lower(), text
            assert "at its limit of 1 sessions" in text, text  # the gateway's own words
            assert "1013" in text, text
            assert "Connection lost" not in text and "reconnecting" not in text.lower(), text
            samples = _observe(browser, 2.5)
            assert {s[0] for s in samples} == {"closed"}, samples
            assert browser.demo("window.__demo.stats.reconnects") == 0
            # Room again: Retry connects.
            held.close()
            deadline = time.monotonic() + 5
            while gw.readyz()["sessions"] and time.monotonic() < deadline:
                time.sleep(0.1)
            page.locator("#retry").click()
            browser.wait("window.__demo.stats.state === 'connected'", 15, "connected after Retry")
            assert page.locator("#status-bar").is_hidden()
            _disconnect(browser)


def test_unreachable_url_counts_down_offers_retry_and_stops(echo_gateway: Gateway, tmp_path: Path) -> None:
    nowhere = f"ws://127.0.0.1:{free_port()}/v1/realtime"
    with browser_at(
        tmp_path, echo_gateway.base_url + WEBSOCKET_DEMO, allowed_errors=BROWSER_WS_FAILURE
    ) as browser:
        page = browser.page
        open_settings(page)
        page.fill("#url", nowhere)
        page.get_by_role("button", name="Connect").click()
        browser.wait("window.__demo.stats.state === 'reconnecting'", 10, "first retry scheduled")
        assert page.locator("#retry").is_visible() and page.locator("#retry").inner_text() == "Retry now"
        samples = _observe(browser, 20, until="failed")
        states = [s[0] for s in samples]
        assert states[-1] == "failed", samples[-5:]
        # The countdown counts: within one wait it shows each second down to 1.
        runs: dict[int, list[int]] = {}
        for _state, seconds, reconnects, _text in samples:
            if seconds is not None and (not runs.get(reconnects) or runs[reconnects][-1] != seconds):
                runs.setdefault(reconnects, []).append(seconds)
        longest = max(runs.values(), key=len)
        assert len(longest) >= 3 and longest == sorted(longest, reverse=True) and longest[-1] <= 1, runs
        # Never "connection lost" or "resuming" for a connection that never opened.
        texts = " ".join(s[3] for s in samples)
        assert "Cannot reach the gateway at " + nowhere in texts, texts[-500:]
        assert "Connection lost" not in texts and "resum" not in texts.lower(), texts[-500:]
        # The attempts stop: 1 + 3 retries, then nothing more.
        final = browser.notice()
        assert "Gave up after 4 attempts" in final, final
        assert browser.demo("window.__demo.stats.reconnects") == 3
        assert page.locator("#retry").is_visible() and page.locator("#retry").inner_text() == "Retry"
        _status_next_to_connect(page)
        time.sleep(2.5)
        assert browser.demo("window.__demo.stats.reconnects") == 3
        assert browser.demo("window.__demo.stats.state") == "failed"
        # Retry starts over, with the corrected URL it connects.
        page.fill("#url", "/v1/realtime")
        page.locator("#retry").click()
        browser.wait("window.__demo.stats.state === 'connected'", 15, "connected after Retry")
        assert page.locator("#status-bar").is_hidden()
        _disconnect(browser)


#: What Chromium logs for the page's own requests to a gateway that has stopped.
BROWSER_GATEWAY_GONE = re.compile(
    r"^Failed to load resource: net::ERR_CONNECTION_REFUSED|" + BROWSER_WS_FAILURE.pattern
)


def test_stopped_gateway_is_said_to_be_unreachable_not_a_busy_microphone(
    echo_gateway: Gateway, tmp_path: Path
) -> None:
    with browser_at(
        tmp_path, echo_gateway.base_url + WEBSOCKET_DEMO, allowed_errors=BROWSER_GATEWAY_GONE
    ) as browser:
        page = browser.page
        echo_gateway.stop()  # the page stays open, as after Ctrl-C on the gateway
        page.get_by_role("button", name="Connect").click()
        browser.wait(
            "document.getElementById('status-bar').innerText.includes('Cannot reach the gateway')",
            15,
            "the gateway named unreachable",
        )
        text = browser.notice()
        assert f"Cannot reach the gateway at {echo_gateway.base_url}" in text, text
        assert "microphone" not in text.lower() and "another application" not in text, text
        _status_next_to_connect(page)


def test_serve_refuses_missing_or_lone_tls_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from duplex_gateway.cli import main

    missing = str(tmp_path / "missing.pem")
    assert main(["serve", "--engine", "echo", "--ssl-certfile", missing, "--ssl-keyfile", missing]) == 2
    assert f"server.ssl_certfile: no such file: {missing}" in capsys.readouterr().err
    key = tmp_path / "key.pem"
    key.write_text("not used")
    assert main(["serve", "--engine", "echo", "--ssl-keyfile", str(key)]) == 2
    assert "server.ssl_keyfile needs server.ssl_certfile" in capsys.readouterr().err
