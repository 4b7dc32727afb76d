"""A function tool's call and its parameters, read from the tool's JSON schema.

:class:`ToolCall` is what offline tool use decides; :func:`flat_parameters` reduces
a schema's properties to what filling them needs, and :func:`parameter_kind` says
what each takes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from urllib.parse import unquote

from duplex_gateway.engine.embedded.tool_words import (
    PERSON_WORDS,
    PLACE_WORDS,
    TEXT_WORDS,
    WORD_RE,
    split_name,
)

__all__ = ["NO_DEFAULT", "Parameter", "ToolCall", "flat_parameters", "parameter_kind"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCall:
    """A decision to call one function tool, with the arguments read from what the caller said."""

    name: str
    #: JSON-serialisable, only keys of the schema's properties, in the schema's order.
    arguments: Mapping[str, object] = field(hash=False)
    #: How well the utterance matched the tool, 0..1 (for logs and tests; not a probability).
    score: float

    def arguments_json(self) -> str:
        """The arguments as compact JSON in the schema's order (what ``function_call.arguments`` carries)."""
        return json.dumps(dict(self.arguments), separators=(",", ":"), ensure_ascii=False)


NO_DEFAULT: Final = object()


@dataclass(frozen=True, slots=True)
class Parameter:
    """One function parameter, its schema reduced to what filling it needs."""

    name: str
    #: Local ``$ref`` resolved, ``allOf`` merged, a lone non-null ``anyOf``/``oneOf`` branch folded in.
    schema: Mapping[str, object]
    #: null is a valid value (``anyOf`` with ``{"type": "null"}``, ``"type": [..., "null"]``, ...).
    nullable: bool
    #: The schema's ``default``, or :data:`NO_DEFAULT`.
    default: object


def flat_parameters(parameters: Mapping[str, object]) -> list[Parameter]:
    """The properties of a function's parameter schema, in order, each flattened.

    Strict schemas (what openai-agents' ``@function_tool`` sends) list every
    parameter as required and say what may be left out another way: a default
    on the property, or null among its types; enums of a Python ``Enum`` sit in
    ``$defs`` behind a ``$ref``. Flattening lets the rules below read them all alike.
    """
    props = parameters.get("properties")
    if not isinstance(props, Mapping):
        return []
    found = []
    for name, prop in props.items():
        if isinstance(prop, Mapping):
            schema, nullable = _flatten(prop, parameters, 0)
            found.append(Parameter(str(name), schema, nullable, schema.get("default", NO_DEFAULT)))
    return found


def _flatten(
    schema: Mapping[str, object], root: Mapping[str, object], depth: int
) -> tuple[dict[str, object], bool]:
    """``schema`` with its combinators folded in (its own keywords win) and whether it admits null."""
    out = dict(schema)
    nullable = out.pop("nullable", None) is True  # OpenAPI's spelling
    if depth > 8:  # a reference cycle, or a schema no caller would speak
        return out, nullable
    ref = out.pop("$ref", None)
    target = _pointer(root, ref) if isinstance(ref, str) else None
    if target is not None:
        base, null = _flatten(target, root, depth + 1)
        out, nullable = {**base, **out}, nullable or null
    parts = out.pop("allOf", None)
    for part in parts if isinstance(parts, list) else []:
        if isinstance(part, Mapping):
            out = {**_flatten(part, root, depth + 1)[0], **out}
    for key in ("anyOf", "oneOf"):
        branches = out.pop(key, None)
        if not isinstance(branches, list):
            continue
        flat = [_flatten(b, root, depth + 1) for b in branches if isinstance(b, Mapping)]
        nullable = nullable or any(null or b.get("type") == "null" for b, null in flat)
        rest = [b for b, _ in flat if b.get("type") != "null"]
        if len(rest) == 1:
            out = {**rest[0], **out}
        elif rest and "type" not in out:  # str | int: any of the types; the kinds below pick the likeliest
            out["type"] = sorted({t for b in rest for t in _types(b)})
    types = out.get("type")
    if isinstance(types, list) and "null" in types:
        nullable, rest_types = True, [t for t in types if t != "null"]
        out["type"] = rest_types[0] if len(rest_types) == 1 else rest_types
    if isinstance(enum := out.get("enum"), list) and None in enum:
        nullable, out["enum"] = True, [v for v in enum if v is not None]
    return out, nullable


def _types(schema: Mapping[str, object]) -> list[str]:
    types = schema.get("type")
    return [types] if isinstance(types, str) else [str(t) for t in types] if isinstance(types, list) else []


def _pointer(root: Mapping[str, object], ref: str) -> Mapping[str, object] | None:
    """The schema a local ``$ref`` ("#/$defs/Unit") points at in ``root``, or None."""
    if not ref.startswith("#"):
        return None  # a remote schema: nothing to fetch on this path
    node: object = root
    for token in (t for t in ref[1:].split("/") if t):
        token = unquote(token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping):
            node = node.get(token)
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return None
    return node if isinstance(node, Mapping) else None


def parameter_kind(name: str, prop: Mapping[str, object]) -> str:
    """What a property takes: enum, number, bool, date, time, datetime, place, person, text, generic, skip."""
    types = prop.get("type")
    types = {types} if isinstance(types, str) else set(types) if isinstance(types, list) else set()
    if isinstance(prop.get("enum"), list):
        return "enum"
    if types & {"integer", "number"} or "boolean" in types:
        return "bool" if "boolean" in types else "number"
    if types and "string" not in types:
        return "skip"  # objects and arrays: nothing a rule could say for sure
    fmt = {"date": "date", "time": "time", "date-time": "datetime"}.get(str(prop.get("format")))
    if fmt:
        return fmt
    # The name is trusted for dates first; a description ("the city to get the time in") only after places.
    described = set(WORD_RE.findall(str(prop.get("description", "")).lower()))
    for words, dates_first in ((set(split_name(name)), True), (described, False)):
        when = (
            "datetime"
            if "datetime" in words or words >= {"date", "time"}
            else ("date" if words & {"date", "day"} else "time" if words & {"time", "hour"} else "")
        )
        if when and dates_first:
            return when
        kinds = (("place", PLACE_WORDS), ("person", PERSON_WORDS), ("text", TEXT_WORDS))
        kind = next((k for k, vocabulary in kinds if words & vocabulary), when)
        if kind:
            return kind
    return "generic"
