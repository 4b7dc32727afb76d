"""The soak, small: the same script and checks as the long run (``make soak``), with fewer cycles.

``scripts/soak.py`` starts a REAL gateway, runs connect/disconnect cycles of every kind
(a clean close, a close mid-reply, a TCP reset mid-reply, ``session.close``) and
dropped-and-resumed sessions, then checks that no session, engine session, task or
file descriptor is left, that memory grew less than 5 % after the warm-up, and that
the gateway logged no traceback and exits 0 on SIGTERM.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.reliability.clients import record

pytestmark = pytest.mark.e2e

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def test_connect_disconnect_cycles_and_resumes_leave_nothing_behind(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cycles", "300", "--resumes", "50", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    record(
        "soak_small",
        cycles=result["cycles"],
        resumes=result["resumes"],
        outcomes=result["outcomes"],
        baseline=result["baseline_after_warmup"],
        final=result["final"],
        rss_growth=result["rss_growth"],
        checks=result["checks"],
    )
    failed = [name for name, ok in result["checks"].items() if not ok]
    assert not failed, (failed, result.get("problems"), result.get("log_tail", "")[-2000:])
    assert proc.returncode == 0
