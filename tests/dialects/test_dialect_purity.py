"""Every module of the dialects package is pure: it imports no I/O, no clock and no randomness.

tests/dialects/test_realtime.py holds the realtime and session modules to this; here the
rest of the package is, the client event parsers among them.
"""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import pytest

from duplex_gateway.dialects import (
    base,
    fields,
    live_webrtc,
    realtime_commands,
    realtime_items,
    realtime_tools,
    realtime_webrtc,
    wire_codec,
)

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
}
_ALLOWED = {
    "__future__",
    "base64",
    "binascii",
    "json",
    # JSON and base64 codecs, nothing else (wire_codec).
    "orjson",
    "pybase64",
    "math",
    "collections",
    "dataclasses",
    "typing",
    "duplex_gateway",
}


def _imports(module: ModuleType) -> set[str]:
    """The top-level packages ``module`` imports; fails on a dynamic import, a file opened or code run."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    imported: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative imports hide what is imported"
            imported.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in ("__import__", "open", "exec", "eval")
    return imported


@pytest.mark.parametrize(
    "module",
    [
        realtime_commands,
        realtime_items,
        realtime_tools,
        realtime_webrtc,
        live_webrtc,
        fields,
        base,
        wire_codec,
    ],
    ids=lambda m: m.__name__,
)
def test_dialect_module_is_pure(module: ModuleType) -> None:
    imported = _imports(module)
    assert not imported & _FORBIDDEN
    assert imported <= _ALLOWED


def test_every_dialect_module_is_held_to_purity() -> None:
    # A module added to the package later must join a purity test, here or in test_realtime.py.
    checked = {"realtime", "realtime_session", "realtime_commands", "realtime_items", "realtime_tools"}
    checked |= {"realtime_webrtc", "live_webrtc"}
    checked |= {"fields", "base", "wire_codec", "__init__"}
    # held to it in test_live.py
    checked |= {"live", "live_backend", "live_commands", "live_errors", "live_pacing", "live_session"}
    package = Path(realtime_commands.__file__ or "").parent
    assert {path.stem for path in package.glob("*.py")} <= checked
