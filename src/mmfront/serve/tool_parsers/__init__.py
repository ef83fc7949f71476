"""``--tool-call-parser NAME``: the formats of tool calls mmfront reads out of a model's output,
by vLLM's names (``--enable-auto-tool-choice`` turns them on for ``tool_choice: "auto"``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mmfront.serve.tool_parsers.base import (
    CallDelta,
    ExtractedToolCalls,
    PartialCall,
    StreamDelta,
    StreamView,
    ToolCall,
    ToolCallStream,
    ToolParser,
    is_json,
    join_call_deltas,
    make_tool_call_id,
)
from mmfront.serve.tool_parsers.deepseek_v3 import DeepSeekV3ToolParser
from mmfront.serve.tool_parsers.hermes import HermesToolParser
from mmfront.serve.tool_parsers.llama3_json import Llama3JsonToolParser
from mmfront.serve.tool_parsers.mistral import MistralToolParser
from mmfront.serve.tool_parsers.pythonic import PythonicToolParser
from mmfront.serve.tool_parsers.qwen3_xml import Qwen3XMLToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen3_json": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "llama4_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
    "pythonic": PythonicToolParser,
    "qwen3_coder": Qwen3XMLToolParser,
    "qwen3_xml": Qwen3XMLToolParser,
    "deepseek_v3": DeepSeekV3ToolParser,
}
"""The ``--tool-call-parser`` names mmfront knows (vLLM's names for the same formats)."""


def make_tool_parser(name: str, tools: Sequence[Mapping[str, Any]] | None,
                     vocab: Mapping[str, int] | None = None, *, forced: bool = False) -> ToolParser:
    """A parser for one request (``tools``: its tools, whose schemas some formats need;
    ``forced``: its ``tool_choice`` is ``"required"`` or a named tool)."""
    cls = TOOL_PARSERS[name]
    if cls is MistralToolParser:
        return MistralToolParser(tools, vocab, forced=forced)
    return cls(tools)


__all__ = [
    "TOOL_PARSERS",
    "CallDelta",
    "ExtractedToolCalls",
    "PartialCall",
    "StreamDelta",
    "StreamView",
    "ToolCall",
    "ToolCallStream",
    "ToolParser",
    "is_json",
    "join_call_deltas",
    "make_tool_call_id",
    "make_tool_parser",
]
