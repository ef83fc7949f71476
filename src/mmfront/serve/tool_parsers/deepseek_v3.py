"""``deepseek_v3``: DeepSeek V3 and R1's calls, ``<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME``,
a fenced JSON block of arguments and ``<｜tool▁call▁end｜>``, inside
``<｜tool▁calls▁begin｜>...<｜tool▁calls▁end｜>``. The arguments are passed on as written."""

from __future__ import annotations

import re

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, no_tool_calls

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_CALL = re.compile(rf"{CALL_BEGIN}(?P<type>.*){SEP}(?P<name>.*)\n```json\n(?P<arguments>[\s\S]*?)\n```{CALL_END}")


class DeepSeekV3ToolParser(ToolParser):
    name = "deepseek_v3"
    structural_tag_model = "deepseek_r1"
    start_markers = (CALLS_BEGIN,)
    call_end = CALL_END

    def extract(self, text: str) -> ExtractedToolCalls:
        if CALLS_BEGIN not in text:
            return no_tool_calls(text)
        calls = [ToolCall(m["name"], m["arguments"], type=m["type"]) for m in _CALL.finditer(text)]
        content = text[:text.find(CALLS_BEGIN)]
        end = text.rfind(CALLS_END)
        if end != -1:
            content += text[end + len(CALLS_END):]
        return ExtractedToolCalls(True, calls, content or None)
