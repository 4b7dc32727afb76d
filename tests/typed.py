"""Typed access to what the code under test hands back, for tests that know more than its type says.

A session's outputs are ``list[Output]`` (every server event and engine call), an engine's
events ``EngineEvent``, an opened engine session ``EngineSession``; a test knows which one it
holds at a given place. These helpers say so to the type checker and check it at run time,
where the line that reads the value would otherwise silence the checker::

    assert narrow(out[0], ev.ErrorEvent).code is ErrorCode.INVALID_VALUE
    (done,) = only(out, ev.ResponseDone)
    assert json_at(wire, "session", "tools", 0) == {"type": "function", "name": "f"}

They change how a value is reached, never what a test compares it with.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

__all__ = ["first", "json_at", "narrow", "only"]

T = TypeVar("T")


def narrow(value: object, kind: type[T]) -> T:
    """``value``, checked to be a ``kind`` (the test fails, naming both, where it is not)."""
    assert isinstance(value, kind), f"expected a {kind.__name__}, got {value!r}"
    return value


def only(outputs: Iterable[object], kind: type[T]) -> list[T]:
    """The items of ``outputs`` that are a ``kind``, in their order."""
    return [o for o in outputs if isinstance(o, kind)]


def first(outputs: Iterable[object], kind: type[T]) -> T:
    """The first item of ``outputs`` that is a ``kind`` (the test fails where there is none)."""
    items = list(outputs)
    found = only(items, kind)
    assert found, f"no {kind.__name__} among {items!r}"
    return found[0]


def json_at(value: object, *path: str | int) -> object:
    """What ``value[path[0]][path[1]]...`` holds in decoded JSON: a key reads an object, an index an array."""
    for step in path:
        if isinstance(step, str):
            assert isinstance(value, Mapping), f"[{step!r}] of {value!r}"
            value = value[step]
        else:
            assert isinstance(value, Sequence), f"[{step!r}] of {value!r}"
            value = value[step]
    return value
