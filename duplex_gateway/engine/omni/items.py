"""Conversation messages as vLLM-Omni takes them, shared by the ``vllm-omni`` and ``remote`` engines.

A message is a Realtime ``message`` item: its text as one ``input_text`` (or, for the
assistant, ``output_text``) part, and a user message's pictures as ``input_image`` parts
holding their data URLs. vLLM-Omni 0.30 takes pictures only where its model says it
does (``supports_image_input``); the gateway sends them only to such engines.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["message_item"]


def message_item(*, item_id: str, role: str, text: str, images: Sequence[str] = ()) -> dict[str, object]:
    """The ``conversation.item.create`` item of a message (``images``: JPEG or PNG data URLs)."""
    content: list[dict[str, object]] = []
    if text or not images:
        content.append({"type": "output_text" if role == "assistant" else "input_text", "text": text})
    content.extend({"type": "input_image", "image_url": url} for url in images)
    return {"id": item_id, "type": "message", "role": role, "content": content}
