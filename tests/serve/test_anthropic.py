"""The Anthropic Messages API's pieces without a server: a body checked as vLLM's request model
checks it, translated into the chat request vLLM makes of it, and a chat answer or stream written
back as Anthropic's message or events (side by side with ``vllm serve``:
test_vllm_serve_anthropic.py; over HTTP in front of ``mmfront worker``: test_routes.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmfront.errors import GenerationError, RequestBodyError, ValidationError
from mmfront.serve import responses
from mmfront.serve.anthropic_messages import (
    anthropic_usage,
    error_type,
    merges_inline_system,
    message_events,
    stop_reason,
    whole_message,
)
from mmfront.serve.anthropic_protocol import (
    AnthropicCountTokensRequest,
    AnthropicMessagesRequest,
    decode_anthropic,
    to_chat_request,
)
from mmfront.serve.responses import ResponseHead

HEAD = ResponseHead("chatcmpl-1", 1, "m", "fp")


def decode(body: dict[str, Any], cls: type[Any] = AnthropicMessagesRequest) -> Any:
    return decode_anthropic(json.dumps(body).encode(), cls)


def chat_of(body: dict[str, Any], *, merge: bool = False, effort: Any = "none") -> Any:
    return to_chat_request(decode(body), merge_inline_system=merge, disabled_thinking_effort=effort)


# --- the body ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(("body", "param", "words"), [
    ({"model": "m", "messages": []}, "body.max_tokens", "missing required field"),
    ({"model": "", "max_tokens": 1, "messages": []}, "body.model", "Model is required"),
    ({"model": "m", "max_tokens": 0, "messages": []}, "body.max_tokens", "max_tokens must be positive"),
    ({"model": "m", "max_tokens": 9, "messages": [{"role": "tool", "content": "x"}]}, "body.messages.0.role", ""),
    ({"model": "m", "max_tokens": 3000, "thinking": {"type": "enabled", "budget_tokens": 100}, "messages": []},
     "body.thinking.budget_tokens", ">= 1024"),
    ({"model": "m", "max_tokens": 1500, "thinking": {"type": "enabled", "budget_tokens": 2000}, "messages": []},
     "body", "thinking.budget_tokens must be less than max_tokens"),
    ({"model": "m", "max_tokens": 9, "stop_sequences": list("abcde"), "messages": []}, "body.stop_sequences", ""),
    ({"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "f"}}]}]}, "body.messages.0",
     'tool_removal blocks are only allowed in messages with role "system"'),
    ({"model": "m", "max_tokens": 9, "messages": [{"role": "system", "content": [{"type": "tool_addition"}]}]},
     "body.messages.0.content.0", "tool is required for tool_addition blocks"),
    ({"model": "m", "max_tokens": 9, "messages": [{"role": "system", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_definition", "definition": {
            "name": "f", "input_schema": {}}}}]}]}, "body.messages.0.content.0",
     "tool_removal only accepts a tool_reference"),
    ({"model": "m", "max_tokens": 9, "tool_choice": {"type": "tool"}, "messages": []}, "body.tool_choice",
     "tool_choice.name is required"),
    ({"model": "m", "max_tokens": 9, "cache_salt": "", "messages": []}, "body.cache_salt", ""),
])
def test_a_body_vllms_request_model_refuses(body: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(RequestBodyError, match=words) as info:
        decode(body)
    assert info.value.parameter == param


def test_a_body_is_read_laxly_as_pydantic_reads_it() -> None:
    request = decode({"model": "m", "max_tokens": "3", "stream": "true", "messages": []})
    assert (request.max_tokens, request.stream) == (3, True)


def test_a_tool_schema_without_a_type_is_an_object() -> None:
    request = decode({"model": "m", "max_tokens": 1, "messages": [], "tools": [{"name": "f", "input_schema": {}}]})
    assert request.tools[0].input_schema == {"type": "object"}


# --- the chat request -------------------------------------------------------------------------------


def test_the_conversation_becomes_vllms_chat_messages() -> None:
    chat = chat_of({"model": "m", "max_tokens": 7, "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc=1"}, {"type": "text", "text": "Be "},
        {"type": "text", "text": "brief."}], "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Look"}, {"type": "image", "source": {
            "type": "base64", "media_type": "image/png", "data": "QUJD"}}, {"type": "image", "source": {
            "type": "url", "url": "https://x/y.jpg"}}]},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "a", "signature": "s"}, {"type": "thinking", "thinking": "b"},
            {"type": "redacted_thinking", "data": "zz"}, {"type": "text", "text": "Calling."},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": "é"}},
            {"type": "tool_result", "tool_use_id": "t0", "content": [{"type": "text", "text": "r"}]}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "one"}, {"type": "text", "text": "two"},
                {"type": "image", "source": {"type": "base64", "data": "REVG"}},
                {"type": "tool_reference", "tool_name": "g"}]},
            {"type": "text", "text": "Thanks"}]},
        {"role": "system", "content": "Inline."},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "plain"}]},
        {"role": "assistant", "content": []}]})
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look"},
                                     {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
                                     {"type": "image_url", "image_url": {"url": "https://x/y.jpg"}}]},
        {"role": "assistant", "reasoning": "ab", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"q": "\\u00e9"}'}}],
         "content": [{"type": "text", "text": "Calling."},
                     {"type": "text", "text": "Tool result: [{'type': 'text', 'text': 'r'}]"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "one\ntwo"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,REVG"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "tool_reference", "name": "g"}]},
        {"role": "user", "content": "Thanks"},
        {"role": "system", "content": "Inline."},
        {"role": "tool", "tool_call_id": "t2", "content": "plain"},
        {"role": "assistant"},
    ]
    assert (chat.max_tokens, chat.max_completion_tokens, chat.stream, chat.tool_choice) == (7, 7, False, None)


def test_inline_system_messages_merge_into_the_leading_one_where_the_template_needs_it() -> None:
    body = {"model": "m", "max_tokens": 1, "system": "A.", "messages": [
        {"role": "user", "content": "u"}, {"role": "system", "content": [{"type": "text", "text": "B."}]},
        {"role": "system", "content": "x-anthropic-billing-header: 1"}]}
    assert chat_of(body, merge=True).messages == [{"role": "system", "content": "A.B."},
                                                 {"role": "user", "content": "u"}]
    assert chat_of(body).messages == [{"role": "system", "content": "A."}, {"role": "user", "content": "u"},
                                      {"role": "system", "content": "B."}]


def test_the_options_become_vllms_chat_fields() -> None:
    chat = chat_of({"model": "m", "max_tokens": 50, "stream": True, "stop_sequences": ["x"], "temperature": 0.2,
                    "top_p": 0.9, "top_k": 4, "cache_salt": "s", "vllm_xargs": {"k": 1},
                    "output_config": {"effort": "high", "format": {"type": "json_schema", "schema": {"type": "object"}}},
                    "thinking": {"type": "disabled"}, "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
                    "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}, "strict": True}],
                    "messages": [{"role": "user", "content": "hi"}]}, effort="low")
    assert (chat.stop, chat.temperature, chat.top_p, chat.top_k, chat.cache_salt, chat.vllm_xargs) == (
        ["x"], 0.2, 0.9, 4, "s", {"k": 1})
    assert msgspec.to_builtins(chat.stream_options) == {"include_usage": True, "continuous_usage_stats": True}
    assert msgspec.to_builtins(chat.response_format) == {"type": "json_schema", "json_schema": {
        "name": "json_schema", "description": None, "schema": {"type": "object"}, "strict": None}}
    assert chat.reasoning_effort == "low"  # thinking disabled wins over the effort
    assert (chat.tool_choice, chat.parallel_tool_calls) == ("required", False)
    assert msgspec.to_builtins(chat.tools) == [{"type": "function", "function": {
        "name": "f", "description": "d", "parameters": {"type": "object"}, "strict": True}}]
    named = chat_of({"model": "m", "max_tokens": 2000, "tool_choice": {"type": "tool", "name": "f"},
                     "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": []})
    assert (named.tool_choice.function, named.thinking_token_budget, named.tools) == ({"name": "f"}, 1024, None)
    assert chat_of({"model": "m", "max_tokens": 5, "tools": [], "messages": []}).tool_choice == "auto"


def test_tool_changes_resolve_the_tools_in_effect_at_the_end() -> None:
    chat = chat_of({"model": "m", "max_tokens": 5, "tools": [
        {"name": "a", "input_schema": {}}, {"name": "b", "input_schema": {}, "defer_loading": True},
        {"name": "c", "input_schema": {}}], "messages": [
        {"role": "system", "content": [
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "b"}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "a"}},
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {
                "name": "d", "input_schema": {"type": "object"}}}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "c"}},
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "c"}}]},
        {"role": "user", "content": "hi"}]})
    assert [(t.function.name, t.function.defer_loading) for t in chat.tools] == [
        ("b", msgspec.UNSET), ("c", msgspec.UNSET), ("d", msgspec.UNSET)]
    with pytest.raises(ValidationError, match="tool_removal references tool 'zz', which is not declared in tools"):
        chat_of({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": [
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "zz"}}]}]})


def test_count_tokens_keeps_the_conversation_and_template_only() -> None:
    request = decode({"model": "m", "chat_template_kwargs": {"k": 1}, "thinking": {"type": "enabled", "budget_tokens": 2000},
                      "messages": [{"role": "user", "content": "hi"}]}, AnthropicCountTokensRequest)
    chat = to_chat_request(request, merge_inline_system=False, disabled_thinking_effort="none")
    assert (chat.max_tokens, chat.chat_template_kwargs, chat.stream, chat.thinking_token_budget) == (
        None, {"k": 1}, False, None)


@pytest.mark.parametrize(("template", "merges"), [
    ("{% for m in messages %}{% if m.role == 'system' and not loop.first %}{{ raise_exception('first only') }}"
     "{% endif %}{{ m.content }}{% endfor %}", True),
    ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", False),
    ("{% for m in messages %}{{ m.content | nosuchfilter }}{% endfor %}", True),
])
def test_a_template_that_refuses_inline_system_messages_merges_them(template: str, merges: bool) -> None:
    assert merges_inline_system(template) is merges


# --- the answer -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("finish", "stop", "used", "complete", "want"), [
    ("length", "x", True, True, ("max_tokens", None)),
    ("stop", None, False, False, ("end_turn", None)),
    ("stop", 7, False, False, ("end_turn", None)),
    ("stop", "END", False, False, ("stop_sequence", "END")),
    ("stop", "END", True, True, ("tool_use", None)),
    ("stop", "END", True, False, ("stop_sequence", "END")),
    ("stop", None, True, False, ("tool_use", None)),
    ("tool_calls", None, False, False, ("tool_use", None)),
    ("abort", None, False, False, (None, None)),
])
def test_stop_reasons(finish: str, stop: Any, used: bool, complete: bool, want: tuple[Any, Any]) -> None:
    assert stop_reason(finish, stop, tool_used=used, tool_complete=complete) == want


def test_usage_takes_cached_tokens_out_of_the_input() -> None:
    usage = responses.usage(100, 5)
    assert msgspec.to_builtins(anthropic_usage(usage)) == {"input_tokens": 100, "output_tokens": 5}
    usage.prompt_tokens_details = responses.PromptTokenUsageInfo(cached_tokens=64, created_cache_tokens=16)
    assert msgspec.to_builtins(anthropic_usage(usage)) == {
        "input_tokens": 20, "output_tokens": 5, "cache_creation_input_tokens": 16, "cache_read_input_tokens": 64}
    assert msgspec.to_builtins(anthropic_usage(msgspec.UNSET)) == {"input_tokens": 0, "output_tokens": 0}


@pytest.mark.parametrize(("status", "kind"), [(400, "invalid_request_error"), (401, "authentication_error"),
                                              (404, "not_found_error"), (422, "invalid_request_error"),
                                              (503, "overloaded_error"), (500, "api_error"), (501, "api_error")])
def test_error_types_by_status(status: int, kind: str) -> None:
    assert error_type(status) == kind


def test_a_whole_answer_becomes_a_message() -> None:
    message = responses.ChatMessage(content="Sure.", reasoning="think", tool_calls=[
        responses.ToolCall(id="call-1", function=responses.FunctionCall("f", '{"a": [1]}'))])
    choice = responses.ChatCompletionResponseChoice(index=0, message=message, logprobs=None,
                                                    finish_reason="tool_calls", stop_reason=None)
    answer = responses.chat_response(HEAD, [choice], responses.usage(10, 4))
    body = msgspec.json.decode(responses.ENCODER.encode(whole_message(answer)))
    signature = body["content"][0].pop("signature")
    assert len(signature) == 32 and int(signature, 16) >= 0
    assert body == {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [
        {"type": "thinking", "thinking": "think"}, {"type": "text", "text": "Sure."},
        {"type": "tool_use", "id": "call-1", "name": "f", "input": {"a": [1]}}], "model": "m",
        "stop_reason": "tool_use", "usage": {"input_tokens": 10, "output_tokens": 4}}
    empty = responses.chat_response(HEAD, [responses.ChatCompletionResponseChoice(
        index=0, message=responses.ChatMessage(content=None), logprobs=None, finish_reason="abort", stop_reason=None)],
        responses.usage(3, 0))
    assert msgspec.to_builtins(whole_message(empty))["content"] == [{"type": "text", "text": ""}]
    assert "stop_reason" not in msgspec.to_builtins(whole_message(empty))


def chunk(content: str | None = None, *, reasoning: str | None = None, calls: list[responses.DeltaToolCall] = (),
          finish: str | None = None, stop: Any = None) -> responses.ChatCompletionStreamResponse:
    return responses.chat_chunk(HEAD, 0, content, logprobs=None, finish_reason=finish, stop_reason=stop,
                                fingerprint=False, usage_info=responses.usage(9, 1, details=False), reasoning=reasoning,
                                tool_calls=list(calls))


def call(index: int, *, id: str | None = None, name: str | None = None, arguments: str | None = None,
         ) -> responses.DeltaToolCall:
    return responses.DeltaToolCall(
        id=msgspec.UNSET if id is None else id, type=msgspec.UNSET if id is None else "function", index=index,
        function=responses.DeltaFunctionCall(name=msgspec.UNSET if name is None else name,
                                             arguments=msgspec.UNSET if arguments is None else arguments))


def run(chunks: list[Any], fail: BaseException | None = None) -> list[tuple[str, Any]]:
    async def source() -> AsyncIterator[responses.ChatCompletionStreamResponse]:
        for item in chunks:
            yield item
        if fail is not None:
            raise fail

    async def collect() -> list[bytes]:
        return [event async for event in message_events(source())]

    out = []
    for event in asyncio.run(collect()):
        name, data = event.decode().removesuffix("\n\n").split("\n")
        out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


ROLE = responses.chat_role_chunk(HEAD, 0, responses.usage(9, 0, details=False))
USAGE = responses.chat_usage_chunk(HEAD, responses.usage(9, 6, details=False))


def test_a_stream_of_thinking_text_and_calls_becomes_blocks() -> None:
    events = run([ROLE, chunk(reasoning="Hm"), chunk(reasoning="m."), chunk("Let me"), chunk(" check."),
                  chunk(calls=[call(0, id="c1", name="f", arguments='{"a"')]), chunk("held"),
                  chunk(calls=[call(0, arguments=": 1}")]), chunk(calls=[call(1, id="c2", name="g")]),
                  chunk(calls=[call(1, arguments="{}")], finish="tool_calls"), USAGE])
    signature = events[4][1]["delta"].pop("signature")
    assert len(signature) == 32
    assert events == [
        ("message_start", {"type": "message_start", "message": {
            "id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [], "model": "m",
            "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 9, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "content_block": {"type": "thinking", "thinking": ""},
                                 "index": 0}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "Hm"},
                                 "index": 0}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "m."},
                                 "index": 0}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "signature_delta"}, "index": 0}),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                 "index": 1}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Let me"},
                                 "index": 1}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": " check."},
                                 "index": 1}),
        ("content_block_stop", {"type": "content_block_stop", "index": 1}),
        ("content_block_start", {"type": "content_block_start", "content_block": {
            "type": "tool_use", "id": "c1", "name": "f", "input": {}}, "index": 2}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {
            "type": "input_json_delta", "partial_json": '{"a"'}, "index": 2}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {
            "type": "input_json_delta", "partial_json": ": 1}"}, "index": 2}),
        ("content_block_stop", {"type": "content_block_stop", "index": 2}),
        ("content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                 "index": 3}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "held"},
                                 "index": 3}),
        ("content_block_stop", {"type": "content_block_stop", "index": 3}),
        ("content_block_start", {"type": "content_block_start", "content_block": {
            "type": "tool_use", "id": "c2", "name": "g", "input": {}}, "index": 4}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {
            "type": "input_json_delta", "partial_json": "{}"}, "index": 4}),
        ("content_block_stop", {"type": "content_block_stop", "index": 4}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                           "usage": {"input_tokens": 9, "output_tokens": 6}}),
        ("message_stop", {"type": "message_stop"}),
    ]


def test_a_stop_string_that_cuts_a_call_short_is_the_stop_reason() -> None:
    events = run([ROLE, chunk(calls=[call(0, id="c1", name="f", arguments='{"a": ')], finish="stop", stop="X"),
                  USAGE])
    assert events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "X"}


def test_a_failure_mid_stream_closes_the_block_and_ends_with_an_error_event() -> None:
    events = run([ROLE, chunk("partial")], fail=GenerationError("The engine failed the request: boom"))
    assert [name for name, _ in events] == ["message_start", "content_block_start", "content_block_delta",
                                            "content_block_stop", "error"]
    assert events[-1][1] == {"type": "error", "error": {"type": "api_error",
                                                        "message": "The engine failed the request: boom"}}
    assert run([], fail=ValidationError("bad"))[-1][1]["error"] == {"type": "invalid_request_error", "message": "bad"}


@settings(deadline=None)  # each example runs an event loop of its own: a loaded machine stretches it past 200 ms
@given(st.lists(st.one_of(st.text(min_size=1, max_size=4).map(lambda t: ("text", t)),
                          st.text(min_size=1, max_size=4).map(lambda t: ("reasoning", t)),
                          st.integers(0, 2).map(lambda i: ("call", i))), max_size=12))
def test_blocks_open_and_close_in_order_whatever_the_deltas(steps: list[tuple[str, Any]]) -> None:
    """Every block started is stopped once, in index order, with deltas only while it is open."""
    chunks: list[Any] = [ROLE]
    started: set[int] = set()
    for kind, value in steps:
        if kind == "call":
            first = value not in started
            started.add(value)
            chunks.append(chunk(calls=[call(value, id=f"c{value}" if first else None, name="f" if first else None,
                                            arguments="{}")]))
        else:
            chunks.append(chunk(**{"content" if kind == "text" else "reasoning": value}))
    events = run([*chunks, USAGE])
    open_block: int | None = None
    seen = -1
    for name, data in events[1:-2]:
        if name == "content_block_start":
            assert open_block is None and data["index"] == seen + 1
            open_block = seen = data["index"]
        elif name == "content_block_delta":
            assert data["index"] == open_block
        else:
            assert name == "content_block_stop" and data["index"] == open_block
            open_block = None
    assert open_block is None and [name for name, _ in events[-2:]] == ["message_delta", "message_stop"]


def test_a_body_nested_past_the_bound_is_refused_naming_its_field() -> None:
    deep: Any = "x"
    for _ in range(200):
        deep = {"k": deep}
    with pytest.raises(RequestBodyError, match="nests arrays and objects deeper than 128 levels") as info:
        decode({"model": "m", "max_tokens": 1, "messages": [], "tools": [{"name": "f", "input_schema": deep}]})
    assert info.value.parameter == "body.tools"
