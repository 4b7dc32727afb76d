"""Every module of the session package is sans-I/O, and small enough to read whole."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import duplex_gateway.session as session_package

IO_MODULES = {"asyncio", "socket", "time", "threading", "websockets", "starlette"}


def session_modules() -> list[ModuleType]:
    names = [
        info.name for info in pkgutil.iter_modules(session_package.__path__, f"{session_package.__name__}.")
    ]
    return [session_package, *(importlib.import_module(name) for name in sorted(names))]


def imported_roots(module: ModuleType) -> set[str]:
    """The top-level packages a module imports, wherever in it the import is (a function body too)."""
    roots: set[str] = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_package_has_the_parts_of_the_redesign() -> None:
    names = {module.__name__.rsplit(".", 1)[-1] for module in session_modules()}
    assert {"machine", "replies", "turns", "conversation"} <= names


@pytest.mark.parametrize("module", session_modules(), ids=lambda module: module.__name__)
def test_a_session_module_imports_no_io(module: ModuleType) -> None:
    assert not imported_roots(module) & IO_MODULES


@pytest.mark.parametrize("module", session_modules(), ids=lambda module: module.__name__)
def test_a_session_module_stays_small(module: ModuleType) -> None:
    source = inspect.getsource(module)
    assert len(source.splitlines()) <= 800
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            assert node.end_lineno is not None
            assert node.end_lineno - node.lineno + 1 <= 600, node.name
