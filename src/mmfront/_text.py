"""The one check every user string passes before it is tokenized, hashed or sent on the wire.

A Python ``str`` can hold lone UTF-16 surrogates (``"\\ud800"``: what a JSON parser yields for a
broken ``\\ud800`` escape), which no UTF-8 encoder accepts. Left alone they fail deep inside the
tokenizer, the hasher or msgpack with an untyped error; checked here they are refused up front
with a :class:`~mmfront.errors.ValidationError` naming the request field.
"""

from __future__ import annotations

from mmfront.errors import ValidationError


def check_text(value: str, *, parameter: str, where: str) -> None:
    """Refuse ``value`` if it cannot be encoded as UTF-8. ``where`` names the string in the message
    (``"messages[0].role"``), ``parameter`` the request field an API server reports."""
    if value.isascii():
        return  # the common case, checked in C without copying
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(
            f"{where} holds the lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start}, which is not "
            "valid Unicode text. Send valid UTF-8 (a JSON \\ud83d\\ude00 escape must come as a complete pair).",
            parameter=parameter,
        ) from None
