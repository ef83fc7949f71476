"""``mistral``: ``[TOOL_CALLS]name[ARGS]{...}`` (tokenizers v11 and later, which have an
``[ARGS]`` token; the ``[ARGS]`` may be left out), or ``[TOOL_CALLS][{"name": ..., "arguments":
...}, ...]`` (earlier ones). Call ids are nine letters and digits, as Mistral's templates
require."""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import Any

from mmfront.serve.tool_parsers.base import ExtractedToolCalls, ToolCall, ToolParser, json_arguments, no_tool_calls

TOOL_CALLS, ARGS = "[TOOL_CALLS]", "[ARGS]"
_DECODER = json.JSONDecoder()
_ID_CHARS = string.ascii_letters + string.digits


def mistral_tool_call_id() -> str:
    return "".join(secrets.choice(_ID_CHARS) for _ in range(9))


class MistralToolParser(ToolParser):
    name = "mistral"
    start_markers = (TOOL_CALLS,)
    engine_based = True
    supports_required_and_named = False
    keeps_special_tokens = True

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None,
                 vocab: Mapping[str, int] | None = None) -> None:
        super().__init__(tools)
        self.named_calls = vocab is None or ARGS in vocab

    def extract(self, text: str) -> ExtractedToolCalls:
        if TOOL_CALLS not in text:
            return no_tool_calls(text)
        content, *segments = text.split(TOOL_CALLS)
        calls = self._named(segments) if self.named_calls else self._listed(segments)
        if calls is None:
            return no_tool_calls(text) if self.named_calls else ExtractedToolCalls(
                False, [], next((s.strip() for s in segments if s.strip()), ""))
        return ExtractedToolCalls(True, calls, content if content.strip() else None)

    @staticmethod
    def _named(segments: list[str]) -> list[ToolCall] | None:
        calls = []
        for segment in segments:
            if not segment.strip():
                continue
            name, sep, rest = segment.partition(ARGS)
            if not sep:
                brace = segment.find("{")
                if brace == -1:
                    return None
                name, rest = segment[:brace], segment[brace:]
            try:
                arguments, _ = _DECODER.raw_decode(rest.strip())
            except ValueError:
                return None
            calls.append(ToolCall(name.strip(), json_arguments(arguments), id=mistral_tool_call_id()))
        return calls or None

    @staticmethod
    def _listed(segments: list[str]) -> list[ToolCall] | None:
        payload = next((s.strip() for s in segments if s.strip()), "")
        try:
            parsed, _ = _DECODER.raw_decode(payload)
        except ValueError:
            return None
        items = [parsed] if isinstance(parsed, dict) else parsed if isinstance(parsed, list) else []
        calls = []
        for item in items:
            if not isinstance(item, dict) or not ("name" in item or "arguments" in item):
                continue
            name, arguments = item.get("name"), item.get("arguments")
            arguments = "{}" if arguments is None else arguments if isinstance(arguments, str) else json_arguments(
                arguments)
            calls.append(ToolCall(name if isinstance(name, str) else "", arguments, id=mistral_tool_call_id()))
        return calls or None
