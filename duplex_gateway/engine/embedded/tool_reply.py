"""What a function's output says, spoken: the sentence the embedded engine reads back after a tool call."""

from __future__ import annotations

import json
import math
import re
from typing import Final

from duplex_gateway.engine.embedded.tool_schema import ToolCall
from duplex_gateway.engine.embedded.tool_words import split_name

__all__ = ["reply_from_output"]


_MARKUP: Final = re.compile(
    r"<[^>]*>|!?\[([^\]]*)\]\([^)]*\)|(https?://\S+)|[*_`#>|~]+|^\s*[-+]\s+", re.MULTILINE
)
_TEXT_KEYS: Final = ("message", "text", "answer", "result", "summary", "output", "content")


def _speak(value: object, depth: int = 0) -> str:
    """``value`` in words: plain text, yes/no, readable numbers, the first few items or fields."""
    if isinstance(value, str):  # markup is for eyes: "[Paris](url)" says Paris, a bare URL "a link"
        return " ".join(_MARKUP.sub(lambda m: m[1] or ("a link" if m[2] else " "), value).split())
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a number" if math.isnan(value) else "infinity"
    if isinstance(value, int | float):
        text = f"{value:,.2f}".rstrip("0").rstrip(".") if isinstance(value, float) else f"{value:,}"
        return "minus " + text[1:] if text.startswith("-") else text
    if isinstance(value, list):
        # An item that is a record is said by its first text ("title": "Refunds" -> Refunds).
        heads = [
            next((v for v in x.values() if isinstance(v, str)), x) if isinstance(x, dict) else x
            for x in value
        ]
        more = f", and {len(value) - 3} more" if len(value) > 3 else ""
        return ", ".join(s for s in (_speak(item, depth + 1) for item in heads[:3]) if s) + more
    if isinstance(value, dict) and depth < 2:
        fields = [(" ".join(split_name(str(k))), _speak(v, depth + 1)) for k, v in list(value.items())[:6]]
        return ", ".join(f"{k} {v}" for k, v in fields if v)
    return ""


def reply_from_output(call: ToolCall, output: str) -> str:
    """A short speakable sentence built from the function's ``output`` for ``call``; never empty.

    ``output`` may be JSON (an object says its salient fields, an array its first
    items, a scalar itself) or free text (markup stripped). An object with a
    non-empty "error" key says that the tool failed and why. At most about 40 words.
    """
    who = " ".join(split_name(call.name)) or "The tool"
    try:
        data: object = json.loads(output)
    except ValueError:
        data = output
    said = ""
    if isinstance(data, dict):
        error = next((v for k, v in data.items() if str(k).lower() == "error"), None)
        if isinstance(error, dict):
            error = next(
                (error[k] for k in ("message", "detail", "reason") if isinstance(error.get(k), str)), error
            )
        if error not in (None, False, "", {}, []):
            reason = "" if error is True else _speak(error)
            said = f"{who} failed: {reason}" if reason else f"{who} failed"
        else:
            text = next(
                (data[k] for k in _TEXT_KEYS if isinstance(data.get(k), str) and _speak(data[k])), data
            )
            said = f"{who} says: {_speak(text)}" if _speak(text) else ""
    elif isinstance(data, list):
        plural = "s" if len(data) != 1 else ""
        said = (
            f"{who} returned {len(data)} result{plural}: {_speak(data)}" if data else (f"{who} found nothing")
        )
    elif _speak(data):
        said = f"{who} says " if isinstance(data, bool | int | float) else f"{who} says: "
        said += _speak(data)
    words = (said or f"{who} finished").split()
    text = " ".join(words[:40]).rstrip(",;:.") + "\u2026" if len(words) > 40 else " ".join(words)
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?", "\u2026")) else text.rstrip(",;:") + "."
