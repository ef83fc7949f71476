"""``hermes`` (and ``qwen3_json``): JSON objects between ``<tool_call>`` and ``</tool_call>``
(Hermes 2 Pro, Qwen 2.5, QwQ); the last call may run to the end of the output."""

from __future__ import annotations

import json
import re

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, json_arguments, no_tool_calls

START, END = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)


class HermesToolParser(ToolParser):
    name = "hermes"
    structural_tag_model = "hermes"
    start_markers = (START,)
    call_end = END
    keeps_special_tokens = True

    def extract(self, text: str) -> ExtractedToolCalls:
        if START not in text:
            return no_tool_calls(text)
        try:
            calls = []
            for closed, open_ended in _CALL.findall(text):
                call = json.loads(closed or open_ended)
                calls.append(ToolCall(call["name"], json_arguments(call["arguments"])))
        except (ValueError, KeyError, TypeError):
            return no_tool_calls(text)
        content = text[:text.find(START)]
        return ExtractedToolCalls(True, calls, content or None)
