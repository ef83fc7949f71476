"""Base64 data URLs lifted out of a chat body before it is decoded, and put back after.

An image sent inline is one JSON string of ~600 KB of base64 for a 1024x768 JPEG. The body's
bounds check (:mod:`~mmfront.serve.chat_bounds`) skipped over it character by character, the
request's decode scanned it again and copied it into a ``str``, and the media connector sliced,
encoded and decoded that: 0.92 ms of a cache hit's ~6.9 ms of server CPU went to the two JSON
passes alone (measured in the server; 0.44 ms on an idle core). Found with ``bytes.find``
(``memchr``) and decoded by the SIMD base64 decoder, the string is lifted out: both passes read a
body of a few hundred bytes, and a media part's URL goes back as the
:class:`~mmfront.media.DecodedDataURL` of the bytes the check decoded, which the connector takes
under the same limits and errors as the URL.

A string is lifted only where it is plainly a data URL: the value of a ``"url"`` key, at least
:data:`MIN_LIFTED_BYTES` long, a short printable header up to its first comma that declares base64
as the connector reads it, then base64 alone (``A-Z a-z 0-9 + / =``), no longer than
``max_media_bytes`` allows (a longer one stays in the body, and the connector refuses it from its
length before anything is decoded, as before). Such a string holds no
quote, backslash, control character or non-ASCII byte, and neither does its token, so a JSON
reader splits the lifted body into the same values as the original: only that string's content
differs. Where the token lands in a media part (``{"type": "image_url", "image_url": {"url":
...}}``, and video and audio alike) the decoded URL goes back; anywhere else in a content part, the
string itself. Whatever the lifted body's decode refuses, and a token found elsewhere or not at
all, sends the caller back to the original body
(:func:`~mmfront.serve.request_decoding.decode_chat_body`): its errors and odd shapes stay the
original's.
"""

from __future__ import annotations

import binascii
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

import pybase64

from mmfront.chat import URL_PARTS
from mmfront.media import DecodedDataURL, base64_length_fits, is_base64_header

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


@dataclass(frozen=True)
class _LiftedURL:
    text: memoryview
    """The URL as the body holds it: ASCII, made a ``str`` only where it lands outside a media part."""
    decoded: DecodedDataURL


@dataclass
class LiftedBody:
    """A chat body with its data URLs replaced by tokens, and what each token stands for."""

    body: bytes
    urls: dict[str, _LiftedURL] = field(default_factory=dict)

    def restore(self, messages: list[Any]) -> bool:
        """Put each URL back where its token landed, a content part's ``{"url": ...}`` value:
        decoded in the part's own media field, as its text elsewhere. Whether every token was found
        there exactly once (if not, decode the original body)."""
        found = 0
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            for part in content if isinstance(content, list) else ():
                if not isinstance(part, dict):
                    continue
                kind = part.get("type")
                media = part.get(kind) if isinstance(kind, str) and kind in URL_PARTS else None
                for value in part.values():
                    url = value.get("url") if isinstance(value, dict) else None
                    if isinstance(url, str) and url.startswith(_TOKEN_PREFIX):
                        lifted = self.urls.get(url)
                        if lifted is None:
                            return False
                        value["url"] = lifted.decoded if value is media else str(lifted.text, "ascii")
                        found += 1
        return found == len(self.urls)


def lift_data_urls(body: bytes, *, max_media_bytes: int) -> LiftedBody | None:
    """``body`` with its long base64 data URLs lifted out, or ``None`` where it has none. A URL
    whose base64 is longer than ``max_media_bytes`` allows stays in the body, so the connector
    refuses it from its length before anything is decoded, as it refuses the URL itself."""
    pieces: list[bytes] = []
    urls: dict[str, _LiftedURL] = {}
    copied = position = 0
    view = memoryview(body)
    while (key := body.find(_KEY, position)) >= 0:
        position = key + len(_KEY)
        start = _value_start(body, position)
        if start < 0:
            continue
        end = body.find(b'"', start)
        if end < 0:
            break
        position = end + 1
        decoded = _decoded_data_url(body, view, start, end, max_media_bytes) if end - start >= MIN_LIFTED_BYTES else None
        if decoded is not None:
            token = f"{_TOKEN_PREFIX}{len(urls)}"
            urls[token] = _LiftedURL(view[start:end], decoded)
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


def _decoded_data_url(body: bytes, view: memoryview, start: int, end: int,
                      max_media_bytes: int) -> DecodedDataURL | None:
    """The data URL ``body[start:end]`` decoded, where it is plainly one and its size is not
    refused from its length (else ``None``)."""
    comma = body.find(b",", start, min(end, start + _MAX_HEADER))
    if comma < 0 or not _HEADER.fullmatch(body, start, comma) or not is_base64_header(
            str(view[start + 5:comma], "ascii")) or not base64_length_fits(end - comma - 1, max_media_bytes):
        return None
    try:
        data = pybase64.b64decode(view[comma + 1:end], validate=True)
    except (binascii.Error, ValueError):
        return None
    return DecodedDataURL(data, end - comma - 1)


__all__ = ["MIN_LIFTED_BYTES", "LiftedBody", "lift_data_urls"]
