"""Model outputs from vLLM's own parser tests (tests/tool_parsers, tests/reasoning in
vllm-project/vllm), with what those tests expect, for mmfront's parsers and for the side-by-side
check against the installed vLLM parsers (test_parsers_vs_vllm.py)."""

from __future__ import annotations

from typing import Any

WEATHER_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_current_weather", "parameters": {
        "type": "object", "properties": {
            "city": {"type": "string"}, "state": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer"}, "precise": {"type": "boolean"}, "threshold": {"type": "number"},
            "options": {"type": "object"}, "tags": {"type": "array"}, "note": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "bash", "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}}}},
]

# (parser, model output, tools) -> (tools_called, [(name, arguments)], content)
TOOL_CASES: dict[str, tuple[str, str, list[dict[str, Any]] | None, tuple[bool, list[tuple[str, str]], str | None]]] = {
    # tests/tool_parsers/test_hermes_tool_parser.py
    "hermes_no_call": ("hermes", "This is not a tool call.", None, (False, [], "This is not a tool call.")),
    "hermes_between_tags": ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>',
                            None, (True, [("final_answer", '{"trigger": true}')], None)),
    "hermes_until_eos": ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}', None,
                         (True, [("final_answer", '{"trigger": true}')], None)),
    "hermes_invalid_json": ("hermes", '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}', None,
                            (False, [], '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}')),
    "hermes_content_then_call": ("hermes", 'Sure, let me check the weather.<tool_call>{"name": "get_weather", '
                                 '"arguments": {"city": "NYC"}}</tool_call>', None,
                                 (True, [("get_weather", '{"city": "NYC"}')], "Sure, let me check the weather.")),
    "hermes_two_calls": ("hermes", '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
                         '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>', None,
                         (True, [("search", '{"q": "cats"}'), ("search", '{"q": "dogs"}')], None)),
    "hermes_unicode": ("hermes", '<tool_call>{"name": "say", "arguments": {"text": "héllo 世界"}}</tool_call>', None,
                       (True, [("say", '{"text": "héllo 世界"}')], None)),
    # tests/tool_parsers/test_llama3_json_tool_parser.py
    "llama3_single": ("llama3_json", '{"name": "searchTool", "parameters": {"query": "test"}}', None,
                      (True, [("searchTool", '{"query": "test"}')], None)),
    "llama3_semicolon": ("llama3_json", '{"name": "getOpenIncidentsTool", "parameters": {}}; '
                         '{"name": "searchTool", "parameters": {"query": "test"}}', None,
                         (True, [("getOpenIncidentsTool", "{}"), ("searchTool", '{"query": "test"}')], None)),
    "llama3_text_around": ("llama3_json", 'Some text {"name": "searchTool", "parameters": {"query": "test"}} '
                           "more text", None, (True, [("searchTool", '{"query": "test"}')], None)),
    "llama3_python_tag": ("llama3_json", '<|python_tag|>{"name": "get_current_weather", "arguments": '
                          '{"city": "Dallas"}}', None, (True, [("get_current_weather", '{"city": "Dallas"}')], None)),
    "llama3_no_call": ("llama3_json", "How can I help you today?", None,
                       (False, [], "How can I help you today?")),
    "llama3_missing_name": ("llama3_json", '{"parameters": {"q": 1}}', None,
                            (False, [], '{"parameters": {"q": 1}}')),
    # tests/tool_parsers/test_pythonic_tool_parser.py
    "pythonic_simple": ("pythonic", "[get_weather(city='San Francisco', metric='celsius')]", None,
                        (True, [("get_weather", '{"city": "San Francisco", "metric": "celsius"}')], None)),
    "pythonic_more_types": ("pythonic", "[register_user(name='John Doe', age=37, address={'city': 'San Francisco', "
                            "'state': 'CA'}, role=None, passed_test=True, aliases=['John', 'Johnny'])]", None,
                            (True, [("register_user", '{"name": "John Doe", "age": 37, "address": {"city": "San '
                                     'Francisco", "state": "CA"}, "role": null, "passed_test": true, "aliases": '
                                     '["John", "Johnny"]}')], None)),
    "pythonic_parallel": ("pythonic", "[get_weather(city='San Francisco', metric='celsius'), "
                          "register_user(name='John Doe', age=37)]", None,
                          (True, [("get_weather", '{"city": "San Francisco", "metric": "celsius"}'),
                                  ("register_user", '{"name": "John Doe", "age": 37}')], None)),
    "pythonic_no_args": ("pythonic", "[do_something_cool()]", None, (True, [("do_something_cool", "{}")], None)),
    "pythonic_negative_and_json_names": ("pythonic", "[move(dx=-1.5, flag=true, none=null)]", None,
                                         (True, [("move", '{"dx": -1.5, "flag": true, "none": null}')], None)),
    "pythonic_escaped": ("pythonic", "[get_weather(city='Martha\\'s Vineyard', metric='\"cool units\"')]", None,
                         (True, [("get_weather", '{"city": "Martha\'s Vineyard", "metric": "\\"cool units\\""}')],
                          None)),
    "pythonic_no_call": ("pythonic", "Hello, how can I help?", None, (False, [], "Hello, how can I help?")),
    # tests/tool_parsers/test_mistral_tool_parser.py (v11+ tokenizers)
    "mistral_single": ("mistral", '[TOOL_CALLS]add_this_and_that[ARGS]{"a": 3.5, "b": 4}', None,
                       (True, [("add_this_and_that", '{"a": 3.5, "b": 4}')], None)),
    "mistral_content_then_call": ("mistral", 'Let me add.[TOOL_CALLS]add[ARGS]{"a": 1, "b": 2}', None,
                                  (True, [("add", '{"a": 1, "b": 2}')], "Let me add.")),
    "mistral_parallel": ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 3.5, "b": 4}[TOOL_CALLS]multiply[ARGS]{"a": 3, "b": 6}',
                         None, (True, [("add", '{"a": 3.5, "b": 4}'), ("multiply", '{"a": 3, "b": 6}')], None)),
    "mistral_no_call": ("mistral", "The answer is 42.", None, (False, [], "The answer is 42.")),
    # tests/tool_parsers/test_deepseekv3_tool_parser.py
    "deepseek_v3_single": ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                           '```json\n{"city": "Tokyo"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', None,
                           (True, [("get_weather", '{"city": "Tokyo"}')], None)),
    "deepseek_v3_two_and_content": ("deepseek_v3", "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                                    'a\n```json\n{"x": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>'
                                    'b\n```json\n{"y": [1, 2]}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', None,
                                    (True, [("a", '{"x": 1}'), ("b", '{"y": [1, 2]}')], "Checking.")),
    "deepseek_v3_no_call": ("deepseek_v3", "No tools here.", None, (False, [], "No tools here.")),
    # tests/tool_parsers/test_qwen3coder_tool_parser.py, test_qwen3xml_tool_parser.py
    "qwen3_coder_typed": ("qwen3_coder", "<tool_call>\n<function=get_current_weather>\n<parameter=city>\nDallas\n"
                          "</parameter>\n<parameter=state>\nTX\n</parameter>\n<parameter=unit>\nfahrenheit\n"
                          "</parameter>\n<parameter=days>\n5\n</parameter>\n<parameter=precise>\ntrue\n</parameter>\n"
                          "<parameter=threshold>\n1.5\n</parameter>\n</function>\n</tool_call>", WEATHER_TOOLS,
                          (True, [("get_current_weather", '{"city": "Dallas", "state": "TX", "unit": "fahrenheit", '
                                   '"days": 5, "precise": true, "threshold": 1.5}')], None)),
    "qwen3_coder_content_first": ("qwen3_coder", "Let me check.\n<tool_call>\n<function=bash>\n<parameter=command>\n"
                                  "cat /etc/hosts\n</parameter>\n</function>\n</tool_call>", WEATHER_TOOLS,
                                  (True, [("bash", '{"command": "cat /etc/hosts"}')], "Let me check.")),
    "qwen3_coder_text_around": ("qwen3_coder", "  Let me check.\n<tool_call>\n<function=bash>\n<parameter=command>\nls\n"
                                "</parameter>\n</function>\n</tool_call>\nDone.", WEATHER_TOOLS,
                                (True, [("bash", '{"command": "ls"}')], "Let me check.")),
    "qwen3_coder_untyped": ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n"
                            "</tool_call>", None, (True, [("f", '{"a": "1"}')], None)),
    "qwen3_coder_object_array": ("qwen3_coder", "<tool_call>\n<function=get_current_weather>\n<parameter=options>\n"
                                 '{"k": [1, 2]}\n</parameter>\n<parameter=tags>\n["a", "b"]\n</parameter>\n'
                                 "<parameter=note>\nnull\n</parameter>\n</function>\n</tool_call>", WEATHER_TOOLS,
                                 (True, [("get_current_weather", '{"options": {"k": [1, 2]}, "tags": ["a", "b"], '
                                          '"note": null}')], None)),
    "qwen3_coder_two_calls": ("qwen3_coder", "<tool_call>\n<function=bash>\n<parameter=command>\nls\n</parameter>\n"
                              "</function>\n</tool_call>\n<tool_call>\n<function=bash>\n<parameter=command>\npwd\n"
                              "</parameter>\n</function>\n</tool_call>", WEATHER_TOOLS,
                              (True, [("bash", '{"command": "ls"}'), ("bash", '{"command": "pwd"}')], None)),
    "qwen3_coder_no_call": ("qwen3_coder", "Just an answer.", WEATHER_TOOLS, (False, [], "Just an answer.")),
    # answers cut by max_tokens inside a call, JSON nested, text after the calls (what vLLM 0.33's
    # parsers answer)
    "mistral_nested": ("mistral", '[TOOL_CALLS]f[ARGS]{"a": {"b": [1, 2]}, "c": "x}"}', None,
                       (True, [("f", '{"a": {"b": [1, 2]}, "c": "x}"}')], None)),
    "mistral_cut": ("mistral", 'Sure.[TOOL_CALLS]add[ARGS]{"a": 1, "b', None, (True, [("add", '{"a": 1, "b')], "Sure.")),
    "mistral_text_after": ("mistral", '[TOOL_CALLS]add[ARGS]{"a": 1} done', None, (True, [("add", '{"a": 1}')], None)),
    "mistral_no_args_tag": ("mistral", '[TOOL_CALLS]add{"a": 1}', None, (True, [("add", '{"a": 1}')], None)),
    "deepseek_v3_cut": ("deepseek_v3", "Hi.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n"
                        '```json\n{"city": "To', None, (True, [], "Hi.")),
    "deepseek_v3_pretty": ("deepseek_v3", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n"
                           '{\n  "a": 1\n}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>after', None,
                           (True, [("f", '{\n  "a": 1\n}')], "after")),
    "pythonic_cut": ("pythonic", "[get_weather(city='San Fr", None, (False, [], "[get_weather(city='San Fr")),
    "qwen3_coder_cut": ("qwen3_coder", "<tool_call>\n<function=bash>\n<parameter=command>\nls -l", WEATHER_TOOLS,
                        (True, [("bash", "{}")], None)),
    "llama3_three_calls": ("llama3_json", '<|python_tag|>{"name": "a", "parameters": {"x": 1}}; {"name": "b", '
                           '"parameters": {"y": "two words"}}; {"name": "c", "arguments": {"z": [true, null]}}', None,
                           (True, [("a", '{"x": 1}'), ("b", '{"y": "two words"}'), ("c", '{"z": [true, null]}')], None)),
    "llama3_nested": ("llama3_json", '{"name": "f", "parameters": {"a": {"b": [1, 2.5, {"c": "x}"}]}, "d": "\\"q\\"", '
                      '"e": "héllo 世界"}}', None,
                      (True, [("f", '{"a": {"b": [1, 2.5, {"c": "x}"}]}, "d": "\\"q\\"", "e": "héllo 世界"}')], None)),
    "llama3_cut": ("llama3_json", '{"name": "searchTool", "parameters": {"query": "weather in Par', None,
                   (False, [], '{"name": "searchTool", "parameters": {"query": "weather in Par')),
    "llama3_cut_second": ("llama3_json", '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y', None,
                          (False, [], '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {"y')),
    "llama3_space_after": ("llama3_json", '{"name": "f", "parameters": {"a": "b"}}; ', None,
                           (True, [("f", '{"a": "b"}')], None)),
    "llama3_pretty": ("llama3_json", '{\n  "name": "f",\n  "parameters": {\n    "a": 10,\n    "b": false\n  }\n}', None,
                      (True, [("f", '{"a": 10, "b": false}')], None)),
    "qwen3_coder_two_params": ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx y\n</parameter>\n"
                               "<parameter=b>\n2\n</parameter>\n</function>\n</tool_call>", None,
                               (True, [("f", '{"a": "x y", "b": "2"}')], None)),
}

FORCED_TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
_ARRAY = '[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
_NAMED = {"type": "function", "function": {"name": "get_weather"}}

# mistral with tool_choice "required" or a named tool, whose output vLLM constrains to a bare JSON
# array (a Hugging Face tokenizer): (model output, tool_choice, whether the vocabulary has
# [ARGS]) -> the whole answer vLLM 0.33 reads (tools_called, [(name, arguments)], content)
FORCED_MISTRAL_CASES: dict[str, tuple[str, Any, bool, tuple[bool, list[tuple[str, str]], str | None]]] = {
    "v11_required_array": (_ARRAY, "required", True, (False, [], _ARRAY)),
    "v11_named_array": (_ARRAY, _NAMED, True, (False, [], _ARRAY)),
    "v11_required_marker": ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}', "required", True,
                            (True, [("get_weather", '{"city": "Paris"}')], None)),
    "pre_v11_required_array": (_ARRAY, "required", False, (True, [("get_weather", '{"city": "Paris"}')], None)),
    "pre_v11_named_array": (_ARRAY, _NAMED, False, (True, [("get_weather", '{"city": "Paris"}')], None)),
    "pre_v11_required_marker": ("Hi [TOOL_CALLS]" + _ARRAY, "required", False,
                                (True, [("get_weather", '{"city": "Paris"}')], "Hi ")),
    "pre_v11_required_cut": ('[{"name": "get_weather", "arguments": {"ci', "required", False,
                             (False, [], '[{"name": "get_weather", "arguments": {"ci')),
    "pre_v11_auto_array": (_ARRAY, "auto", False, (False, [], _ARRAY)),
}

_PYTHONIC_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]
_GET_TIME = {"type": "function", "function": {"name": "get_time"}}

# the JSON tool_choice "required" (an array of {"name", "parameters"}) or a named tool (the
# arguments) constrains a `pythonic` answer to, which vLLM's chat server streams with code every
# JSON-reading parser shares: (model output, tool_choice) -> the calls a stream assembles
# [(name, arguments)]
FORCED_JSON_CASES: dict[str, tuple[str, Any, list[tuple[str, str]]]] = {
    "required_one": ('[{"name": "get_weather", "parameters": {"city": "Paris"}}]', "required",
                     [("get_weather", '{"city": "Paris"}')]),
    "required_two": ('[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, '
                     '{"name": "get_time", "parameters": {}}]', "required",
                     [("get_weather", '{"city": "Paris", "days": 3}'), ("get_time", "{}")]),
    "required_tricky_strings": ('[ {"parameters" : {"city": "a \\"}] {x", "days": [1, {"y": "]"}]},'
                                ' "name":"get_weather"} ]', "required",
                                [("get_weather", '{"city": "a \\"}] {x", "days": [1, {"y": "]"}]}')]),
    "required_pretty": ('[\n  {\n    "name": "get_time",\n    "parameters": {}\n  }\n]', "required",
                        [("get_time", "{}")]),
    "required_scalar_parameters": ('[{"name": "get_time", "parameters": null}, {"name": "get_weather", '
                                   '"parameters": "x"}]', "required", [("get_time", "null"), ("get_weather", '"x"')]),
    "required_cut": ('[{"name": "get_weather", "parameters": {"city": "Par', "required",
                     [("get_weather", '{"city": "Par')]),
    "required_bad_name": ('[{"name": "get_\\q", "parameters": {}}]', "required", []),
    "required_not_an_array": ('{"name": "get_time", "parameters": {}}', "required", []),
    "required_text_after": ('[{"name": "get_time", "parameters": {}}] and [{"name": "x", "parameters": 1}]',
                            "required", [("get_time", "{}")]),
    "named": ('{"city": "Paris", "days": 2}', _NAMED, [("get_weather", '{"city": "Paris", "days": 2}')]),
    "named_empty_object": ("{}", _GET_TIME, [("get_time", "{}")]),
}
FORCED_JSON_TOOLS = _PYTHONIC_TOOLS


def stream_tools(case: str) -> list[dict[str, Any]]:
    """The request's tools for a case's stream (vLLM reads calls in a stream only when the
    request has tools): the case's, else one of each name it calls."""
    _, _, tools, (_, calls, _) = TOOL_CASES[case]
    names = dict.fromkeys(name for name, _ in calls) or {"unused": None}
    return tools or [{"type": "function", "function": {"name": name}} for name in names]

STREAMED_TOOLS_DIFFER: dict[str, tuple[bool, list[tuple[str, str]], str | None]] = {
    # vLLM's llama3_json stream reads calls only where the output opens with one: all content
    "llama3_text_around": (False, [], 'Some text {"name": "searchTool", "parameters": {"query": "test"}} more text'),
    # the text around Qwen3's calls streams as content, the whole answer's content is the text before them
    "qwen3_coder_content_first": (True, [("bash", '{"command": "cat /etc/hosts"}')], "Let me check.\n"),
    "qwen3_coder_text_around": (True, [("bash", '{"command": "ls"}')], "  Let me check.\n\nDone."),
    "qwen3_coder_two_calls": (True, [("bash", '{"command": "ls"}'), ("bash", '{"command": "pwd"}')], None),
    "deepseek_v3_two_and_content": (True, [("a", '{"x": 1}'), ("b", '{"y": [1, 2]}')], "Checking.\n"),
    # an output cut inside a call: vLLM's stream has sent the call so far, its whole answer holds none
    "hermes_invalid_json": (True, [("final_answer", '{"trigger": true}')], None),
    "deepseek_v3_cut": (True, [("get_weather", '{"city": "To')], "Hi."),
    "qwen3_coder_cut": (True, [("bash", '{"command": "ls -l')], None),
    "pythonic_cut": (True, [("get_weather", '{"city": "San Fr')], None),
    # Mistral's arguments stream as written, what follows their JSON included
    "mistral_text_after": (True, [("add", '{"a": 1} done')], None),
    # what follows a call's opening marker is not content, in vLLM's stream, even when it is no call
    "llama3_missing_name": (False, [], None),
    # llama3_json: the calls as partial_json_parser reads the text so far (its stream sends a
    # prefix of them: STREAMED_PREFIX)
    "llama3_cut": (True, [("searchTool", '{"query": "weather in Par"}')], None),
    "llama3_cut_second": (True, [("a", '{"x": 1}'), ("b", "{}")], None),
}
"""Cases whose stream vLLM reads otherwise than the whole output (its stream parsers do)."""

STREAMED_PREFIX = {
    "llama3_json": "vLLM's stream sends a fragment where partial_json_parser's reading of the text so far changes "
                   "from its last step's, and the rest of a call's arguments only at a step that completes its JSON",
}
"""Parsers whose stream sends, depending on how the text arrives, only a prefix of the calls and
of each call's arguments (vLLM's too: test_parsers_vs_vllm.py compares the deltas)."""

# (parser, model output, chat_template_kwargs) -> (reasoning, content), whole and streamed
REASONING_CASES: dict[str, tuple[str, str, dict[str, Any] | None, tuple[str | None, str | None],
                                 tuple[str | None, str | None]]] = {
    # tests/reasoning/test_deepseekr1_reasoning_parser.py
    "r1_simple": ("deepseek_r1", "This is a reasoning section</think>This is the rest", None,
                  ("This is a reasoning section", "This is the rest"), ("This is a reasoning section", "This is the rest")),
    "r1_complete": ("deepseek_r1", "This is a reasoning section</think>", None,
                    ("This is a reasoning section", None), ("This is a reasoning section", None)),
    "r1_no_content": ("deepseek_r1", "This is content", None, ("This is content", None), ("This is content", None)),
    "r1_multiple_lines": ("deepseek_r1", "This\nThat</think>This is the rest\nThat", None,
                          ("This\nThat", "This is the rest\nThat"), ("This\nThat", "This is the rest\nThat")),
    "r1_shortest": ("deepseek_r1", "</think>This is the rest", None, ("", "This is the rest"),
                    (None, "This is the rest")),
    "r1_with_think": ("deepseek_r1", "<think>This is a reasoning section</think>This is the rest", None,
                      ("This is a reasoning section", "This is the rest"),
                      ("This is a reasoning section", "This is the rest")),
    "r1_think_no_end": ("deepseek_r1", "<think>This is a reasoning section", None,
                        ("This is a reasoning section", None), ("This is a reasoning section", None)),
    "r1_empty": ("deepseek_r1", "", None, ("", None), (None, None)),
    "r1_new_line": ("deepseek_r1", "\n<think>This is a reasoning section</think>\nThis is the rest", None,
                    ("This is a reasoning section", "\nThis is the rest"),
                    ("\nThis is a reasoning section", "\nThis is the rest")),
    # tests/reasoning/test_qwen3_reasoning_parser.py
    "qwen3_without_start": ("qwen3", "This is a reasoning section</think>This is the rest", None,
                            ("This is a reasoning section", "This is the rest"),
                            ("This is a reasoning section", "This is the rest")),
    "qwen3_complete_without_start": ("qwen3", "This is a reasoning section</think>", None,
                                     ("This is a reasoning section", None), ("This is a reasoning section", None)),
    "qwen3_with_think": ("qwen3", "<think>This is a reasoning section</think>This is the rest", None,
                         ("This is a reasoning section", "This is the rest"),
                         ("This is a reasoning section", "This is the rest")),
    "qwen3_truncated": ("qwen3", "This is the rest", None, ("This is the rest", None), ("This is the rest", None)),
    "qwen3_multiline": ("qwen3", "<think>This is a reasoning\nsection</think>This is the rest\nThat", None,
                        ("This is a reasoning\nsection", "This is the rest\nThat"),
                        ("This is a reasoning\nsection", "This is the rest\nThat")),
    "qwen3_only_open_tag": ("qwen3", "<think>This is a reasoning section", None,
                            ("This is a reasoning section", None), ("This is a reasoning section", None)),
    "qwen3_tool_call_ends_reasoning": (
        "qwen3", "I need to read the file.\n\n<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n"
        "</parameter>\n</function>\n</tool_call>", None, ("I need to read the file.\n\n", "<tool_call>\n"
        "<function=bash>\n<parameter=command>\ncat /etc/hosts\n</parameter>\n</function>\n</tool_call>"),
        ("I need to read the file.\n\n", "<tool_call>\n<function=bash>\n<parameter=command>\ncat /etc/hosts\n"
         "</parameter>\n</function>\n</tool_call>")),
    "qwen3_newline_before_think": ("qwen3", "\n<think>abc</think>\nrest", None, ("\nabc", "\nrest"), ("\nabc", "\nrest")),
    "qwen3_markers_inside": ("qwen3", "<think>a<think>b</think>c</think>d", None, ("ab", "cd"), ("ab", "cd")),
    "r1_markers_inside": ("deepseek_r1", "<think>a<think>b</think>c</think>d", None, ("a<think>b", "c</think>d"),
                          ("ab", "cd")),
    "qwen3_thinking_disabled_end_marker": ("qwen3", "hmm</think>ok", {"enable_thinking": False},
                                           (None, "hmm</think>ok"), (None, "hmmok")),
    "qwen3_thinking_disabled": ("qwen3", "This is plain content", {"enable_thinking": False},
                                (None, "This is plain content"), (None, "This is plain content")),
    "qwen3_thinking_disabled_tool_call": (
        "qwen3", "I need to read the file.\n\n<tool_call>\n<function=bash>\n</function>\n</tool_call>",
        {"enable_thinking": False}, (None, "I need to read the file.\n\n<tool_call>\n<function=bash>\n</function>\n"
                                     "</tool_call>"),
        (None, "I need to read the file.\n\n<tool_call>\n<function=bash>\n</function>\n</tool_call>")),
}
