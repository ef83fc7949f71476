"""The size of a chat request's ``messages``, bounded before a message is turned into the
conversation or the chat template renders it.

The counts of messages (``--max-chat-messages``) and of their content parts
(``--max-content-parts``) are read from the body by a decode that keeps nothing but the list
shapes (tens of bytes an item, no Python work per item), so a million messages are refused before
the request is decoded into a million dicts (16 MB of ``{"role":"user"}`` decode into ~250 MB).
The characters of the decoded messages' text are then held to the longest prompt worth
tokenizing (``max_prompt_chars``, which the rendered prompt is held to after templating: a
template renders every message's text, so text over it cannot make a prompt that passes)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from mmfront.errors import ValidationError


class _Part(msgspec.Struct, gc=False):
    pass


class _Message(msgspec.Struct, gc=False):
    content: str | list[_Part] | None = None


class _Shape(msgspec.Struct):
    messages: list[_Message] = []


_SHAPE = msgspec.json.Decoder(_Shape)


def check_chat_counts(body: bytes, *, max_messages: int, max_parts: int) -> None:
    """Refuse (400, ``parameter`` ``messages``) a body with too many messages or content parts.
    A body of another shape passes: the request's own decode says what is wrong with it."""
    try:
        messages = _SHAPE.decode(body).messages
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return
    if len(messages) > max_messages:
        raise ValidationError(f"The request has {len(messages)} messages; the server's limit is {max_messages} "
                              "(--max-chat-messages).", parameter="messages")
    parts = sum(len(m.content) for m in messages if isinstance(m.content, list))
    if parts > max_parts:
        raise ValidationError(f"The request's messages have {parts} content parts; the server's limit is {max_parts} "
                              "(--max-content-parts).", parameter="messages")


def check_chat_text(messages: Sequence[Any], max_prompt_chars: int) -> None:
    """Refuse (400, ``parameter`` ``messages``) messages whose text is longer than any prompt that
    would be tokenized."""
    chars = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p["text"]) for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    if chars > max_prompt_chars:
        raise ValidationError(f"The messages hold {chars} characters of text; the longest prompt the server tokenizes "
                              f"is {max_prompt_chars} characters (max_prompt_chars). Shorten the conversation; it was "
                              "not rendered.", parameter="messages")


__all__ = ["check_chat_counts", "check_chat_text"]
