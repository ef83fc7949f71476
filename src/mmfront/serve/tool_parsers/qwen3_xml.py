"""``qwen3_xml`` and ``qwen3_coder``: Qwen3-Coder's (and Qwen3.5's) XML calls,
``<tool_call><function=NAME><parameter=KEY>VALUE</parameter>...</function></tool_call>``. Values
are text; each is given the JSON type its tool's schema declares (:mod:`.schema_types`)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    StreamView,
    ToolCall,
    ToolParser,
    no_tool_calls,
    partial_overlap,
)
from mmfront.serve.tool_parsers.schema_types import coerce, schema_types

START, END = "<tool_call>", "</tool_call>"
FUNCTION = "<function="
_FUNCTION = re.compile(r"<function=([^>]*)>(.*?)(?:</function>|(?=<function=)|$)", re.DOTALL)
_CALL_BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|\Z)|<function=.*?(?:</function>|\Z)", re.DOTALL)
_PARAMETER_TAG = re.compile(r"<\s*parameter\s*=\s*([^>]*)>")
PARAMETER_END, FUNCTION_END = "</parameter>", "</function>"
_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))",
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
    name_with_arguments = True

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

    def stream_view(self, text: str, final: bool) -> StreamView:
        """vLLM's parser engine: the text outside the calls as content once it is more than
        whitespace; a call's name once the character after its tag has come; each parameter's
        key when its tag closes, a string value as it is written (short of a newline and an end
        tag that may be coming), any other value, typed, when the next tag closes it."""
        outside = _CALL_BLOCK.sub("", text)
        if not final:
            outside = outside[:len(outside) - max(partial_overlap(outside, m) for m in self.start_markers)]
        calls = []
        for match in re.finditer(re.escape(FUNCTION), text):
            call = self._partial_call(text[match.end():], final)
            if call is None:
                break
            calls.append(call)
        return StreamView(outside if outside.strip() else "", calls)

    def _partial_call(self, body: str, final: bool) -> PartialCall | None:
        close = body.find(">")
        if close == -1 or (close == len(body) - 1 and not final):
            return None
        name, rest = body[:close].strip(), body[close + 1:]
        end = rest.find(FUNCTION_END)
        if end != -1:
            rest = rest[:end]
        tags = list(_PARAMETER_TAG.finditer(rest))
        arguments, pending = "", ""
        for n, tag in enumerate(tags):
            key = tag[1].strip()
            types = self._types(name, key)
            string = types == ["string"]
            arguments += ("{" if n == 0 else pending + ", ") + json.dumps(key, ensure_ascii=False) + ": "
            arguments += '"' if string else ""
            value = rest[tag.end():tags[n + 1].start() if n + 1 < len(tags) else len(rest)]
            closed = n + 1 < len(tags) or end != -1
            value = value[1:] if value.startswith("\n") else value
            if (tag_end := value.find(PARAMETER_END)) != -1:
                value = value[:tag_end]
            elif not closed and not final:
                value = value[:len(value) - max(partial_overlap(value, "\n" + PARAMETER_END),
                                                partial_overlap(value, PARAMETER_END))]
            if closed or tag_end != -1:
                value = value[:-1] if value.endswith("\n") else value
            if string:
                arguments += json.dumps(value, ensure_ascii=False)[1:-1]
                pending = '"'
            elif closed:
                pending = json.dumps(coerce(value, types), ensure_ascii=False)
        if end != -1:
            arguments = (arguments + pending + "}") if tags else "{}"
        return PartialCall(name, arguments or None)

    def _types(self, name: str, key: str) -> list[str]:
        schema = self.function_schema(name)
        properties = schema.get("properties") if schema is not None else None
        prop = properties.get(key) if isinstance(properties, Mapping) else None
        return schema_types(prop) if isinstance(prop, Mapping) else ["string"]
