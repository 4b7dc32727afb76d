"""The gateway core never loads the heavy stacks: torch and vLLM load only inside an engine's start."""

from __future__ import annotations

import subprocess
import sys

MODULES = [
    "duplex_gateway.app",
    "duplex_gateway.cli",
    "duplex_gateway.engine.registry",
    "duplex_gateway.engine.remote",
    "duplex_gateway.engine.vllm_omni",
    "duplex_gateway.engine.vllm_omni_stream",
]


def test_importing_the_gateway_loads_no_torch_or_vllm() -> None:
    code = "import sys\n" + "".join(f"import {m}\n" for m in MODULES) + (
        "print(sorted(m for m in ('torch', 'vllm', 'vllm_omni') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
