"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` (the Anthropic Messages API) through
``mmfront serve`` and ``vllm serve`` side by side, each in front of a stock vLLM 0.33 engine core
(the harness of test_vllm_serve_parity.py): the same body gets the same answer, whole or streamed.

Two pairs: the plain one (tiny Gemma 3, the stub executor) for text, images, system prompts, stop
sequences, thinking options, history, token counts and the errors; and the tools one of
test_tools_vllm_serve.py (a scripting stub executor, ``--tool-call-parser hermes``,
``--reasoning-parser deepseek_r1``) for thinking blocks, ``tool_use`` blocks and ``stop_reason``
``tool_use``, tool choices, tool changes (``tool_addition``/``tool_removal``) and a history with
thinking, tool uses and tool results echoed back.

Compared exactly, ids and thinking signatures masked; a stream by its events, consecutive deltas
of one block joined (where a server cuts the text depends on when the engine's outputs reach it).
An error is compared by status and, for Anthropic's error shape, its type and message; a body
vLLM's request model refuses is vLLM's OpenAI error, compared by type and ``param``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import test_tools_vllm_serve as tools_pair
from test_vllm_serve_parity import (
    MODEL,
    PEER,
    PEER_DIR,
    SERVED,
    Answer,
    Pair,
    both,
    explain,
    masked,
    running_pair,
)

from mmfront.testing.media import image_data_url, make_image
from mmfront.testing.peer import SKIP_REASON

pytestmark = [pytest.mark.slow, pytest.mark.vllm_side_by_side,
              pytest.mark.skipif(PEER is None or MODEL is None or not PEER_DIR.is_dir(), reason=SKIP_REASON)]

PNG = image_data_url(make_image(40, 32, seed=3)).split(",", 1)[1]
HI = [{"role": "user", "content": "Hi there"}]
IMAGE = [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                   "data": PNG}},
                                      {"type": "text", "text": "What?"}]}]
"""With one image the stub generates 1010, 1011, ...: 'd,', ' no', 'linen', 'unt', ..."""


def message(messages: list[dict[str, Any]] = HI, **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 3, "messages": messages, **fields}


def events(text: str) -> list[tuple[str, Any]]:
    """A stream's events, ids and signatures masked, consecutive deltas of one kind in a block joined."""
    out: list[tuple[str, Any]] = []
    for event in (e for e in text.split("\n\n") if e.strip()):
        name_line, data_line = event.split("\n")
        name, data = name_line.removeprefix("event: "), masked(json.loads(data_line.removeprefix("data: ")))
        assert data["type"] == name, event
        delta = data.get("delta", {})
        if delta.get("type") == "signature_delta":
            delta["signature"] = "*"
        key = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}.get(
            delta.get("type"))
        previous = out[-1][1] if out else {}
        if key and previous.get("index") == data["index"] and previous.get("delta", {}).get("type") == delta["type"]:
            previous["delta"][key] += delta[key]
            continue
        out.append((name, data))
    return out


def whole(answer: Answer) -> Any:
    body = masked(answer.json())
    for block in body.get("content", []) if isinstance(body, dict) else []:
        if block.get("type") == "thinking":
            block["signature"] = "*"
    return body


def assert_same(pair: Pair, path: str, body: dict[str, Any]) -> Answer:
    vllm, mmfront = both(pair, "POST", path, body)
    assert vllm.status == mmfront.status, explain(pair, vllm, mmfront)
    assert vllm.content_type == mmfront.content_type, explain(pair, vllm, mmfront)
    if body.get("stream") and vllm.status == 200:
        assert events(mmfront.text) == events(vllm.text), explain(pair, vllm, mmfront)
    elif vllm.json().get("type") == "error" or vllm.status == 200:
        assert whole(mmfront) == whole(vllm), explain(pair, vllm, mmfront)
    else:  # vLLM's request model refused the body: its OpenAI error
        want, got = vllm.json()["error"], mmfront.json()["error"]
        assert (got["type"], got["param"]) == (want["type"], want["param"]), explain(pair, vllm, mmfront)
    return vllm


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    with running_pair(tmp_path_factory.mktemp("anthropic")) as servers:
        yield servers


ANSWERED: dict[str, dict[str, Any]] = {
    "text": message(),
    "system_string": message(system="Be brief."),
    "system_blocks_without_the_billing_header": message(system=[
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=5f3a"}, {"type": "text", "text": "A"},
        {"type": "text", "text": "B"}]),
    "image": message(IMAGE),
    "stop_sequence": message(IMAGE, max_tokens=6, stop_sequences=["unt"]),
    "sampling_and_metadata": message(temperature=0.5, top_p=0.5, top_k=2, metadata={"user_id": "u"}),
    "thinking_disabled": message(thinking={"type": "disabled"}),
    "thinking_adaptive": message(thinking={"type": "adaptive"}),
    "effort": message(output_config={"effort": "low"}),
    "tool_choice_none_without_a_parser": message(tool_choice={"type": "none"},
                                                 tools=[{"name": "f", "input_schema": {}}]),
    "history": message([*HI, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "hmm", "signature": "x"}, {"type": "text", "text": "Yes"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "r1"}, {"type": "text", "text": "r2"}]}, {"type": "text", "text": "ok"}]}]),
    "inline_system_message": message([*HI, {"role": "system", "content": "S2"}, {"role": "user", "content": "again"}]),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", ANSWERED)
def test_a_message_gets_the_same_answer(pair: Pair, case: str, stream: bool) -> None:
    vllm = assert_same(pair, "/v1/messages", {**ANSWERED[case], "stream": stream})
    assert vllm.status == 200


REFUSED: dict[str, dict[str, Any]] = {
    "no_max_tokens": {"model": SERVED, "messages": HI},
    "max_tokens_zero": message(max_tokens=0),
    "empty_model": message(model=""),
    "unknown_model": message(model="nope"),
    "tool_role": message([{"role": "tool", "content": "x"}]),
    "thinking_budget_without_a_reasoning_parser": message(max_tokens=3000,
                                                          thinking={"type": "enabled", "budget_tokens": 2000}),
    "thinking_budget_not_below_max_tokens": message(max_tokens=1500,
                                                    thinking={"type": "enabled", "budget_tokens": 2000}),
    "tools_without_auto_tool_choice": message(tools=[{"name": "f", "input_schema": {"type": "object"}}]),
    "temperature_out_of_range": message(temperature=5),
    "no_messages": message([]),
    "only_an_empty_user_message": message([{"role": "user", "content": []}]),
    "too_many_stop_sequences": message(stop_sequences=["a", "b", "c", "d", "e"]),
    "tool_removal_of_an_undeclared_tool": message([
        {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "zzz"}}]},
        *HI], tools=[{"name": "f", "input_schema": {}}]),
    "tool_change_in_a_user_message": message([{"role": "user", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "f"}}]}]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_message_refused_is_refused_alike(pair: Pair, case: str) -> None:
    vllm = assert_same(pair, "/v1/messages", REFUSED[case])
    assert 400 <= vllm.status < 500


@pytest.mark.parametrize(("case", "body", "tokens"), [
    ("text", {"model": SERVED, "messages": HI}, 13),
    ("image", {"model": SERVED, "messages": IMAGE}, 273),
    ("system", {"model": SERVED, "system": "Be brief.", "messages": HI}, 24),
    ("thinking_budget_without_a_reasoning_parser", {"model": SERVED, "messages": HI,
                                                    "thinking": {"type": "enabled", "budget_tokens": 2000}}, 13),
    ("unknown_model", {"model": "nope", "messages": HI}, None),
])
def test_count_tokens_counts_as_vllm(pair: Pair, case: str, body: dict[str, Any], tokens: int | None) -> None:
    vllm = assert_same(pair, "/v1/messages/count_tokens", body)
    if tokens is None:
        assert vllm.status == 404 and vllm.json()["error"]["type"] == "not_found_error"
    else:
        assert vllm.json() == {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}


def test_a_stream_names_its_events_as_vllm(pair: Pair) -> None:
    vllm = assert_same(pair, "/v1/messages", message(IMAGE, max_tokens=6, stop_sequences=["unt"], stream=True))
    assert [name for name, _ in events(vllm.text)] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    assert events(vllm.text)[4][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "unt"}


# --- tools and reasoning ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    if PEER is None or MODEL is None or not PEER_DIR.is_dir():
        pytest.skip(SKIP_REASON)
    with tools_pair.scripted_pair(tmp_path_factory.mktemp("anthropic-tools")) as servers:
        yield servers


CALL = tools_pair.CALL
TOOLS = [{"name": "get_weather", "description": "The weather in a city.", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"name": "get_time", "input_schema": {}}]


def scripted(script: str, **fields: Any) -> dict[str, Any]:
    return {"model": SERVED, "max_tokens": 200, "messages": [{"role": "user", "content": f"<<<{script}>>>"}],
            "tools": TOOLS, **fields}


WITH_TOOLS: dict[str, dict[str, Any]] = {
    "a_call_after_text": scripted(f"</think>Let me check.{CALL}"),
    "thinking_then_two_calls": scripted(f"<think>Paris, then.</think>{CALL}{CALL}"),
    "no_call": scripted("</think>No call needed."),
    "thinking_then_text": scripted("<think>hmm</think>Answer."),
    "a_call_that_is_not_json": scripted("</think>" + CALL.replace("}}<", "}<")),
    "tool_choice_none": scripted(f"</think>{CALL}", tool_choice={"type": "none"}),
    "a_stop_sequence_inside_a_call": scripted(f"</think>{CALL}", stop_sequences=["Paris"]),
    "text_after_a_call": scripted(f"</think>{CALL}trailing"),
    "history_echoed": {"model": SERVED, "max_tokens": 400, "tools": TOOLS, "system": [
        {"type": "text", "text": "x-anthropic-billing-header: abc"}, {"type": "text", "text": "Sys."}], "messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call it", "signature": "s"}, {"type": "redacted_thinking", "data": "xx"},
            {"type": "text", "text": "ok"}, {"type": "tool_use", "id": "tu1", "name": "get_weather",
                                             "input": {"city": "Paris"}},
            {"type": "tool_result", "tool_use_id": "zz", "content": [{"type": "text", "text": "inline"}]}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu1", "content": [
                {"type": "text", "text": "sunny"}, {"type": "text", "text": "20 C"},
                {"type": "tool_reference", "tool_name": "get_time"}]},
            {"type": "text", "text": "<<<ECHO>>>"}]},
        {"role": "system", "content": "Inline sys."}, {"role": "user", "content": "<<<ECHO>>>"}]},
    "tool_changes_echoed": {"model": SERVED, "max_tokens": 400, "tools": [
        *TOOLS, {"name": "late", "input_schema": {}, "defer_loading": True}], "messages": [
        {"role": "system", "content": [
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "late"}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_time"}},
            {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": {
                "name": "new", "input_schema": {"type": "object"}}}}]},
        {"role": "user", "content": "<<<ECHO>>>"}]},
}


CHUNKING_DEPENDENT = {"a_call_that_is_not_json"}
"""Streamed, the arguments of a call that is not JSON depend on how the engine's tokens were
grouped into deltas, in vLLM's hermes parser as in mmfront's: token by token both send
``{"city": "Paris"}``; where the server was behind and merged several outputs into one delta
(vLLM's output collector, mmfront's :class:`~mmfront.serve.generation.Generation`), vLLM was seen
sending ``{"city": "Paris"`` in one piece. Load decides the grouping on each side."""


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", WITH_TOOLS)
def test_tools_and_thinking_answer_as_vllm(tools: Pair, case: str, stream: bool) -> None:
    body = {**WITH_TOOLS[case], "stream": stream}
    if not (stream and case in CHUNKING_DEPENDENT):
        assert assert_same(tools, "/v1/messages", body).status == 200
        return
    vllm, mmfront = both(tools, "POST", "/v1/messages", body)
    assert vllm.status == mmfront.status == 200, explain(tools, vllm, mmfront)
    got, want = events(mmfront.text), events(vllm.text)
    arguments = [data["delta"].pop("partial_json") for answer in (got, want) for _, data in answer
                 if data.get("delta", {}).get("type") == "input_json_delta"]
    assert got == want, explain(tools, vllm, mmfront)  # every event but the call's arguments
    assert all(text.startswith('{"city": "Paris"') for text in arguments) and len(arguments) == 2, arguments


def test_the_blocks_and_stop_reason_of_a_thinking_model_calling_tools(tools: Pair) -> None:
    vllm = assert_same(tools, "/v1/messages", WITH_TOOLS["thinking_then_two_calls"])
    body = whole(vllm)
    assert [block["type"] for block in body["content"]] == ["thinking", "tool_use", "tool_use"]
    assert body["content"][1]["input"] == {"city": "Paris"} and body["stop_reason"] == "tool_use"


def test_count_tokens_renders_the_tools_as_vllm(tools: Pair) -> None:
    assert_same(tools, "/v1/messages/count_tokens",
                {"model": SERVED, "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]})


def test_a_request_the_engine_fails_streams_its_opening_before_the_error(tools: Pair) -> None:
    """The stub engine fails a request forced to call a tool (it cannot compile that grammar, in
    either server): both streams open (the chat's role chunk, the message's ``message_start``)
    before the error event, since the failure comes as the engine's first output."""
    chat = {"model": SERVED, "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "<<<x>>>"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "tool_choice": "required"}
    vllm, mmfront = both(tools, "POST", "/v1/chat/completions", chat)
    first = [masked(json.loads(e.removeprefix("data: "))) for e in (vllm.text.split("\n\n")[0],
                                                                     mmfront.text.split("\n\n")[0])]
    assert first[0] == first[1] and first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}, \
        explain(tools, vllm, mmfront)
    for answer in (vllm, mmfront):
        rest = [e for e in answer.text.split("\n\n") if e.strip()][1:]
        assert len(rest) == 2 and json.loads(rest[0].removeprefix("data: "))["error"]["code"] == 500, answer.text
        assert rest[1] == "data: [DONE]"
    vllm, mmfront = both(tools, "POST", "/v1/messages", scripted(f"</think>{CALL}", tool_choice={"type": "any"},
                                                                 stream=True))
    names = [[name for name, _ in events(answer.text)] for answer in (vllm, mmfront)]
    assert names[0] == names[1] == ["message_start", "error"], explain(tools, vllm, mmfront)
    assert events(mmfront.text)[1][1]["error"]["type"] == events(vllm.text)[1][1]["error"]["type"] == "api_error"
