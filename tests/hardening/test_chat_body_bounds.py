"""Issue 36's soak: a chat body's bounds (messages, content parts, characters of text) come from
one decode that builds nothing per message but its text, before the request is decoded. A 60 MB
text was decoded twice (once to count, once as the request) before it was refused: ~50 ms each
with the GIL held while every other request of the server waited. And a content of another JSON
kind (a number, an object) made that decode fail, which skipped every bound."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mmfront.errors import ValidationError
from mmfront.serve.chat_bounds import check_chat_body


def body(messages: Any, **fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **fields}).encode()


def check(data: bytes, *, max_messages: int = 10, max_parts: int = 10, max_prompt_chars: int = 100) -> None:
    check_chat_body(data, max_messages=max_messages, max_parts=max_parts, max_prompt_chars=max_prompt_chars)


def refusal(data: bytes, **limits: int) -> str:
    with pytest.raises(ValidationError) as info:
        check(data, **limits)
    assert info.value.parameter == "messages"
    return str(info.value)


def test_text_over_the_prompt_bound_is_refused_from_the_bytes_whatever_else_the_body_holds() -> None:
    """``temperature`` is not a number: the request's own decode would refuse it, but the text
    bound is read first, from the one decode that also counts."""
    data = body([{"role": "user", "content": "x" * 60}, {"role": "user", "content": [
        {"type": "text", "text": "y" * 41}, {"type": "image_url", "image_url": {"url": "data:,"}}]}],
        temperature="hot")
    assert refusal(data) == ("The messages hold 101 characters of text; the longest prompt the server tokenizes is "
                             "100 characters (max_prompt_chars). Shorten the conversation; it was not rendered.")
    check(data, max_prompt_chars=101)


def test_a_text_too_long_in_any_encoding_is_refused_from_its_bytes() -> None:
    """A JSON character takes 1 to 12 bytes (an escaped surrogate pair): 1,212 bytes of text hold at
    least 101 characters, refused without decoding them (a 60 MB text is never built); within the
    bounds' reach the characters are decoded and counted exactly."""
    assert refusal(body([{"role": "user", "content": "a" * 1212}])).startswith(
        "The messages hold at least 101 characters of text; the longest prompt the server tokenizes is 100 ")
    smileys = body([{"role": "user", "content": "\U0001f600" * 9}])
    assert smileys.count(b"\\ud83d\\ude00") == 9
    check(smileys, max_prompt_chars=9)
    assert refusal(smileys, max_prompt_chars=8).startswith("The messages hold at least 9 characters")


def test_characters_are_counted_after_json_escapes() -> None:
    """``\\u00e9`` is one character in six bytes: the bound is on characters, as the template sees them."""
    data = body([{"role": "user", "content": "\u00e9" * 100}])
    assert len(data) > 600
    check(data)
    assert refusal(body([{"role": "user", "content": "\u00e9" * 101}])).startswith("The messages hold 101 characters")


@pytest.mark.parametrize("odd", [5, 1.5, True, {"text": "a"}, None])
def test_a_content_of_another_kind_does_not_lift_the_bounds(odd: Any) -> None:
    """Before, one message whose content was a number or an object failed the counting decode,
    and a million messages went on to be decoded into a million dicts."""
    many = [{"role": "user", "content": "a"}] * 11 + [{"role": "user", "content": odd}]
    assert refusal(body(many)).startswith("The request has 12 messages; the server's limit is 10")
    long = [{"role": "user", "content": "a" * 101}, {"role": "user", "content": odd}]
    assert refusal(body(long)).startswith("The messages hold 101 characters")


def test_parts_of_another_shape_count_as_parts_with_no_text() -> None:
    parts: list[Any] = ["a part that is a string", 7, {"type": "text", "text": 5}, {"type": "text", "text": "b" * 100}]
    check(body([{"role": "user", "content": parts}]))
    assert refusal(body([{"role": "user", "content": parts * 3}])).startswith(
        "The request's messages have 12 content parts; the server's limit is 10")


def test_a_body_of_another_shape_is_left_to_the_request_decode() -> None:
    for data in [b"not json", b"[]", body("not a list"), body([1, 2]), b'{"messages": [' * 3000]:
        check(data)
