"""Request bodies to typed requests: fields vLLM does not know are ignored, and the field a
malformed body gets wrong is named ``body.<field>``."""

from __future__ import annotations

import pytest

from mmfront.errors import RequestBodyError, ValidationError
from mmfront.serve import request_decoding
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest, prompts


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


def test_numbers_and_bools_are_read_as_vllms_lax_models_read_them() -> None:
    request = request_decoding.decode_request(
        b'{"prompt": "a", "n": "2", "seed": "7", "temperature": "0.5", "max_tokens": 3.0, "ignore_eos": "true", '
        b'"logit_bias": {"5": "1.5"}}', CompletionRequest)
    assert (request.n, request.seed, request.temperature, request.max_tokens, request.ignore_eos) == (2, 7, 0.5, 3, True)
    assert request.logit_bias == {"5": "1.5"}  # read as a number with the other biases, later


@pytest.mark.parametrize("field", [b'"max_tokens": 3.5', b'"n": "two"', b'"temperature": "warm"'])
def test_values_no_lax_reading_turns_into_the_type_are_refused(field: bytes) -> None:
    with pytest.raises(RequestBodyError):
        request_decoding.decode_request(b'{"prompt": "a", ' + field + b"}", CompletionRequest)


def test_a_completions_null_max_tokens_is_its_default_as_in_vllm() -> None:
    assert request_decoding.decode_request(b'{"prompt": "a", "max_tokens": null}', CompletionRequest).max_tokens == 16
    assert request_decoding.decode_request(b'{"prompt": "a"}', CompletionRequest).max_tokens == 16
    chat = request_decoding.decode_request(b'{"messages": [], "max_tokens": null}', ChatCompletionRequest)
    assert chat.max_tokens is None  # a chat's has no default: the context decides


@pytest.mark.parametrize(("prompt", "expected"), [
    ('"a"', ["a"]), ('["a", ""]', ["a", ""]), ("[1, 2]", [[1, 2]]), ("[[1], [2, 3]]", [[1], [2, 3]]),
    ("[[1], []]", [[1], []]),  # the empty one is refused as an empty prompt, by the route
])
def test_a_completions_prompts(prompt: str, expected: list[object]) -> None:
    body = b'{"prompt": ' + prompt.encode() + b"}"
    assert prompts(request_decoding.decode_request(body, CompletionRequest)) == expected


@pytest.mark.parametrize("prompt", ['["a", [1]]', '[1, "a"]', '[[1], "a"]', "[[1, [2]]]", "[true]"])
def test_a_prompt_list_of_two_kinds_is_a_body_error(prompt: str) -> None:
    with pytest.raises(RequestBodyError) as info:
        request_decoding.decode_request(b'{"prompt": ' + prompt.encode() + b"}", CompletionRequest)
    assert info.value.parameter == "body.prompt"
