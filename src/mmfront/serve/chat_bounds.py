"""The size of a chat request's ``messages``, bounded before a message is turned into the
conversation or the chat template renders it.

One decode of the body keeps only what the bounds need: the list shapes, each message's text
content, and its content parts as undecoded bytes. From it come the counts of messages
(``--max-chat-messages``) and of their content parts (``--max-content-parts``), then the
characters of the text (held to the longest prompt worth tokenizing, ``max_prompt_chars``, which
the rendered prompt is held to after templating: a template renders every message's text, so text
over it cannot make a prompt that passes). A million messages are refused before the request is
decoded into a million dicts (16 MB of ``{"role":"user"}`` decode into ~250 MB), and a 60 MB
text before the body is decoded a second time: each decode is one call that holds the GIL (tens of
milliseconds per 10 MB) while every other request of the server waits."""

from __future__ import annotations

import msgspec

from mmfront.errors import ValidationError


class _Message(msgspec.Struct, gc=False):
    content: str | list[msgspec.Raw] | dict[str, msgspec.Raw] | float | bool | None = None
    """Every JSON kind, so that no content makes the whole shape fail and the bounds be skipped."""


class _Shape(msgspec.Struct):
    messages: list[_Message] = []


class _Part(msgspec.Struct, gc=False):
    text: str | None = None


_SHAPE = msgspec.json.Decoder(_Shape)
_PART = msgspec.json.Decoder(_Part)


def check_chat_body(body: bytes, *, max_messages: int, max_parts: int, max_prompt_chars: int) -> None:
    """Refuse (400, ``parameter`` ``messages``) a body with too many messages or content parts,
    or more characters of text (a string ``content``, a part's ``text``) than any prompt that
    would be tokenized. A body or a part of another shape passes: the request's own decode, and
    the conversation's parser, say what is wrong with it."""
    try:
        messages = _SHAPE.decode(body).messages
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return
    if len(messages) > max_messages:
        raise ValidationError(f"The request has {len(messages)} messages; the server's limit is {max_messages} "
                              "(--max-chat-messages).", parameter="messages")
    parts = [part for m in messages if isinstance(m.content, list) for part in m.content]
    if len(parts) > max_parts:
        raise ValidationError(f"The request's messages have {len(parts)} content parts; the server's limit is "
                              f"{max_parts} (--max-content-parts).", parameter="messages")
    chars = sum(len(m.content) for m in messages if isinstance(m.content, str)) + sum(map(_part_chars, parts))
    if chars > max_prompt_chars:
        raise ValidationError(f"The messages hold {chars} characters of text; the longest prompt the server tokenizes "
                              f"is {max_prompt_chars} characters (max_prompt_chars). Shorten the conversation; it was "
                              "not rendered.", parameter="messages")


def _part_chars(part: msgspec.Raw) -> int:
    try:
        text = _PART.decode(part).text
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return 0
    return len(text) if text is not None else 0


__all__ = ["check_chat_body"]
