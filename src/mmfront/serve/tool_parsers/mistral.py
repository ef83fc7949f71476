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

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    StreamView,
    ToolCall,
    ToolParser,
    json_arguments,
    no_tool_calls,
    partial_overlap,
)

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
    name_with_arguments = True

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None,
                 vocab: Mapping[str, int] | None = None, *, forced: bool = False) -> None:
        super().__init__(tools)
        self.named_calls = vocab is None or ARGS in vocab
        self.forced = forced
        """``tool_choice: "required"`` or a named tool: the output is the bare JSON array
        :meth:`forced_calls_schema` constrains it to, which only the format before v11 reads
        as calls (vLLM 0.33 reads it as content where the vocabulary has ``[ARGS]``)."""

    def forced_calls_schema(self, named: str | None) -> dict[str, Any] | None:
        """vLLM's schema for a Hugging Face tokenizer: an array of ``{"name", "arguments"}``,
        at most one item for a named tool (``parallel_tool_calls`` does not cap it)."""
        tools = [t["function"] for t in self.tools if named is None or t["function"]["name"] == named]
        if not tools:
            return None
        items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [f["name"]]},
                                                   "arguments": f.get("parameters") or {"type": "object"}},
                  "required": ["name", "arguments"]} for f in tools]
        return {"type": "array", "minItems": 1, **({"maxItems": 1} if named is not None else {}),
                "items": {"type": "object", "anyOf": items}}

    def content_end(self, text: str) -> int:
        """The bare array of a forced call before v11 is never content."""
        return 0 if self.forced and not self.named_calls else super().content_end(text)

    def extract(self, text: str) -> ExtractedToolCalls:
        if TOOL_CALLS not in text:
            if not (self.forced and not self.named_calls):
                return no_tool_calls(text)
            text = TOOL_CALLS + text  # the bare array of a forced call, read as after the marker
        content, *segments = text.split(TOOL_CALLS)
        calls = self._named(segments) if self.named_calls else self._listed(segments)
        if calls is None:
            return no_tool_calls(text) if self.named_calls else ExtractedToolCalls(
                False, [], next((s.strip() for s in segments if s.strip()), ""))
        return ExtractedToolCalls(True, calls, content if content.strip() else None)

    def new_call_id(self) -> str:
        return mistral_tool_call_id()

    def stream_view(self, text: str, final: bool) -> StreamView | None:
        """vLLM's stream of the named format: a call's name with the first character of its
        arguments, then the arguments as written (what follows their JSON included), a closing
        ``}`` held back until the call ends (the next ``[TOOL_CALLS]``, or the answer's end).
        The listed format streams each call whole."""
        if not self.named_calls:
            return None
        content, *segments = text.split(TOOL_CALLS)
        calls = []
        for n, segment in enumerate(segments):
            split = _name_and_arguments(segment)
            if split is None or not split[1]:
                break
            name, arguments = split
            if n == len(segments) - 1 and not final:
                arguments = arguments[:len(arguments) - _marker_overlap(arguments)]
                arguments = arguments.rstrip("}") or arguments[:1]
            calls.append(PartialCall(name.strip(), arguments))
        return StreamView(content[:self.content_end(content)] if not segments else content, calls)

    @staticmethod
    def _named(segments: list[str]) -> list[ToolCall] | None:
        calls = []
        for segment in segments:
            if not segment.strip():
                continue
            split = _name_and_arguments(segment)
            if split is None:
                return None
            name, rest = split
            calls.append(ToolCall(name.strip(), _first_json(rest), id=mistral_tool_call_id()))
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


def _name_and_arguments(segment: str) -> tuple[str, str] | None:
    """A call's name and the text of its arguments: after ``[ARGS]``, else from the first
    ``{``; ``None`` while neither has come."""
    name, sep, rest = segment.partition(ARGS)
    if sep:
        return name, rest
    brace = segment.find("{")
    return None if brace == -1 else (segment[:brace], segment[brace:])


def _marker_overlap(arguments: str) -> int:
    """How many last characters of the arguments may be a ``[TOOL_CALLS]`` being written: a
    lone ``[`` only right after the object's ``}`` (in the JSON it opens an array, which vLLM
    sends at once)."""
    overlap = partial_overlap(arguments, TOOL_CALLS)
    return overlap if overlap > 1 or arguments[:-1].rstrip().endswith("}") else 0


def _first_json(arguments: str) -> str:
    """The arguments as vLLM reads them: the first JSON value as written (what follows it
    dropped), or the text as it is where it is no JSON (an answer cut inside the call)."""
    stripped = arguments.strip()
    if not stripped:
        return "{}"
    try:
        _, end = _DECODER.raw_decode(stripped)
    except ValueError:
        return stripped
    return stripped[:end]
