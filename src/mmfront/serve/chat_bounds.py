"""The size of a chat request's ``messages``, bounded before a message is turned into the
conversation or the chat template renders it.

One decode of the body keeps only the list shapes, with each message's content as its undecoded
JSON bytes. From it come the counts of messages (``--max-chat-messages``) and of their content
parts (``--max-content-parts``), then the characters of the text (held to the longest prompt worth
tokenizing, ``max_prompt_chars``, which the rendered prompt is held to after templating: a
template renders every message's text, so text over it cannot make a prompt that passes). A
million messages are refused before the request is decoded into a million dicts (16 MB of
``{"role":"user"}`` decode into ~250 MB), and a 60 MB text from its length in bytes, never built:
each decode is one call that holds the GIL while every other request of the server waits, and a
60 MB string is 60 MB of fresh memory faulted in during that call (~50 ms on an idle machine,
~0.5 s on a loaded one)."""

from __future__ import annotations

from typing import TypeVar

import msgspec

from mmfront.errors import ValidationError

_T = TypeVar("_T")

_MAX_JSON_BYTES_PER_CHARACTER = 12
"""The most bytes a JSON string spends on one character: an escaped surrogate pair, ``\\ud83d\\ude00``."""


class _Message(msgspec.Struct, gc=False):
    content: msgspec.Raw = msgspec.Raw(b"null")
    """Undecoded, so any JSON kind passes (none makes the shape fail and the bounds be skipped)."""


class _Shape(msgspec.Struct):
    messages: list[_Message] = []


class _Part(msgspec.Struct, gc=False):
    text: msgspec.Raw = msgspec.Raw(b"null")


class _PartsMessage(msgspec.Struct, gc=False):
    content: list[_Part] | None = None


class _PartsShape(msgspec.Struct):
    messages: list[_PartsMessage] = []


_SHAPE = msgspec.json.Decoder(_Shape)
_PARTS_SHAPE = msgspec.json.Decoder(_PartsShape)
"""Messages whose contents are all lists of objects (a request with media), read in one pass: a
data URL's ~600 KB is scanned once, where the shape and then each content list took two scans."""
_PARTS = msgspec.json.Decoder(list[msgspec.Raw])
_PART = msgspec.json.Decoder(_Part)
_OBJECT_PARTS = msgspec.json.Decoder(list[_Part])
_TEXT = msgspec.json.Decoder(str)


def check_chat_body(body: bytes, *, max_messages: int, max_parts: int, max_prompt_chars: int) -> None:
    """Refuse (400, ``parameter`` ``messages``) a body with too many messages or content parts,
    or more characters of text (a string ``content``, a part's ``text``) than any prompt that
    would be tokenized. A body or a part of another shape passes: the request's own decode, and
    the conversation's parser, say what is wrong with it."""
    texts: list[msgspec.Raw] = []
    parts: list[_Part | None] = []
    listed = _decoded(_PARTS_SHAPE, body)
    if listed is not None:
        _check_message_count(len(listed.messages), max_messages)
        for listed_message in listed.messages:
            parts += listed_message.content or []
    else:
        try:
            messages = _SHAPE.decode(body).messages
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return
        _check_message_count(len(messages), max_messages)
        for message in messages:
            if _starts(message.content, b'"'):
                texts.append(message.content)
            elif _starts(message.content, b"["):
                parts += _content_parts(message.content)
    if len(parts) > max_parts:
        raise ValidationError(f"The request's messages have {len(parts)} content parts; the server's limit is "
                              f"{max_parts} (--max-content-parts).", parameter="messages")
    texts += [part.text for part in parts if part is not None and _starts(part.text, b'"')]
    _check_text(texts, max_prompt_chars)


def _check_message_count(count: int, limit: int) -> None:
    if count > limit:
        raise ValidationError(f"The request has {count} messages; the server's limit is {limit} "
                              "(--max-chat-messages).", parameter="messages")


def _content_parts(content: msgspec.Raw) -> list[_Part | None]:
    """A content list's parts, ``None`` for a part that is not an object. Where every part is one
    (the usual request), in one pass over the content: each pass over a data URL's part costs a
    scan of its ~600 KB, and this one used to be two."""
    every = _decoded(_OBJECT_PARTS, content)
    if every is not None:
        return list(every)
    listed: list[msgspec.Raw] = _decoded(_PARTS, content) or []
    return [_decoded(_PART, raw) for raw in listed]


def _check_text(texts: list[msgspec.Raw], limit: int) -> None:
    """The characters of the JSON strings ``texts`` against ``limit``: from their lengths in bytes
    where those decide it (a character takes 1 to 12 bytes), else decoded and counted."""
    sizes = [len(memoryview(text)) - 2 for text in texts]  # the bytes between the quotes
    if sum(sizes) <= limit:
        return
    least = sum(-(-size // _MAX_JSON_BYTES_PER_CHARACTER) for size in sizes)
    if least > limit:
        _refuse_text(f"at least {least}", limit)
    decoded: list[str | None] = [_decoded(_TEXT, text) for text in texts]
    chars = sum(len(text) for text in decoded if text is not None)
    if chars > limit:
        _refuse_text(str(chars), limit)


def _refuse_text(held: str, limit: int) -> None:
    raise ValidationError(f"The messages hold {held} characters of text; the longest prompt the server tokenizes is "
                          f"{limit} characters (max_prompt_chars). Shorten the conversation; it was not rendered.",
                          parameter="messages")


def _starts(raw: msgspec.Raw, first: bytes) -> bool:
    with memoryview(raw) as view:
        return view[:1] == first


def _decoded(decoder: msgspec.json.Decoder[_T], raw: bytes | msgspec.Raw) -> _T | None:
    """``raw`` decoded, or ``None`` where it is of another shape (the request's decode says so)."""
    try:
        return decoder.decode(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


__all__ = ["check_chat_body"]
