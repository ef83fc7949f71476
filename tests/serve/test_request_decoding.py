"""Request bodies to typed requests: fields vLLM does not know are ignored, and the field a
malformed body gets wrong is named ``body.<field>``."""

from __future__ import annotations

import pytest

from mmfront.errors import ValidationError
from mmfront.serve import request_decoding
from mmfront.serve.protocol import ChatCompletionRequest


def test_unknown_fields_are_ignored_as_vllm_ignores_them() -> None:
    request = request_decoding.decode_request(b'{"messages": [{"role": "user", "content": "hi"}], "foo_bar": 1, '
                                              b'"max_tokens": 3}', ChatCompletionRequest)
    assert request.max_tokens == 3


@pytest.mark.parametrize(("body", "param"), [
    (b'{"model": "m"}', "body.messages"),
    (b'{"messages": "hi"}', "body.messages"),
    (b'{"messages": [], "max_tokens": "many"}', "body.max_tokens"),
    (b'{"messages": [1]}', "body.messages.0"),
    (b"{not json", "body"),
    (b"[]", "body"),
])
def test_malformed_bodies_name_the_field(body: bytes, param: str) -> None:
    with pytest.raises(ValidationError) as info:
        request_decoding.decode_request(body, ChatCompletionRequest)
    assert info.value.parameter == param


def nested_kwargs(levels: int) -> bytes:
    """A chat body whose ``chat_template_kwargs`` holds lists ``levels`` deep (the body is level 1,
    the kwargs object level 2), beside other fields that nest too."""
    deep = "[" * levels + "]" * levels
    return (b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], '
            b'"logit_bias": {"1": 2}, "chat_template_kwargs": {"a": ' + deep.encode() + b"}}")


def test_nesting_up_to_the_bound_passes_and_past_it_names_the_field() -> None:
    """The fields are walked together (issue 34); the bound and the field named are as before."""
    bound = request_decoding.MAX_JSON_DEPTH
    request = request_decoding.decode_request(nested_kwargs(bound - 2), ChatCompletionRequest)
    assert request.logit_bias == {"1": 2}
    with pytest.raises(ValidationError) as info:
        request_decoding.decode_request(nested_kwargs(bound - 1), ChatCompletionRequest)
    assert info.value.parameter == "body.chat_template_kwargs"
    assert str(info.value) == (f"JSON decode error: `chat_template_kwargs` nests arrays and objects deeper than "
                               f"{bound} levels.")
