"""The vLLM-Omni translator is pure: no I/O, no clock, no event loop (like the dialects)."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import pytest

from duplex_gateway.engine import omni

#: Builds the vLLM-Omni object an in-process engine runs (imports the model's stack, reads
#: the working directory): loading, not translation.
_LOADING = {"loading"}

_FORBIDDEN = {
    "asyncio",
    "socket",
    "time",
    "selectors",
    "threading",
    "trio",
    "anyio",
    "websockets",
    "starlette",
    "uvicorn",
    "datetime",
    "random",
    "uuid",
    "os",
    "sys",
    "vllm",
    "vllm_omni",
    "torch",
}

_MODULES = sorted(info.name for info in pkgutil.iter_modules(omni.__path__) if info.name not in _LOADING)


def test_the_package_holds_the_translator() -> None:
    assert {"audio", "events", "session", "fields", "tools", "items"} <= set(_MODULES)


@pytest.mark.parametrize("name", _MODULES)
def test_translator_module_is_pure(name: str) -> None:
    tree = ast.parse((Path(omni.__path__[0]) / f"{name}.py").read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            imported.add((node.module or "").split(".")[0])
            # Within the gateway, only the port, the audio layer, the session's configuration
            # and the package itself: never an engine's I/O module.
            module = node.module or ""
            if module.startswith("duplex_gateway."):
                assert module.startswith(
                    (
                        "duplex_gateway.engine.port",
                        "duplex_gateway.engine.omni",
                        "duplex_gateway.audio",
                        "duplex_gateway.vocabulary.formats",
                        "duplex_gateway.vocabulary.session_config",
                    )
                ) or (module == "duplex_gateway.engine" and [a.name for a in node.names] == ["port"]), module
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("__import__", "open", "exec", "eval")
    assert not imported & _FORBIDDEN
