"""Conversation items on the Realtime wire: messages, function calls and their outputs.

Items come in with ``conversation.item.create`` and in ``response.create``'s
``input``, and go out in ``conversation.item.*``, ``response.output_item.*`` and
``response.done``. Pure: no I/O.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from duplex_gateway.dialects.fields import (
    JsonObject,
    as_object,
    as_str,
    get_field,
    invalid,
    join,
    opt_str,
)
from duplex_gateway.vocabulary.commands import ItemSpec
from duplex_gateway.vocabulary.events import ConversationItem

__all__ = ["MAX_FRAMES_PER_APPEND", "check_picture", "parse_item", "render_item"]

_TEXT_PARTS = ("input_text", "text", "output_text")
#: vLLM-Omni's bounds on a picture (a camera frame or an ``input_image``), which its
#: models are built for: at most two frames per append, each at most 4 MB of base64.
MAX_FRAMES_PER_APPEND = 2
_MAX_PICTURE_CHARS = 4_000_000
_IMAGE_URL_PREFIXES = ("data:image/jpeg;base64,", "data:image/png;base64,")
_ROLES = ("user", "assistant", "system")
_KINDS = ("message", "function_call", "function_call_output")
#: A function's arguments or output: generous, but bounded like every other field.
_MAX_PAYLOAD_CHARS = 256 * 1024


def parse_item(item: Mapping[str, object], path: str, *, references: bool = False) -> ItemSpec:
    """One item a client sent; ``references``: ``item_reference`` is allowed (``response.input``)."""
    kind = item.get("type", "message")
    item_id = opt_str(item, "id", path)
    if kind == "item_reference" and references:
        ref = as_str(get_field(item, "id", path, required=True), join(path, "id"), nonempty=True)
        return ItemSpec(kind="item_reference", item_id=ref)
    if kind not in _KINDS:
        allowed = ", ".join(repr(k) for k in (*_KINDS, *(("item_reference",) if references else ())))
        raise invalid(join(path, "type"), f"'{join(path, 'type')}' must be one of {allowed}")
    if kind == "function_call":
        name = as_str(get_field(item, "name", path, required=True), join(path, "name"), nonempty=True)
        arguments = _bounded(get_field(item, "arguments", path, required=True), join(path, "arguments"))
        return ItemSpec(
            kind="function_call",
            item_id=item_id,
            role="assistant",
            name=name,
            arguments=arguments,
            call_id=opt_str(item, "call_id", path),
        )
    if kind == "function_call_output":
        call_id = as_str(
            get_field(item, "call_id", path, required=True), join(path, "call_id"), nonempty=True
        )
        output = _bounded(get_field(item, "output", path, required=True), join(path, "output"))
        return ItemSpec(
            kind="function_call_output", item_id=item_id, role="tool", call_id=call_id, output=output
        )
    role = as_str(get_field(item, "role", path, required=True), join(path, "role"))
    if role not in _ROLES:
        raise invalid(join(path, "role"), f"'{join(path, 'role')}' must be 'user', 'assistant' or 'system'")
    content = get_field(item, "content", path, required=True)
    if not isinstance(content, list) or not content:
        raise invalid(join(path, "content"), f"'{join(path, 'content')}' must be a non-empty list")
    texts: list[str] = []
    images: list[str] = []
    for index, part in enumerate(content):
        part_path = f"{path}.content[{index}]"
        part = as_object(part, part_path)
        part_type = as_str(get_field(part, "type", part_path, required=True), join(part_path, "type"))
        if part_type == "input_image" and role == "user":
            images.append(_image_url(part, part_path))
            continue
        if part_type not in _TEXT_PARTS:
            raise invalid(
                join(part_path, "type"),
                f"content type {part_type[:64]!r} is not supported (text and user images)",
            )
        texts.append(as_str(get_field(part, "text", part_path, required=True), join(part_path, "text")))
    return ItemSpec(kind="message", item_id=item_id, role=role, text="\n".join(texts), images=tuple(images))


def _image_url(part: Mapping[str, object], path: str) -> str:
    """An ``input_image`` part's picture: a JPEG or PNG data URL (OpenAI's ``image_url``)."""
    param = join(path, "image_url")
    url = as_str(get_field(part, "image_url", path, required=True), param)
    if not url.startswith(_IMAGE_URL_PREFIXES):
        raise invalid(param, f"'{param}' must be a JPEG or PNG base64 data URL (data:image/jpeg;base64,...)")
    problem = check_picture(url.split(",", 1)[1])
    if problem is not None:
        raise invalid(param, f"'{param}': {problem}")
    return url


def check_picture(data: object) -> str | None:
    """Why ``data`` is not a picture an engine can take (base64 JPEG or PNG); None if it is."""
    if not isinstance(data, str) or not data:
        return "a picture must be a non-empty base64 string"
    if len(data) > _MAX_PICTURE_CHARS:
        return f"a picture is at most {_MAX_PICTURE_CHARS} characters of base64"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "a picture must be valid base64"
    if not raw.startswith((b"\xff\xd8", b"\x89PNG")):
        return "a picture must be a JPEG or PNG image"
    return None


def _bounded(value: object, param: str) -> str:
    text = as_str(value, param)
    if len(text) > _MAX_PAYLOAD_CHARS:
        raise invalid(param, f"'{param}' is longer than {_MAX_PAYLOAD_CHARS} characters")
    return text


def render_item(item: ConversationItem, *, beta: bool) -> JsonObject:
    """A conversation item (``realtime.item``) as the wire shows it."""
    if item.kind == "function_call":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call",
            "status": item.status,
            "call_id": item.call_id,
            "name": item.name,
            "arguments": item.arguments or "",
        }
    if item.kind == "function_call_output":
        return {
            "id": item.id,
            "object": "realtime.item",
            "type": "function_call_output",
            "status": item.status,
            "call_id": item.call_id,
            "output": item.output or "",
        }
    content: list[JsonObject] = []
    if item.role == "assistant":
        if item.status != "in_progress" or item.transcript or item.text:
            content.append(_assistant_part(item, beta))
    elif item.content_type in ("input_audio", "audio", "output_audio"):
        content.append({"type": "input_audio", "transcript": item.transcript})
    else:
        if item.text or not item.images:
            content.append({"type": "input_text", "text": item.text or ""})
        # The pictures went to the engine; the item says they are there without sending them back.
        content.extend({"type": "input_image"} for _ in range(item.images))
    return {
        "id": item.id,
        "object": "realtime.item",
        "type": "message",
        "status": item.status,
        "role": item.role,
        "content": content,
    }


def _assistant_part(item: ConversationItem, beta: bool) -> JsonObject:
    if item.content_type in ("audio", "output_audio", "input_audio"):
        return {"type": "audio" if beta else "output_audio", "transcript": item.transcript or ""}
    return {"type": "text" if beta else "output_text", "text": item.text or item.transcript or ""}
