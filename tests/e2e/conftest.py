"""End-to-end fixtures: REAL gateway processes on loopback (see :mod:`tests.e2e.helpers`).

``gateway_factory`` (per test) and ``module_gateway_factory`` (per module) start
``python -m duplex_gateway serve --config <tmp yaml> --port <free> --host 127.0.0.1``
(or the ``duplex-gateway`` console script), wait for ``/readyz`` and stop it with
SIGTERM (SIGKILL after 10 s). Every gateway's stderr is captured to a file; a
``Traceback`` logged while a test runs fails that test, and one logged later
(for example at shutdown) fails the factory's teardown.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import _RUNNING, Gateway, GatewayFactory


@pytest.fixture
def gateway_factory(tmp_path: Path) -> Iterator[GatewayFactory]:
    """Start gateways for one test."""
    factory = GatewayFactory(tmp_path)
    yield factory
    factory.close()


@pytest.fixture
def webrtc_gateway(gateway_factory: GatewayFactory) -> Gateway:
    """A gateway with ``echo`` whose ICE offers 127.0.0.1, and this process's ICE offering it too."""
    # aiortc is the webrtc extra: imported only where a test calls over WebRTC.
    from tests.e2e.webrtc_client import offer_loopback

    offer_loopback()
    return gateway_factory.start(
        {"server": {"web_demo": False}, "webrtc": {"host_addresses": ["127.0.0.1"]}}, name="webrtc-echo"
    )


@pytest.fixture(scope="module")
def module_gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFactory]:
    """Start gateways shared by a test module."""
    factory = GatewayFactory(tmp_path_factory.mktemp("gateways"))
    yield factory
    factory.close()


_last_test: list[str] = ["(start-up)"]


@pytest.fixture(autouse=True)
def _no_traceback_in_gateway_logs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test if any running gateway logged a traceback while it ran.

    A traceback logged between two tests (say, a session torn down late) fails the
    next test's setup, naming the test that ran before.
    """
    late = [(gw.name, text) for gw in _RUNNING if "Traceback" in (text := gw.new_log())]
    previous, _last_test[0] = _last_test[0], request.node.nodeid
    if late:
        pytest.fail(
            "\n\n".join(
                f"gateway {name} logged a traceback after {previous} ended:\n{text[-6000:]}"
                for name, text in late
            ),
            pytrace=False,
        )
    yield
    excused = request.node.get_closest_marker("xfail") is not None
    problems = []
    for gw in list(_RUNNING):
        new = gw.new_log()
        if "Traceback" in new and not excused:
            problems.append(f"gateway {gw.name} logged a traceback during this test:\n{new[-6000:]}")
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)
