"""Tools and reasoning in chat requests, without an engine: the request fields and vLLM's 400s
for them, the server's parsers as flags configure them, what the template gets, and the
message a choice's text becomes, whole and streamed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from mmfront.errors import ConfigError, ValidationError
from mmfront.serve import protocol, request_decoding, sampling
from mmfront.serve.chat_parsing import ChatParsing, RequestParsing
from mmfront.serve.protocol import ChatCompletionRequest
from mmfront.serve.settings import ServeSettings
from mmfront.serve.tool_parsers import TOOL_PARSERS

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}},
         {"type": "function", "function": {"name": "get_time", "strict": False}}]
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
AUTO = (("enable_auto_tool_choice", True), ("tool_call_parser", "hermes"))
PYTHONIC = (("enable_auto_tool_choice", True), ("tool_call_parser", "pythonic"))
R1 = ("reasoning_parser", "deepseek_r1")


class Tokenizer:
    """What the parsing reads of a tokenizer: marker ids, and the vocabulary."""

    unk_token_id = 3

    def convert_tokens_to_ids(self, token: str) -> int:
        return {"<think>": 10, "</think>": 11}.get(token, 3)

    def get_vocab(self) -> dict[str, int]:
        return {"[TOOL_CALLS]": 5, "[ARGS]": 6}


def request(**fields: Any) -> ChatCompletionRequest:
    body = {"messages": [{"role": "user", "content": "hi"}], **fields}
    return request_decoding.decode_request(json.dumps(body).encode(), ChatCompletionRequest)


def parsing(*flags: tuple[str, Any], **fields: Any) -> RequestParsing:
    settings = ServeSettings(Path("m"), **dict(flags))
    return ChatParsing(settings, Tokenizer()).for_request(request(**fields))


def test_tool_choice_defaults_as_vllms() -> None:
    assert request(tools=TOOLS).tool_choice == "auto"
    assert request().tool_choice == "none"
    assert request(tools=TOOLS, tool_choice=None).tool_choice is None


@pytest.mark.parametrize(("fields", "param", "message"), [
    ({"tools": []}, "tools", "`tools` must not be an empty array."),
    ({"tool_choice": "auto"}, "tool_choice", "When using `tool_choice`, `tools` must be set."),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "Invalid value for `tool_choice`: sometimes!"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": "f"}}, "tool_choice.function",
     "Invalid value for `function`: `f` in `tool_choice`!"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {}}}, "tool_choice.function.name",
     "Expected field `name` in `function` in `tool_choice`!"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice",
     "The tool specified in `tool_choice` does not match any of the specified `tools`"),
])
def test_bad_tool_fields_answer_vllms_400(fields: dict[str, Any], param: str, message: str) -> None:
    with pytest.raises(ValidationError) as raised:
        request(**fields)
    assert raised.value.parameter == param and str(raised.value).startswith(message)


def test_the_template_gets_the_tools_as_vllm_dumps_them() -> None:
    assert protocol.template_tools(request(tools=TOOLS), exclude_when_none=False) == [
        {"type": "function", "function": {"name": "get_weather", "description": None, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}}}},
        {"type": "function", "function": {"name": "get_time", "description": None, "parameters": None,
                                          "strict": False}}]
    assert protocol.template_tools(request(tools=TOOLS, tool_choice="none"), exclude_when_none=True) is None


def test_a_tool_choice_the_server_cannot_honour_is_refused() -> None:
    with pytest.raises(ValidationError, match='"auto" tool choice requires --enable-auto-tool-choice'):
        parsing(tools=TOOLS)
    with pytest.raises(ValidationError, match='tool_choice="required" requires --tool-call-parser'):
        parsing(tools=TOOLS, tool_choice="required")
    with pytest.raises(ValidationError, match='tool_choice=function "get_time" requires --tool-call-parser'):
        parsing(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}})
    assert not parsing(tools=TOOLS, tool_choice="none").active


def test_flags_as_vllm_checks_them() -> None:
    with pytest.raises(ConfigError, match="--enable-auto-tool-choice requires --tool-call-parser"):
        ServeSettings(Path("m"), enable_auto_tool_choice=True)
    with pytest.raises(ConfigError, match="invalid tool call parser: nope"):
        ChatParsing(ServeSettings(Path("m"), enable_auto_tool_choice=True, tool_call_parser="nope"), Tokenizer())
    with pytest.raises(ConfigError, match="invalid reasoning parser: nope"):
        ChatParsing(ServeSettings(Path("m"), reasoning_parser="nope"), Tokenizer())
    # without --enable-auto-tool-choice vLLM builds no tool parser
    assert ChatParsing(ServeSettings(Path("m"), tool_call_parser="hermes"), Tokenizer()).tool_parser is None


def test_a_plugin_registers_a_parser(tmp_path: Path) -> None:
    plugin = tmp_path / "plugin.py"
    plugin.write_text("from mmfront.serve.tool_parsers import TOOL_PARSERS\n"
                      "from mmfront.serve.tool_parsers.hermes import HermesToolParser\n"
                      "TOOL_PARSERS['my_hermes'] = HermesToolParser\n")
    try:
        server = ChatParsing(ServeSettings(Path("m"), enable_auto_tool_choice=True, tool_call_parser="my_hermes",
                                           tool_parser_plugin=str(plugin)), Tokenizer())
        assert server.tool_parser == "my_hermes"
    finally:
        TOOL_PARSERS.pop("my_hermes", None)
    broken = tmp_path / "vllm_plugin.py"
    broken.write_text("import vllm_is_not_here\n")
    with pytest.raises(ConfigError, match="failed to load"):
        ChatParsing(ServeSettings(Path("m"), tool_parser_plugin=str(broken)), Tokenizer())


def test_auto_reads_reasoning_then_calls() -> None:
    p = parsing(*AUTO, R1, tools=TOOLS)
    message = p.whole(f"<think>Paris.</think>Checking.{CALL}")
    assert (message.reasoning, message.content) == ("Paris.", "Checking.")
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    assert p.finish_reason("stop", True) == "tool_calls" and p.finish_reason("length", True) == "length"


def test_none_leaves_the_calls_in_the_content_and_null_drops_them() -> None:
    message = parsing(*AUTO, tools=TOOLS, tool_choice="none").whole(CALL)
    assert (message.content, message.tool_calls) == (CALL, [])
    # vLLM reads a null tool_choice as "auto", then keeps the calls only for "auto": both are gone
    message = parsing(*AUTO, tools=TOOLS, tool_choice=None).whole(f"Hi.{CALL}")
    assert (message.content, message.tool_calls) == ("Hi.", [])


def test_include_reasoning_false_drops_it_and_parallel_false_keeps_one_call() -> None:
    message = parsing(*AUTO, R1, tools=TOOLS, include_reasoning=False).whole(f"x</think>{CALL}{CALL}")
    assert message.reasoning is None and len(message.tool_calls) == 2
    single = parsing(*PYTHONIC, tools=TOOLS, parallel_tool_calls=False)
    assert [c.name for c in single.whole("[get_time(), get_weather(city='x')]").tool_calls] == ["get_time"]


def structural_tag(p: RequestParsing, **fields: Any) -> Any:
    params = p.adjust(sampling.sampling_params(request(**fields), None))
    constraint = params.structured_outputs
    return None if constraint is None else json.loads(constraint.structural_tag or "null")


def hermes_tags(schemas: dict[str, Any]) -> list[dict[str, Any]]:
    """vLLM's hermes tags: each tool twice (with and without the newlines inside the tags)."""
    return [{"type": "tag", "begin": f'{begin}{{"name": "{name}", "arguments": ', "end": end, "content": {
        "type": "json_schema", "json_schema": schema, "style": "json", "any_order": False, "max_whitespace_cnt": None,
        "excludes": []}} for name, schema in schemas.items()
        for begin, end in (("<tool_call>\n", "}\n</tool_call>"), ("<tool_call>", "}</tool_call>"))]


def test_required_sends_vllms_hermes_structural_tag_and_reads_calls_as_auto() -> None:
    p = parsing(*AUTO, tools=TOOLS, tool_choice="required")
    tag = structural_tag(p)
    assert tag == {"type": "structural_tag", "format": {
        "type": "tags_with_separator", "tags": hermes_tags({"get_weather": True, "get_time": True}),
        "separator": "", "at_least_one": True, "stop_after_first": False}}
    message = p.whole(CALL + CALL)
    assert [c.name for c in message.tool_calls] == ["get_weather", "get_weather"] and message.content == ""


def test_a_named_tool_sends_one_call_of_it() -> None:
    p = parsing(*AUTO, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    tag = structural_tag(p)["format"]
    assert (tag["type"], tag["stop_after_first"], tag["tags"]) == (
        "tags_with_separator", True, hermes_tags({"get_weather": True}))
    assert [c.name for c in p.whole(CALL).tool_calls] == ["get_weather"]


def test_auto_gets_a_tag_only_for_strict_tools_one_call_or_the_strict_level() -> None:
    weather = TOOLS[0]["function"]["parameters"]
    assert structural_tag(parsing(*AUTO, tools=TOOLS)) is None
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}, TOOLS[1]]
    tag = structural_tag(parsing(*AUTO, tools=strict))["format"]
    assert tag == {"type": "triggered_tags", "triggers": ["<tool_call>"], "tags": hermes_tags(
        {"get_weather": weather, "get_time": True}), "at_least_one": False, "stop_after_first": False, "excludes": []}
    single = structural_tag(parsing(*AUTO, tools=TOOLS, parallel_tool_calls=False))["format"]
    assert (single["type"], single["stop_after_first"]) == ("triggered_tags", True)
    assert single["tags"] == hermes_tags({"get_weather": True, "get_time": True})
    level = ("tool_strict_level", "function")
    assert structural_tag(parsing(*AUTO, level, tools=TOOLS))["format"]["tags"] == single["tags"]
    level = ("tool_strict_level", "parameter")
    assert structural_tag(parsing(*AUTO, level, tools=TOOLS))["format"]["tags"] == hermes_tags(
        {"get_weather": weather, "get_time": True})  # get_time has no parameters: any JSON


def test_auto_with_a_response_format_allows_the_calls_or_the_format() -> None:
    strict = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "strict": True}}]
    p = parsing(*AUTO, tools=strict)
    tag = structural_tag(p, response_format={"type": "json_object"})["format"]
    assert tag["type"] == "or" and tag["elements"][1] == {
        "type": "json_schema", "json_schema": {"type": "object"}, "style": "json", "any_order": False,
        "max_whitespace_cnt": None, "excludes": []}
    assert tag["elements"][0]["type"] == "tags_with_separator"  # "required": the format or calls, no free text


def test_without_strict_tool_calling_required_falls_back_to_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_ENFORCE_STRICT_TOOL_CALLING", "0")
    p = parsing(*AUTO, tools=TOOLS, tool_choice="required")
    params = p.adjust(sampling.sampling_params(request(), None))
    assert params.structured_outputs is not None and params.structured_outputs.json is not None
    assert params.structured_outputs.structural_tag is None


@pytest.mark.parametrize(("parser", "model"), [("llama3_json", "llama"), ("deepseek_v3", "deepseek_r1"),
                                               ("qwen3_xml", "qwen_3_coder"), ("qwen3_coder", "qwen_3_coder")])
def test_each_format_sends_xgrammars_tag_for_it(parser: str, model: str) -> None:
    import xgrammar

    flags = (("enable_auto_tool_choice", True), ("tool_call_parser", parser))
    tag = structural_tag(parsing(*flags, tools=TOOLS, tool_choice="required"))
    tools = [TOOLS[0], {"type": "function", "function": {"name": "get_time", "strict": False}}]
    assert tag == xgrammar.get_model_structural_tag(model, tools=[{**t, "function": {**t["function"], "strict": bool(
        t["function"].get("strict"))}} for t in tools], tool_choice="required", reasoning=False).model_dump()


def test_the_reasoning_effort_map_rewrites_the_effort_for_the_template() -> None:
    effort_map = {"medium": "low", "xhigh": "max"}
    assert protocol.template_kwargs(request(reasoning_effort="medium"), effort_map) == {
        "reasoning_effort": "low", "enable_thinking": True}
    assert protocol.template_kwargs(request(reasoning_effort="high"), effort_map) == {
        "reasoning_effort": "high", "enable_thinking": True}
    assert parsing(("reasoning_effort_map", {"none": "low"}), reasoning_effort="none").reasoning_kwargs == {
        "reasoning_effort": "low", "enable_thinking": True}
    with pytest.raises(ConfigError, match=r"unknown efforts \['huge'\]"):
        ServeSettings(Path("m"), reasoning_effort_map={"huge": "max"})
    with pytest.raises(ConfigError, match="mapping reasoning efforts to strings"):
        ServeSettings(Path("m"), reasoning_effort_map={"low": 1})


def test_required_constrains_to_vllms_json_schema_and_reads_it() -> None:
    p = parsing(*PYTHONIC, tools=TOOLS, tool_choice="required")
    params = p.adjust(sampling.sampling_params(request(), None))
    assert params.structured_outputs is not None and params.structured_outputs.json == {
        "type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
            {"properties": {"name": {"type": "string", "enum": ["get_weather"]},
                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
             "required": ["name", "parameters"]},
            {"properties": {"name": {"type": "string", "enum": ["get_time"]},
                            "parameters": {"type": "object", "properties": {}}},
             "required": ["name", "parameters"]}]}}
    message = p.whole('[{"name": "get_time", "parameters": {}}, {"name": "get_weather", "parameters": {"city": "x"}}]')
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_time", "{}"), ("get_weather", '{"city": "x"}')]
    assert message.content == "" and p.finish_reason("stop", True) == "tool_calls"


def test_a_named_tool_constrains_to_its_parameters() -> None:
    p = parsing(*PYTHONIC, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    params = p.adjust(sampling.sampling_params(request(), None))
    assert params.structured_outputs is not None
    assert params.structured_outputs.json == {"type": "object", "properties": {"city": {"type": "string"}}}
    message = p.whole('{"city": "Rome"}')
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Rome"}')]
    assert p.finish_reason("stop", True) == "stop"  # OpenAI reports stop for a forced function


MISTRAL = (("enable_auto_tool_choice", True), ("tool_call_parser", "mistral"))


def test_mistral_required_and_named_send_vllms_json_array_and_read_it_as_content_with_args() -> None:
    """vLLM with a Hugging Face tokenizer: an array of ``{"name", "arguments"}`` (one item for a
    named tool, ``parallel_tool_calls`` not counted), which a vocabulary with ``[ARGS]`` reads
    as content."""
    weather = {"type": "object", "properties": {"name": {"type": "string", "enum": ["get_weather"]},
                                                "arguments": {"type": "object", "properties": {"city": {"type": "string"}}}},
               "required": ["name", "arguments"]}
    time = {"type": "object", "properties": {"name": {"type": "string", "enum": ["get_time"]},
                                             "arguments": {"type": "object"}}, "required": ["name", "arguments"]}
    required = parsing(*MISTRAL, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    params = required.adjust(sampling.sampling_params(request(), None))
    assert params.structured_outputs is not None and params.structured_outputs.json == {
        "type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [weather, time]}}
    named = parsing(*MISTRAL, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    params = named.adjust(sampling.sampling_params(request(response_format={"type": "json_object"}), None))
    assert params.structured_outputs is not None and params.structured_outputs.json == {
        "type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "object", "anyOf": [weather]}}
    regex = parsing(*MISTRAL, tools=TOOLS, tool_choice="required", structured_outputs={"regex": "[a-z]+"})
    params = regex.adjust(sampling.sampling_params(request(structured_outputs={"regex": "[a-z]+"}), None))
    assert params.structured_outputs is not None and params.structured_outputs.regex == "[a-z]+"
    array = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    message = required.whole(array)
    assert message.tool_calls == [] and message.content == array
    stream = required.stream([])
    assert stream.feed(array).content == array and not stream.finish()


def test_mistral_streams_the_name_with_the_first_argument_then_holds_the_closing_brace() -> None:
    stream = parsing(*MISTRAL, tools=TOOLS).stream([])
    assert stream.feed("Sure.[TOOL_CALLS]get_weather[ARGS]").content == "Sure."
    first = stream.feed('{"city"').tool_calls
    assert [(c.index, c.type, c.name, c.arguments) for c in first] == [(0, "function", "get_weather", '{"city"')]
    assert first[0].id is not None and len(first[0].id) == 9
    assert [c.arguments for c in stream.feed(': "Paris"}').tool_calls] == [': "Paris"']
    last = stream.feed("").then(stream.finish())
    assert [(c.index, c.id, c.arguments) for c in last.tool_calls] == [(0, None, "}")]


def test_hermes_keeps_special_tokens_for_its_markers() -> None:
    assert not parsing(*AUTO, tools=TOOLS).adjust(sampling.sampling_params(request(), None)).skip_special_tokens
    kept = parsing(*AUTO, tools=TOOLS, tool_choice="none").adjust(sampling.sampling_params(request(), None))
    assert kept.skip_special_tokens


def stream(p: RequestParsing, pieces: list[str], prompt: Sequence[int] = ()) -> dict[str, Any]:
    s = p.stream(list(prompt))
    out: dict[str, Any] = {"reasoning": "", "content": "", "calls": []}
    steps = [s.feed(piece) for piece in pieces]
    for step in [*steps, s.finish()]:
        out["reasoning"] += step.reasoning or ""
        out["content"] += step.content or ""
        for c in step.tool_calls:
            if c.name is not None:
                out["calls"].append((c.index, c.name, c.arguments or ""))
            else:
                index, name, arguments = out["calls"][-1]
                out["calls"][-1] = (index, name, arguments + (c.arguments or ""))
    return out


def test_a_stream_reads_reasoning_content_and_calls() -> None:
    p = parsing(*AUTO, R1, tools=TOOLS)
    text = f"<think>Paris.</think>Checking.{CALL}"
    assert stream(p, [text[i:i + 4] for i in range(0, len(text), 4)]) == {
        "reasoning": "Paris.", "content": "Checking.", "calls": [(0, "get_weather", '{"city": "Paris"}')]}


def test_a_stream_reads_no_reasoning_when_the_prompt_closed_it() -> None:
    p = parsing(*AUTO, R1, tools=TOOLS)
    assert stream(p, ["x</think>y"], prompt=[10, 11])["content"] == "x</think>y"
    assert stream(p, ["x</think>y"], prompt=[11, 10])["reasoning"] == "x"


def steps(p: RequestParsing, pieces: list[str]) -> list[list[tuple[int, bool, str | None, str | None]]]:
    s = p.stream([])
    deltas = [s.feed(piece) for piece in pieces[:-1]]
    deltas.append(s.feed(pieces[-1]).then(s.finish()))
    return [[(c.index, c.id is not None, c.name, c.arguments) for c in d.tool_calls] for d in deltas]


def test_a_stream_of_required_calls_sends_each_call_as_its_parameters_are_written() -> None:
    p = parsing(*PYTHONIC, tools=TOOLS, tool_choice="required")
    assert steps(p, ['[{"name": "get_time", ', '"parameters": {', '"x": 1}', '}, {"name": "get_weather", "par',
                     'ameters": {}}]']) == [
        [], [(0, True, "get_time", "{")], [(0, False, None, '"x": 1}')], [],
        [(1, True, "get_weather", "{}")]]
    only_first = parsing(*PYTHONIC, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert steps(only_first, ['[{"name": "a", "parameters": 1}, {"name": "b", "parameters": 2}]']) == [
        [(0, True, "a", "1")]]
    assert steps(p, ["not JSON"]) == [[]]  # no call, and no content either (vLLM's stream)


def test_a_stream_of_a_named_call_sends_every_steps_text_from_the_end_of_reasoning() -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    p = parsing(*PYTHONIC, tools=TOOLS, tool_choice=named)
    assert steps(p, ['{"city"', "", ': "Paris"}']) == [
        [(0, True, "get_weather", '{"city"')], [(0, False, None, "")], [(0, False, None, ': "Paris"}')]]
    thinking = parsing(*PYTHONIC, R1, tools=TOOLS, tool_choice=named)
    assert steps(thinking, ["<think>hm", "</think>{", "}"]) == [
        [], [(0, True, "get_weather", "{")], [(0, False, None, "}")]]


def test_an_empty_delta_of_the_tool_parser_is_kept_unless_reasoning_is_left_out() -> None:
    deepseek = (("enable_auto_tool_choice", True), ("tool_call_parser", "deepseek_v3"))
    for include, content in ((True, ""), (False, None)):
        s = parsing(*deepseek, tools=TOOLS, include_reasoning=include).stream([])
        step = s.feed("<｜tool▁calls▁begin｜>")
        assert step.content == content and step.sends_chunk is include
        assert s.feed("<｜tool▁calls▁end｜>").then(s.finish()).content == content


def test_a_request_without_parsers_is_left_as_it_is() -> None:
    p = parsing()
    assert not p.active and p.whole("<think>x</think>").content == "<think>x</think>"
    plain = sampling.sampling_params(request(), None)
    assert msgspec.structs.asdict(p.adjust(plain)) == msgspec.structs.asdict(plain)


def test_reasoning_tokens_are_counted_between_the_markers() -> None:
    assert parsing(R1).reasoning_tokens([10, 5, 6, 11, 7]) == 2
    assert parsing(R1).reasoning_tokens([5, 11, 7]) == 0  # vLLM counts from a start marker only
    assert parsing().reasoning_tokens([10, 5, 11]) is None


def test_reasoning_effort_reaches_the_template_and_the_parser_as_vllms() -> None:
    assert protocol.template_kwargs(request(reasoning_effort="high")) == {"reasoning_effort": "high",
                                                                           "enable_thinking": True}
    assert protocol.template_kwargs(request(reasoning_effort="none", chat_template_kwargs={"enable_thinking": True,
                                                                                           "x": 1})) == {
        "enable_thinking": True, "x": 1, "reasoning_effort": "none"}
    assert protocol.template_kwargs(request(chat_template_kwargs={"x": 1})) == {"x": 1}
    off = parsing(("reasoning_parser", "qwen3"), reasoning_effort="none")
    assert off.whole("plain answer").content == "plain answer"
    with pytest.raises(ValidationError):
        request(reasoning_effort="extreme")
