"""Hostile bodies on every generation route: any field of a valid body (each field of the route's
request struct, and the nested message, part and block fields a conversation carries) replaced by
any JSON value, or written as JSON a strict parser refuses (``NaN``, lone surrogates, huge
integers). The server answers each with vLLM's shapes and a status below 500 (or vLLM's 501 for a data URL that is not base64): a 200 whose body
parses (a stream that ends as the route's streams end), or a 4xx whose body is the route's error
JSON with ``code`` equal to the status; and it stays healthy for the next request.

Against ``mmfront serve``'s app in process (the reference engine behind it), one server for the
module; hypothesis draws the field and the value (a fixed budget of examples per route)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mmfront.serve.anthropic_protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
from mmfront.serve.protocol import ChatCompletionRequest, CompletionRequest
from mmfront.serve.settings import ServeSettings
from mmfront.testing.media import image_data_url, make_image
from serve.serve_harness import MODEL_NAME, Served, serve

pytestmark = pytest.mark.slow

IMAGE = image_data_url(make_image(24, 20, seed=5))
CHAT_BODY: dict[str, Any] = {
    "model": MODEL_NAME, "max_tokens": 2, "temperature": 0,
    "messages": [{"role": "system", "content": "Be brief."},
                 {"role": "user", "content": [{"type": "image_url", "image_url": {"url": IMAGE}},
                                              {"type": "text", "text": "What is this?"}]}]}
SCHEMA: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}}, "required": ["a"]}
TOOLS_BODY: dict[str, Any] = {
    "model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "messages": [{"role": "user", "content": "Call f."}],
    "tools": [{"type": "function", "function": {"name": "f", "description": "d", "parameters": SCHEMA}}],
    "tool_choice": "required", "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}}
COMPLETION_BODY: dict[str, Any] = {"model": MODEL_NAME, "prompt": "Say something", "max_tokens": 2, "temperature": 0}
MESSAGES_BODY: dict[str, Any] = {
    "model": MODEL_NAME, "max_tokens": 2, "temperature": 0, "system": "Be brief.",
    "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": IMAGE.split(",", 1)[1]}},
        {"type": "text", "text": "What is this?"}]}]}


def _paths(struct: type[msgspec.Struct], nested: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Every top-level field of the route's request struct (by its JSON name), then the nested ones."""
    return [(field.encode_name,) for field in msgspec.structs.fields(struct)] + nested


CHAT_PATHS = _paths(ChatCompletionRequest, [
    ("messages", 0), ("messages", 0, "role"), ("messages", 0, "content"), ("messages", 1, "content", 0),
    ("messages", 1, "content", 0, "type"), ("messages", 1, "content", 0, "image_url"),
    ("messages", 1, "content", 0, "image_url", "url"), ("messages", 1, "content", 0, "image_url", "detail"),
    ("messages", 1, "content", 1, "text"), ("messages", 1, "name"), ("messages", 1, "tool_calls")])
SCHEMA_PATHS = [("tools", 0), ("tools", 0, "type"), ("tools", 0, "function"), ("tools", 0, "function", "name"),
                ("tools", 0, "function", "parameters"), ("tools", 0, "function", "strict"), ("tool_choice",),
                ("response_format",), ("response_format", "type"), ("response_format", "json_schema"),
                ("response_format", "json_schema", "schema"), ("structured_outputs",)] + [
    (*prefix, *rest) for prefix in (("tools", 0, "function", "parameters"), ("response_format", "json_schema", "schema"))
    for rest in (("type",), ("properties",), ("properties", "a"), ("properties", "a", "type"), ("required",),
                 ("properties", "a", "minimum"), ("additionalProperties",), ("$defs",), ("$ref",))]
COMPLETION_PATHS = _paths(CompletionRequest, [])
MESSAGES_PATHS = _paths(AnthropicMessagesRequest, [
    ("messages", 0, "role"), ("messages", 0, "content"), ("messages", 0, "content", 0),
    ("messages", 0, "content", 0, "source"), ("messages", 0, "content", 0, "source", "type"),
    ("messages", 0, "content", 0, "source", "data"), ("messages", 0, "content", 0, "source", "media_type"),
    ("messages", 0, "content", 1, "type"), ("messages", 0, "content", 1, "text")])
COUNT_PATHS = _paths(AnthropicCountTokensRequest, [("messages", 0, "content", 1, "text")])

_SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.sampled_from([0, 1, 2, 3, -1, -2**31, 2**31, 2**53 + 1, 2**63, -2**63 - 1, 10**40]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(["", "\ud800", "\x00", "user", "assistant", "system", "tool", "text", "image_url", "auto",
                     "none", "required", "json_object", "data:image/png;base64,AAAA", "file:///etc/passwd"]))
HOSTILE = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["type", "text", "url", "role", "name", "x"]), inner,
                                                 max_size=3)), max_leaves=6)
"""Any JSON value (and the strict-JSON outcasts ``json.dumps`` writes: NaN, infinities, lone
surrogates), small: a large one only makes the example slower. Integers come from a set with the
bounds around them (a mid-size ``max_tokens`` would only make a long answer)."""
SCHEMA_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(
        ["type", "properties", "items", "enum", "const", "$ref", "$defs", "anyOf", "oneOf", "allOf", "not", "pattern",
         "format", "minimum", "maximum", "minLength", "maxItems", "required", "additionalProperties", "a"]), inner,
        max_size=4)), max_leaves=10)
"""Values for a JSON schema's places: schema keywords nested in any way, with any values."""


def _replaced(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any] | None:
    """A deep copy of ``body`` with ``path``'s value set (a field that is absent is added), or
    None where the path does not exist in this body (a part that an earlier mutation removed)."""
    copy: Any = json.loads(json.dumps(body))
    node = copy
    for key in path[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return None
    if isinstance(node, list) and not (isinstance(path[-1], int) and path[-1] < len(node)):
        return None
    node[path[-1]] = value
    return dict(copy)


@pytest.fixture(scope="module")
def served(gemma3_weights_dir: Path) -> Iterator[Served]:
    settings = ServeSettings(str(gemma3_weights_dir), served_model_name=(MODEL_NAME,), enable_auto_tool_choice=True,
                             tool_call_parser="hermes")  # tools served, so their schemas reach the grammar
    with serve(gemma3_weights_dir, settings) as running:
        yield running


def _check_error(answer: httpx.Response, anthropic: bool) -> None:
    body = answer.json()
    if anthropic and body.get("type") == "error":  # refused after the body was read: Anthropic's shape
        assert set(body) == {"type", "error"} and set(body["error"]) == {"type", "message"}, body
        assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
        return
    error = body["error"]  # vLLM's OpenAI error JSON (on /v1/messages too, for a body its model refuses)
    assert set(error) == {"message", "type", "param", "code"}, body
    assert error["code"] == answer.status_code and isinstance(error["message"], str) and error["message"], body


def _check_stream(text: str, anthropic: bool) -> None:
    events = [line for line in text.split("\n") if line.startswith("data: ")]
    assert events, text[:2000]
    if anthropic:
        last = json.loads(events[-1][len("data: "):])
        assert last["type"] in ("message_stop", "error"), text[-2000:]
    else:
        assert events[-1] == "data: [DONE]", text[-2000:]
        for event in events[:-1]:
            json.loads(event[len("data: "):])


def _post_hostile(served: Served, route: str, body: dict[str, Any], anthropic: bool = False) -> None:
    raw = json.dumps(body)  # NaN, Infinity and lone surrogates as Python writes them: not strict JSON
    answer = httpx.post(served.url + route, content=raw.encode("utf-8", "surrogatepass"), timeout=120,
                        headers={"Content-Type": "application/json"})
    refused_as_vllm = answer.status_code == 501 and "Only base64 data URLs are supported" in answer.text  # as vLLM
    assert answer.status_code < 500 or refused_as_vllm, (route, raw[:1000], answer.status_code, answer.text[:2000])
    if answer.status_code >= 400:
        _check_error(answer, anthropic)
    elif answer.headers["content-type"].startswith("text/event-stream"):
        _check_stream(answer.text, anthropic)
    else:
        assert isinstance(answer.json(), dict)


def _fuzz(served: Served, route: str, base: dict[str, Any], path: tuple[Any, ...], value: Any,
          anthropic: bool = False) -> None:
    body = _replaced(base, path, value)
    if body is not None:
        _post_hostile(served, route, body, anthropic)


_COUNT_BODY = {key: value for key, value in MESSAGES_BODY.items() if key not in ("max_tokens", "temperature")}
ROUTES = {
    "chat": ("/v1/chat/completions", CHAT_BODY, CHAT_PATHS, HOSTILE),
    "chat_schemas": ("/v1/chat/completions", TOOLS_BODY, SCHEMA_PATHS, SCHEMA_VALUES),
    "completions": ("/v1/completions", COMPLETION_BODY, COMPLETION_PATHS, HOSTILE),
    "messages": ("/v1/messages", MESSAGES_BODY, MESSAGES_PATHS, HOSTILE),
    "count_tokens": ("/v1/messages/count_tokens", _COUNT_BODY, COUNT_PATHS, HOSTILE),
}
"""Each fuzzed body: its route, the body, the places mutated and the values put there (a tool's
parameters and a response format's schema, which the server validates with the grammar backend's
own parser before the engine compiles them, get schema keywords)."""


@pytest.mark.parametrize("name", ROUTES)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_hostile_field_never_fails_a_route(served: Served, name: str, data: st.DataObject) -> None:
    route, base, paths, values = ROUTES[name]
    _fuzz(served, route, base, data.draw(st.sampled_from(paths), label="path"), data.draw(values, label="value"),
          anthropic=route.startswith("/v1/messages"))


@pytest.mark.parametrize("route, base, anthropic", [("/v1/chat/completions", CHAT_BODY, False),
                                                    ("/v1/completions", COMPLETION_BODY, False),
                                                    ("/v1/messages", MESSAGES_BODY, True)])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "\ud800", 10**40, [], {}])
def test_the_outcasts_of_strict_json_on_each_field_of_a_stream(served: Served, route: str, base: dict[str, Any],
                                                              anthropic: bool, value: Any) -> None:
    """Streams too: each sampling field of a streamed request set to a value strict JSON or the
    field's type refuses; then the server still answers a plain request."""
    for field in ("temperature", "top_p", "max_tokens", "stop", "seed"):
        _fuzz(served, route, {**base, "stream": True}, (field,), value, anthropic)
    plain = httpx.post(served.url + route, json=base, timeout=120)
    assert plain.status_code == 200, plain.text[:2000]


@pytest.mark.parametrize("route, base", [("/v1/chat/completions", CHAT_BODY), ("/v1/completions", COMPLETION_BODY),
                                         ("/v1/messages", MESSAGES_BODY)])
def test_the_bodies_fuzzed_are_served_as_they_are(served: Served, route: str, base: dict[str, Any]) -> None:
    """Each mutation starts from a body the server serves, so a refusal is the mutation's."""
    answer = httpx.post(served.url + route, json=base, timeout=120)
    assert answer.status_code == 200, answer.text[:2000]


def test_the_schemas_fuzzed_pass_the_grammar_check_as_they_are(served: Served) -> None:
    """The tools body passes the API server's grammar validation and is refused only by the
    reference engine behind this server (it has no grammar backend), the last check before the
    engine: so a schema the fuzz breaks is refused by the validation, or reaches that check."""
    answer = httpx.post(served.url + "/v1/chat/completions", json=TOOLS_BODY, timeout=120)
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "structured_outputs", answer.text[:2000]
    assert "reference engine (mmfront worker) has no grammar backend" in answer.json()["error"]["message"]
