"""``qwen3_xml`` and ``qwen3_coder``: Qwen3-Coder's (and Qwen3.5's) XML calls,
``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``. Values
are text; each is given the JSON type its tool's schema declares (:mod:`.schema_types`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, no_tool_calls
from mmfront.serve.tool_parsers.schema_types import coerce, schema_types

START, END = "<tool_call>", "</tool_call>"
FUNCTION = "<function="
_FUNCTION = re.compile(r"<function=([^>]*)>(.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)|<function=.*?(?:</function>|$)", re.DOTALL)
_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=)|$)",
                        re.DOTALL)


def _unwrap(value: str) -> str:
    """Without the one newline the template puts on each side of a value."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


class Qwen3XMLToolParser(ToolParser):
    name = "qwen3_xml"
    structural_tag_model = "qwen_3_coder"
    start_markers = (START, FUNCTION)
    call_end = END
    engine_based = True

    def extract(self, text: str) -> ExtractedToolCalls:
        begin = self.content_end(text)
        if begin >= len(text) or not any(m in text for m in self.start_markers):
            return no_tool_calls(text)
        calls = []
        for match in _FUNCTION.finditer(text, begin):
            name = match[1].strip()
            arguments = {key.strip(): _unwrap(value) for key, value in _PARAMETER.findall(match[2])}
            calls.append(ToolCall(name, json.dumps(self._typed(name, arguments), ensure_ascii=False)))
        if not calls:
            return no_tool_calls(text)
        return ExtractedToolCalls(True, calls, text[:begin].strip() or None)

    def streamed_content(self, text: str, result: ExtractedToolCalls) -> str:
        """vLLM's stream sends the text around and between the calls as it is, unless it is
        only whitespace."""
        outside = _CALL_BLOCK.sub("", text) if result.tools_called else ""
        return outside if outside.strip() else ""

    def _typed(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        schema = self.function_schema(name)
        properties = schema.get("properties") if schema is not None else None
        if not isinstance(properties, Mapping):
            return arguments
        return {key: coerce(value, schema_types(properties[key])) if isinstance(properties.get(key), Mapping)
                else value for key, value in arguments.items()}
