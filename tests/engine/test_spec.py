"""The engines' specs: what the configuration and the registry take from them."""

from __future__ import annotations

import subprocess
import sys

import pytest

from duplex_gateway.config import ConfigError, EngineSettings, GatewaySettings, load_settings
from duplex_gateway.engine.registry import ENGINES, SPECS, UnknownEngine, build_engine
from duplex_gateway.engine.spec import engine_specs


def test_every_spec_is_an_engine_name_and_a_config_section_of_its_model() -> None:
    assert list(SPECS) == list(ENGINES) == ["echo", "embedded", "vllm-omni", "vllm-omni-stream", "remote"]
    settings = GatewaySettings()
    for spec in engine_specs():
        assert isinstance(spec.settings_of(settings), spec.settings)
        assert spec.section in EngineSettings.model_fields


def test_a_sections_unknown_key_is_named() -> None:
    with pytest.raises(ConfigError, match=r"engine\.echo\.nope"):
        load_settings(None, **{"engine.echo.nope": 1})
    with pytest.raises(UnknownEngine, match="choose one of echo, embedded, remote"):
        build_engine(load_settings(None, **{"engine.name": "nope"}))


def test_reading_the_specs_loads_no_engine() -> None:
    code = (
        "import sys\n"
        "from duplex_gateway.config import load_settings\n"
        "import duplex_gateway.engine.registry\n"
        "load_settings(None, **{'engine.name': 'remote'})\n"
        "print(sorted(m for m in sys.modules if m.startswith('duplex_gateway.engine.')\n"
        "             and not m.endswith(('.spec', '_spec', '.port', '.echo', '.event_queue', '.registry',\n"
        "                                 '.embedded', '.remote'))))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
