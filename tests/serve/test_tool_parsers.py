"""mmfront's tool-call and reasoning parsers on the model outputs of vLLM's own parser tests
(tests/serve/parser_cases.py), whole and streamed: a stream cut anywhere assembles to what vLLM's
tests expect."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from parser_cases import FORCED_JSON_CASES, REASONING_CASES, STREAMED_PREFIX, STREAMED_TOOLS_DIFFER, TOOL_CASES

from mmfront.serve.reasoning import REASONING_PARSERS, ReasoningStream
from mmfront.serve.tool_parsers import TOOL_PARSERS, ToolCallStream, join_call_deltas, make_tool_parser
from mmfront.serve.tool_parsers.forced_stream import ForcedCallStream


def cut(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


def split(text: str, cuts: list[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if b > a] or [""]


def outside_markers(text: str, cuts: list[int]) -> list[int]:
    """The cuts that leave ``<|python_tag|>`` whole: it is one token, and vLLM's llama3_json stream
    sends the start of a tag cut in two as content (STREAMED_PREFIX parsers hold nothing back)."""
    inside = {i for start in range(len(text)) if text.startswith("<|python_tag|>", start)
              for i in range(start + 1, start + len("<|python_tag|>"))}
    return [c for c in cuts if c not in inside]


def streamed_tools(parser_name: str, text: str, tools: list | None, size: int,
                   chunks: list[str] | None = None) -> tuple[bool, list, str | None]:
    """What a client assembles of the stream, checking vLLM's delta structure: a call's first
    delta has its id, type and name (and, for some formats, the first of its arguments), the
    later ones only fragments of its arguments (vLLM's llama3_json parser sends empty ones too)."""
    stream = ToolCallStream(make_tool_parser(parser_name, tools))
    content: list[str] = []
    calls: dict[int, list[str]] = {}
    for delta in [*(stream.feed(c) for c in (chunks if chunks is not None else cut(text, size))), stream.finish()]:
        if delta.content:
            content.append(delta.content)
        for call in delta.tool_calls:
            if call.index not in calls and call.id is None and parser_name in STREAMED_PREFIX:
                calls[call.index] = [None, call.arguments or ""]  # a call whose name vLLM skipped
            elif call.index not in calls:
                assert call.id is not None and call.type == "function" and call.name, call
                calls[call.index] = [call.name, call.arguments or ""]
            else:
                assert (call.id, call.type, call.name) == (None, None, None) and call.arguments is not None, call
                assert call.arguments or parser_name in STREAMED_PREFIX, call
                calls[call.index][1] += call.arguments
    skipped = [None, ""]  # a call vLLM's llama3_json stream skipped: (no name, no arguments)
    return stream.tools_called, [tuple(calls.get(i, skipped)) for i in range(max(calls, default=-1) + 1)], \
        "".join(content) or None


def as_json(streamed: tuple[bool, list, str | None]) -> tuple[bool, list, str | None]:
    called, calls, content = streamed
    return called, [(n, json_or_text(a)) for n, a in calls], content


def sends_a_prefix(streamed: tuple[bool, list, str | None], expected: tuple[bool, list, str | None]) -> bool:
    """Whether a stream sent the expected content and, of the expected calls, the first ones
    (a name maybe skipped), each with a prefix of its arguments or a whole JSON object
    (STREAMED_PREFIX: vLLM's end completes the arguments its last reading holds, which leaves out
    a string the name's step read unfinished)."""
    called, calls, content = streamed
    _, expected_calls, expected_content = expected
    return (content == expected_content and called == bool(calls) and len(calls) <= len(expected_calls)
            and all(n in (e, None) and (e_args.startswith(a) or isinstance(json_or_text(a), dict))
                    for (n, a), (e, e_args) in zip(calls, expected_calls, strict=False)))


def json_or_text(arguments: str) -> object:
    """Arguments as JSON: vLLM's stream sends them as the model wrote them, its whole answer
    re-serialized."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_a_whole_output_parses_as_vllms_tests_expect(case: str) -> None:
    name, text, tools, expected = TOOL_CASES[case]
    result = make_tool_parser(name, tools).extract(text)
    assert (result.tools_called, [(c.name, c.arguments) for c in result.tool_calls], result.content) == expected


@pytest.mark.parametrize("parser", sorted({name for name, *_ in TOOL_CASES.values()}))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_any_split_into_chunks_assembles_as_the_whole_stream(parser: str, data: st.DataObject) -> None:
    """However the answer is cut into chunks, the stream assembles to what a stream of the whole
    answer in one chunk sends (the whole answer's calls, or vLLM's stream where it differs), or,
    for STREAMED_PREFIX parsers, a prefix of them (test_parsers_vs_vllm.py compares those
    chunkings with vLLM's deltas)."""
    case = data.draw(st.sampled_from(sorted(c for c, (name, *_) in TOOL_CASES.items() if name == parser)))
    name, text, tools, _ = TOOL_CASES[case]
    cuts = data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=40))
    if name in STREAMED_PREFIX:
        streamed = streamed_tools(name, text, tools, 0, split(text, outside_markers(text, cuts)))
        assert sends_a_prefix(streamed, expected_stream(case))
        return
    streamed = streamed_tools(name, text, tools, 0, split(text, cuts))
    assert as_json(streamed) == as_json(streamed_tools(name, text, tools, len(text) + 1))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_forced_json_assembles_the_same_calls_however_it_is_cut(data: st.DataObject) -> None:
    """The JSON of ``required`` and named tools: any chunking sends each call's id and name once
    and fragments that join to its arguments (test_parsers_vs_vllm.py compares the deltas with
    vLLM's)."""
    case = data.draw(st.sampled_from(sorted(FORCED_JSON_CASES)))
    text, choice, calls = FORCED_JSON_CASES[case]
    stream = ForcedCallStream(None if choice == "required" else choice["function"]["name"])
    assembled: list[list[str]] = []
    for chunk in split(text, data.draw(st.lists(st.integers(1, max(len(text) - 1, 1)), max_size=40))):
        for delta in stream.feed(chunk):
            if delta.id is not None:
                assert delta.index == len(assembled) and delta.name is not None
                assembled.append([delta.name, ""])
            assembled[delta.index][1] += delta.arguments or ""
    assert assembled == [list(c) for c in calls]


def test_a_marker_vllms_parser_consumes_is_an_empty_delta() -> None:
    """vLLM's chat server sends a chunk of ``"content": ""`` where its parser answers a step with
    an empty delta: deepseek_v3's section markers, pythonic's step that closes the list."""
    calls = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>"
    stream = ToolCallStream(make_tool_parser("deepseek_v3", None))
    steps = [stream.feed(c) for c in ["Hi", "<｜tool▁calls▁begin｜>", calls, "<｜tool▁calls▁end｜>", ""]]
    assert [s.content for s in steps] == ["Hi", "", None, "", ""]
    pythonic = ToolCallStream(make_tool_parser("pythonic", None))
    steps = [pythonic.feed(c) for c in ["[f(a=", "1)", "]", ""]]
    assert [(s.content, len(s.tool_calls)) for s in steps] == [(None, 0), (None, 1), ("", 0), ("", 0)]
    plain = ToolCallStream(make_tool_parser("pythonic", None))
    assert [plain.feed(c).content for c in ["[]", ""]] == [None, None]  # no call: vLLM answers nothing


def expected_stream(case: str) -> tuple[bool, list, str | None]:
    """What a stream of ``case`` assembles to (or, for STREAMED_PREFIX, sends a prefix of)."""
    _, text, _, (called, calls, content) = TOOL_CASES[case]
    if case in STREAMED_TOOLS_DIFFER:
        return STREAMED_TOOLS_DIFFER[case]
    return called, calls, content if called else text or None


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 1000])
@pytest.mark.parametrize("case", sorted(TOOL_CASES))
def test_a_stream_assembles_to_the_whole_answer(case: str, size: int) -> None:
    name, text, tools, _ = TOOL_CASES[case]
    if name in STREAMED_PREFIX:
        chunks = split(text, outside_markers(text, list(range(size, len(text), size))))
        assert sends_a_prefix(streamed_tools(name, text, tools, 0, chunks), expected_stream(case))
        return
    assert as_json(streamed_tools(name, text, tools, size)) == as_json(expected_stream(case))


def test_content_streams_before_the_call_then_its_name_then_its_arguments() -> None:
    stream = ToolCallStream(make_tool_parser("hermes", None))
    assert stream.feed("Sure, <tool").content == "Sure, "  # "<tool" may open a call: held
    assert stream.feed('_call>{"name": "f').tool_calls == []  # the name may go on
    delta = stream.feed('", "arguments": {"a"')
    assert delta.content is None and [(c.index, c.type, c.name, c.arguments) for c in delta.tool_calls] == [
        (0, "function", "f", None), (0, None, None, '{"a"')]
    assert delta.tool_calls[0].id is not None and delta.tool_calls[0].id.startswith("chatcmpl-tool-")
    assert [(c.index, c.arguments) for c in stream.feed(": 1}").tool_calls] == [(0, ": 1}")]
    assert stream.feed("}</tool_call>").tool_calls == []  # the call's own "}" is not its arguments'
    assert stream.finish().tool_calls == []


def test_a_call_cut_by_max_tokens_has_sent_its_name_and_arguments_so_far() -> None:
    stream = ToolCallStream(make_tool_parser("hermes", None))
    deltas = [stream.feed(piece) for piece in ('<tool_call>{"name": "f", "arguments": ', '{"city": "Pa')]
    assert [(c.name, c.arguments) for d in deltas for c in d.tool_calls] == [("f", None), (None, '{"city": "Pa')]
    assert stream.finish().tool_calls == [] and stream.tools_called


def test_what_the_end_flushes_joins_the_last_tokens_fragment() -> None:
    """vLLM appends what its parser held back to the last token's delta: one fragment."""
    stream = ToolCallStream(make_tool_parser("mistral", None))
    assert [c.arguments for c in stream.feed('[TOOL_CALLS]f[ARGS]{"a"').tool_calls] == ['{"a"']
    last = stream.feed(": 1}")
    rest = stream.finish()
    assert [c.arguments for c in last.tool_calls] == [": 1"] and [c.arguments for c in rest.tool_calls] == ["}"]
    assert [(c.index, c.id, c.arguments) for c in join_call_deltas(last.tool_calls, rest.tool_calls)] == [
        (0, None, ": 1}")]


def test_qwen3_typed_values_wait_for_the_next_tag_and_strings_stream() -> None:
    stream = ToolCallStream(make_tool_parser("qwen3_coder", [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}}]))
    pieces = ["<tool_call>\n<function=f>\n", "<parameter=n>\n", "5\n</parameter>\n", "<parameter=s>\n", "a b",
              "\n</parameter>\n</function>\n</tool_call>"]
    sent = [[(c.name, c.arguments) for c in stream.feed(p).tool_calls] for p in pieces]
    assert sent == [[("f", None)], [(None, '{"n": ')], [], [(None, '5, "s": "')], [(None, "a b")], [(None, '"}')]]


def test_call_ids_are_vllms() -> None:
    hermes = make_tool_parser("hermes", None).extract('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    mistral = make_tool_parser("mistral", None).extract('[TOOL_CALLS]f[ARGS]{}')
    assert hermes.tool_calls[0].id.startswith("chatcmpl-tool-") and len(hermes.tool_calls[0].id) == 46
    assert mistral.tool_calls[0].id.isalnum() and len(mistral.tool_calls[0].id) == 9


def test_mistral_before_v11_reads_a_list_of_calls() -> None:
    parser = make_tool_parser("mistral", None, vocab={"[TOOL_CALLS]": 5})
    result = parser.extract('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, {"name": "f"}]')
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("add", '{"a": 3.5, "b": 4}'), ("f", "{}")]


def test_the_parsers_have_vllms_names() -> None:
    assert {"hermes", "llama3_json", "mistral", "pythonic", "qwen3_coder", "qwen3_xml", "deepseek_v3"} <= set(
        TOOL_PARSERS)
    assert {"deepseek_r1", "qwen3"} <= set(REASONING_PARSERS)


@pytest.mark.parametrize("case", sorted(REASONING_CASES))
def test_reasoning_splits_as_vllms_tests_expect(case: str) -> None:
    name, text, kwargs, whole, _ = REASONING_CASES[case]
    assert REASONING_PARSERS[name](kwargs).extract(text) == whole


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize("case", sorted(REASONING_CASES))
def test_reasoning_streams_as_vllms_tests_expect(case: str, size: int) -> None:
    name, text, kwargs, _, (reasoning, content) = REASONING_CASES[case]
    stream = ReasoningStream(REASONING_PARSERS[name](kwargs))
    parts: dict[str, list[str]] = {"reasoning": [], "content": []}
    for delta in [*(stream.feed(c) for c in cut(text, size)), stream.finish()]:
        for key, sent in parts.items():
            if getattr(delta, key):
                sent.append(getattr(delta, key))
    assert ("".join(parts["reasoning"]) or None, "".join(parts["content"]) or None) == (reasoning, content)


def test_each_stream_of_a_request_keeps_its_own_llama3_json_state() -> None:
    """A request's choices share its parser; vLLM's llama3_json stream keeps state from step to
    step, so each stream reads with its own (n > 1 streams the same text the same way)."""
    parser = make_tool_parser("llama3_json", None)
    streams = [ToolCallStream(parser), ToolCallStream(parser)]
    sent: list[list[tuple]] = [[], []]
    for piece in ['{"name": "f', '", ', '"parameters": {"a": 1}}', " "]:
        for stream, out in zip(streams, sent, strict=True):
            out.append([(c.index, c.name, c.arguments) for c in stream.feed(piece).tool_calls])
    assert sent[0] == sent[1] == [[], [(0, "f", None)], [(0, None, '{"a": 1}')], [(0, None, "")]]
