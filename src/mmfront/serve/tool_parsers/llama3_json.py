"""``llama3_json`` (and ``llama4_json``): JSON objects ``{"name": ..., "parameters": ...}``
(or ``"arguments"``), one after another or separated by ``;``, optionally after
``<|python_tag|>`` (Llama 3.1-3.3 and 4 with vLLM's JSON tool template)."""

from __future__ import annotations

import json

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, json_arguments, no_tool_calls

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    structural_tag_model = "llama"
    start_markers = (PYTHON_TAG, "{")

    def content_end(self, text: str) -> int:
        """In a stream, calls open the output (vLLM's stream reads JSON only there)."""
        if text.startswith(("{", PYTHON_TAG)) or PYTHON_TAG.startswith(text):
            return 0
        return len(text)

    def extract(self, text: str) -> ExtractedToolCalls:
        if PYTHON_TAG not in text and "{" not in text:
            return no_tool_calls(text)
        calls: list[ToolCall] = []
        end = -1
        start = text.find("{")
        while start != -1:
            if start > end:
                try:
                    obj, length = _DECODER.raw_decode(text[start:])
                    end = start + length
                    arguments = obj["arguments"] if "arguments" in obj else obj["parameters"]
                    calls.append(ToolCall(obj["name"], json_arguments(arguments)))
                except KeyError:
                    return no_tool_calls(text)
                except (ValueError, TypeError):
                    return no_tool_calls(text)
            start = text.find("{", start + 1)
        if not calls:
            return no_tool_calls(text)
        return ExtractedToolCalls(True, calls, None)
