"""The configuration imports the engines' and carriers' spec modules; they never import it back."""

from __future__ import annotations

import subprocess
import sys

from duplex_gateway import config, config_error, extras

#: What the configuration imports to build its sections, and what those import in turn.
SPEC_MODULES = (
    "duplex_gateway.engine.spec",
    "duplex_gateway.engine.echo",
    "duplex_gateway.engine.embedded.spec",
    "duplex_gateway.engine.remote.spec",
    "duplex_gateway.engine.vllm_omni_spec",
    "duplex_gateway.telephony.registry",
    "duplex_gateway.extras",
)


def test_the_spec_modules_load_without_the_configuration() -> None:
    code = "import sys\n" + "".join(f"import {m}\n" for m in SPEC_MODULES)
    code += "print('duplex_gateway.config' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "False"


def test_one_config_error_under_both_names() -> None:
    assert config.ConfigError is config_error.ConfigError
    assert issubclass(extras.MissingExtra, config.ConfigError)
