"""Base64 data URLs lifted out of a chat body before it is decoded, and put back after.

An image sent inline is one JSON string of ~600 KB of base64 for a 1024x768 JPEG. The body's
bounds check (:mod:`~mmfront.serve.chat_bounds`) skipped over it character by character, and the
request's decode scanned it again and copied it into a ``str``: 0.92 ms of a cache hit's ~6.9 ms
of server CPU (measured in the server; 0.44 ms on an idle core). Found with ``bytes.find``
(``memchr``) and checked with the SIMD base64 decoder, the string is lifted out: both passes read a
body of a few hundred bytes, and the string is made once from its bytes.

A string is lifted only where it is plainly a data URL: the value of a ``"url"`` key, at least
:data:`MIN_LIFTED_BYTES` long, a short printable header up to its first comma (``data:image/jpeg;
base64``), then base64 alone (``A-Z a-z 0-9 + / =``). Such a string holds no quote, backslash,
control character or non-ASCII byte, and neither does its token, so a JSON reader splits the
lifted body into the same values as the original: only that string's content differs, and that
string decodes to its own bytes as ASCII. Whatever the lifted body's decode refuses, and a token
not found in a message's content part when it is put back, sends the caller back to the original
body (:func:`~mmfront.serve.chat_completions.decode_chat`): its errors and odd shapes stay the
original's.
"""

from __future__ import annotations

import binascii
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import pybase64

MIN_LIFTED_BYTES = 4096
"""Shorter strings cost less to scan twice than to lift."""

_KEY = b'"url"'
_WHITESPACE = b" \t\r\n"
_LOOKAHEAD = 64
"""How far after a ``"url"`` key its value's opening quote is looked for."""
_MAX_HEADER = 256
_HEADER = re.compile(rb"data:[\x20-\x21\x23-\x2b\x2d-\x5b\x5d-\x7e]*", re.IGNORECASE)
"""A data URL's header: printable ASCII without quote, backslash or comma."""
_TOKEN_PREFIX = f"mmfront-lifted-{secrets.token_hex(8)}-"
"""Unguessable per process, so no request can hold a token of its own."""


@dataclass
class LiftedBody:
    """A chat body with its data URLs replaced by tokens, and what each token stands for."""

    body: bytes
    urls: dict[str, str] = field(default_factory=dict)

    def restore(self, messages: list[Any]) -> bool:
        """Put each URL back where its token landed, a content part's ``{"url": ...}`` value;
        whether every token was found there exactly once (if not, decode the original body)."""
        found = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else ():
                for value in part.values() if isinstance(part, dict) else ():
                    url = value.get("url") if isinstance(value, dict) else None
                    if isinstance(url, str) and url.startswith(_TOKEN_PREFIX):
                        original = self.urls.get(url)
                        if original is None:
                            return False
                        value["url"] = original
                        found += 1
        return found == len(self.urls)


def lift_data_urls(body: bytes) -> LiftedBody | None:
    """``body`` with its long base64 data URLs lifted out, or ``None`` where it has none."""
    pieces: list[bytes] = []
    urls: dict[str, str] = {}
    copied = position = 0
    while (key := body.find(_KEY, position)) >= 0:
        position = key + len(_KEY)
        start = _value_start(body, position)
        if start < 0:
            continue
        end = body.find(b'"', start)
        if end < 0:
            break
        position = end + 1
        if end - start >= MIN_LIFTED_BYTES and _plain_data_url(body, start, end):
            token = f"{_TOKEN_PREFIX}{len(urls)}"
            urls[token] = body[start:end].decode("ascii")
            pieces += [body[copied:start], token.encode()]
            copied = end
    if not urls:
        return None
    pieces.append(body[copied:])
    return LiftedBody(b"".join(pieces), urls)


def _value_start(body: bytes, after_key: int) -> int:
    """Where the string value after a key starts (past its opening quote), or -1."""
    ahead = body[after_key:after_key + _LOOKAHEAD]
    colon = ahead.lstrip(_WHITESPACE)
    if not colon.startswith(b":"):
        return -1
    value = colon[1:].lstrip(_WHITESPACE)
    if not value.startswith(b'"'):
        return -1
    return after_key + len(ahead) - len(value) + 1


def _plain_data_url(body: bytes, start: int, end: int) -> bool:
    comma = body.find(b",", start, min(end, start + _MAX_HEADER))
    if comma < 0 or not _HEADER.fullmatch(body, start, comma):
        return False
    try:
        pybase64.b64decode(memoryview(body)[comma + 1:end], validate=True)
    except (binascii.Error, ValueError):
        return False
    return True


__all__ = ["MIN_LIFTED_BYTES", "LiftedBody", "lift_data_urls"]
