"""Request bodies decoded straight into their typed structs (msgspec: one pass, no intermediate
dicts), bounded in depth, then checked as vLLM checks them (:mod:`mmfront.serve.request_checks`).

A body that does not fit raises :class:`~mmfront.errors.RequestBodyError` naming
``body.<field>`` (vLLM's ``param`` for request-shape errors), as vLLM's request models refuse it
before its routes run.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec

from mmfront.errors import MMFrontError, RequestBodyError, ValidationError
from mmfront.serve import structured
from mmfront.serve.errors import BODY_PARAM
from mmfront.serve.inline_media import lift_data_urls
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.request_checks import check_request

# --- request bounds (issue 36: JSON depth; docs/security.md) --------------------------------------

MAX_JSON_DEPTH = 2 * structured.MAX_JSON_NESTING
"""Deepest nesting of arrays and objects a request's fields may reach, the body being level 1
(128): room for the deepest structured-output schema vLLM takes (64 levels, plus 16 for a
structural tag's wrapping) inside the body, and far below where decoding, copying, hashing or
templating a value would exhaust Python's recursion limit."""


_DECODERS = {cls: msgspec.json.Decoder(cls, strict=False) for cls in (ChatCompletionRequest, CompletionRequest)}
"""Lax, as vLLM's pydantic request models are: a number sent as a string (``"n": "2"``), an
integral float for an int (``"max_tokens": 3.0``), ``"true"`` for a bool."""
_ANY_JSON = msgspec.json.Decoder()
_MISSING = re.compile(r"missing required field `(?P<field>[^`]+)`")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`")


def _nesting_past(value: Any, depth: int, limit: int) -> bool:
    """Whether ``value``, at nesting level ``depth`` of the body, holds arrays, objects or structs
    deeper than ``limit``: walked a level at a time (no recursion), each container seen once."""
    level = [value]
    while level:
        containers = [item for item in level if isinstance(item, (dict, list, msgspec.Struct))]
        if not containers:
            return False
        if depth > limit:
            return True
        level = [child for node in containers for child in (
            node.values() if isinstance(node, dict) else
            node if isinstance(node, list) else (getattr(node, f) for f in node.__struct_fields__))]
        depth += 1
    return False


def check_nesting(request: msgspec.Struct) -> None:
    """Refuse a request whose decoded fields nest deeper than :data:`MAX_JSON_DEPTH` (the body is
    level 1): the free-form ones (kwargs, schemas, messages) reach code that copies, hashes or
    renders them with recursion. A field vLLM does not know is skipped by the decoder, and nesting
    past the stack's reach is refused there (:func:`decode_body`). The fields are walked together
    (one walk, where one per field took ~70 for a chat request), and one by one only to name the
    field of a request refused."""
    fields = request.__struct_fields__
    if not _nesting_past([getattr(request, name) for name in fields], 1, MAX_JSON_DEPTH):
        return
    for name in fields:
        if _nesting_past(getattr(request, name), 2, MAX_JSON_DEPTH):
            raise RequestBodyError(f"JSON decode error: `{name}` nests arrays and objects deeper than "
                                   f"{MAX_JSON_DEPTH} levels.", parameter=f"{BODY_PARAM}.{name}")


def decode_body(body: bytes, decoder: msgspec.json.Decoder[Any]) -> Any:
    """``body`` decoded by ``decoder``; a body that does not fit raises
    :class:`~mmfront.errors.RequestBodyError` whose ``parameter`` is
    :data:`~mmfront.serve.errors.BODY_PARAM` or ``body.<field>`` (every route's request shape is
    checked here)."""
    try:
        return decoder.decode(body)
    except RecursionError as e:  # deeper than the decoder's stack reaches (~1,000 levels, as vLLM's)
        raise RequestBodyError(f"JSON decode error: the body nests arrays and objects deeper than {MAX_JSON_DEPTH} "
                               "levels.", parameter=BODY_PARAM) from e
    except msgspec.ValidationError as e:
        message = str(e)
        missing, at = _MISSING.search(message), _AT.search(message)
        if missing:
            param = f"{BODY_PARAM}.{missing['field']}"
        elif at:
            param = BODY_PARAM + re.sub(r"\[(\d+)\]", r".\1", at["path"])
        else:
            param = BODY_PARAM
        raise RequestBodyError(message, parameter=param) from e
    except msgspec.DecodeError as e:
        raise RequestBodyError(f"JSON decode error: {e}", parameter=BODY_PARAM) from e


def decode_request(body: bytes, cls: type[Any]) -> Any:
    """``body`` as a ``cls`` request, checked as vLLM checks it
    (:func:`~mmfront.serve.request_checks.check_request`); a body that does not fit raises
    :class:`~mmfront.errors.RequestBodyError` whose ``parameter`` is
    :data:`~mmfront.serve.errors.BODY_PARAM` or ``body.<field>``."""
    request = decode_body(body, _DECODERS[cls])
    check_nesting(request)
    check_request(request)
    return request


def decode_chat_body(body: bytes, check_bounds: Callable[[bytes], None], *, max_media_bytes: int) -> ChatCompletionRequest:
    """``body`` as a chat request, ``check_bounds`` (the server's
    :func:`~mmfront.serve.chat_bounds.check_chat_body`) run on it first. Its data URLs within
    ``max_media_bytes`` are lifted out before both (:mod:`~mmfront.serve.inline_media`); where the
    lifted body is refused, or its URLs cannot all be put back, the original body is checked and
    decoded, so every error is the original's."""
    lifted = lift_data_urls(body, max_media_bytes=max_media_bytes)
    if lifted is not None:
        try:
            check_bounds(lifted.body)
            request: ChatCompletionRequest = decode_request(lifted.body, ChatCompletionRequest)
        except MMFrontError:
            pass
        else:
            if lifted.restore(request.messages):
                return request
    check_bounds(body)
    return decode_request(body, ChatCompletionRequest)


def fits(body: bytes, cls: type[Any]) -> bool:
    """Whether ``body`` is a valid ``cls`` request as vLLM's request model validates it
    (``/invocations`` picks its route so): a chat request's checks are its model's validators,
    while a completion's prompt and options are checked by its route, so any completion-shaped
    body fits. A body that is not JSON raises :class:`~mmfront.errors.RequestBodyError`."""
    decode_body(body, _ANY_JSON)
    try:
        if cls is CompletionRequest:
            decode_body(body, _DECODERS[cls])
        else:
            decode_request(body, cls)
    except ValidationError:
        return False
    return True


__all__ = ["MAX_JSON_DEPTH", "check_nesting", "decode_body", "decode_chat_body", "decode_request", "fits"]
