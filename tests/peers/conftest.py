"""Outside clients whose pins clash with ours (Pipecat, LiveKit's realtime plugin), under ``.venv-peers``.

Only the clients run in that virtualenv: every gateway these tests start is a real
``python -m duplex_gateway serve`` from the main virtualenv (``GATEWAY_PYTHON``, by
default ``.venv/bin/python``), through the e2e fixtures as they are (:mod:`tests.e2e.conftest`),
including the check that no gateway logs a traceback. Test modules skip themselves
where their client is not installed (the main virtualenv's run), unless
``DUPLEX_GATEWAY_REQUIRE_PEERS=1`` (``make test``) says it must be there.
"""

from __future__ import annotations

import os

if os.environ.get("DUPLEX_GATEWAY_REQUIRE_PEERS") == "1":
    # Under make test's run in .venv-peers a broken install must fail here, not skip every module.
    import livekit.plugins.openai  # noqa: F401
    import openai.types.live  # noqa: F401 - the Live conformance test validates with these
    import pipecat  # noqa: F401

import sys
from collections.abc import Iterator

import pytest

from tests.e2e import helpers
from tests.e2e.conftest import (  # noqa: F401 - fixtures, registered by import
    _no_traceback_in_gateway_logs,
    gateway_factory,
    module_gateway_factory,
)
from tests.e2e.helpers import REPO


def gateway_python() -> str:
    """The interpreter that runs the gateway: the main virtualenv's, where its dependencies are."""
    named = os.environ.get("GATEWAY_PYTHON")
    if named:
        return named
    main = REPO / ".venv" / "bin" / "python"
    return str(main) if main.exists() else sys.executable


@pytest.fixture(scope="session", autouse=True)
def _gateway_from_the_main_virtualenv() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(helpers, "PYTHON", gateway_python())
        yield
