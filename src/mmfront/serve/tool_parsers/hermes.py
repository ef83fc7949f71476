"""``hermes`` (and ``qwen3_json``): JSON objects between ``<tool_call>`` and ``</tool_call>``
(Hermes 2 Pro, Qwen 2.5, QwQ); the last call may run to the end of the output."""

from __future__ import annotations

import json
import re

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    ToolCall,
    ToolParser,
    is_json,
    json_arguments,
    no_tool_calls,
    partial_overlap,
)

START, END = "<tool_call>", "</tool_call>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)
_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_ARGUMENTS = re.compile(r'"arguments"\s*:\s*')


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

    def partial_calls(self, text: str) -> list[PartialCall]:
        """vLLM's stream: each ``<tool_call>`` region's name, and its arguments as written (up to
        the ``}`` that closes the call once the call's JSON is whole)."""
        calls = []
        for body, complete in _regions(text):
            name = _NAME.search(body)
            if name is None:
                break
            calls.append(PartialCall(name[1], _arguments(body, complete)))
        return calls


def _regions(text: str) -> list[tuple[str, bool]]:
    """Each ``<tool_call>`` region's JSON text, and whether it is whole (closed, or JSON that
    parses, its end tag not yet arrived)."""
    regions = []
    pos = 0
    while (start := text.find(START, pos)) != -1:
        body_start = start + len(START)
        end = text.find(END, body_start)
        if end != -1:
            regions.append((text[body_start:end].strip(), True))
            pos = end + len(END)
            continue
        body = text[body_start:]
        overlap = partial_overlap(body, END)
        body = (body[:-overlap] if overlap else body).strip()
        regions.append((body, bool(body) and is_json(body)))
        break
    return regions


def _arguments(body: str, complete: bool) -> str | None:
    found = _ARGUMENTS.search(body)
    if found is None:
        return None
    raw = body[found.end():]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw
