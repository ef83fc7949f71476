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
