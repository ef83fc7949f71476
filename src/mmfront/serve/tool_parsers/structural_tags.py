"""The xgrammar structural tag that constrains a request's tool calls, built as vLLM 0.33's
``Parser._apply_structural_tag`` builds it (``vllm/parser/abstract_parser.py`` and
``vllm/tool_parsers/structural_tag_registry.py``), so that the engine core compiles the same
constraint from either server.

A parser names its format (:attr:`ToolParser.structural_tag_model`): xgrammar's own templates
(``llama``, ``deepseek_r1``, ``qwen_3_coder``, ...) or vLLM's (``hermes``). The tag applies to
``tool_choice: "required"`` and named tools, to ``parallel_tool_calls: false`` (which caps the
calls at one), and to ``auto`` when a tool is ``strict`` or ``--tool-strict-level`` asks for it;
``auto`` with ``response_format``/``structured_outputs`` then allows either the calls or the
output format.
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from mmfront.errors import ConfigError, ValidationError
from mmfront.serve import structured
from mmfront.serve.settings import ToolStrictLevelName
from mmfront.wire.params import StructuredOutputsParams

if TYPE_CHECKING:
    from xgrammar import StructuralTag
    from xgrammar.structural_tag import Format

class ToolStrictLevel(enum.IntEnum):
    """How much of a call the structural tag pins (vLLM's ``ToolStrictLevel``). ``AUTO``: the calls
    as ``tool_choice`` asks, each tool's arguments only when it is ``strict``; ``FUNCTION``: the
    call envelope for every request with tools; ``PARAMETER``: every tool's arguments as if it were
    ``strict``."""

    AUTO = 0
    FUNCTION = 1
    PARAMETER = 2

    @classmethod
    def from_name(cls, name: ToolStrictLevelName) -> ToolStrictLevel:
        try:
            return cls[name.strip().upper()]
        except KeyError:
            expected = ", ".join(level.name.lower() for level in cls)
            raise ConfigError(f"Unknown tool strict level {name!r}; expected one of {expected}.") from None


XGRAMMAR_MODELS = frozenset({"llama", "kimi", "deepseek_r1", "deepseek_v3_1", "qwen_3_5", "qwen_3_coder", "mimo",
                             "qwen_3", "deepseek_v3_2", "deepseek_v4", "deepseek_v4_1"})
"""The formats xgrammar builds itself (vLLM's ``XGRAMMAR_BUILTIN_STRUCTURAL_TAG_MODELS``)."""


def enforce_strict_tool_calling() -> bool:
    """vLLM's ``VLLM_ENFORCE_STRICT_TOOL_CALLING`` (default on): off, no structural tags are sent and
    ``required``/named tools fall back to the JSON-schema constraint."""
    return os.environ.get("VLLM_ENFORCE_STRICT_TOOL_CALLING", "True").lower() in ("true", "1")


def tool_calls_structural_tag(model: str, tools: Sequence[Mapping[str, Any]], tool_choice: Any, *,
                              parallel_tool_calls: bool | None, strict_level: ToolStrictLevel,
                              structured_outputs: StructuredOutputsParams | None) -> str | None:
    """The ``structural_tag`` (JSON text) vLLM sends for these tool fields, or ``None`` when it
    sends none (and the request's own constraint, if any, stands). ``tools``: the request's, as
    JSON; ``tool_choice``: ``"auto"``, ``"required"`` or ``{"type": "function", "function":
    {"name": ...}}``."""
    if not tools or (tool_choice not in ("auto", "required") and not isinstance(tool_choice, Mapping)):
        return None
    is_auto = tool_choice == "auto"
    single_call = parallel_tool_calls is False
    if single_call and not (is_auto and structured_outputs is not None):
        strict_level = max(strict_level, ToolStrictLevel.FUNCTION)  # capping the calls needs their envelope
    pinned = _resolve_strictness(tools, tool_choice, strict_level)
    if pinned is None:
        return None
    output_format = None
    if is_auto and structured_outputs is not None:
        if not _xgrammar_supports(structured_outputs):
            return None
        output_format = _output_format(structured_outputs)
        if output_format is not None:
            tool_choice = "required"  # "auto" would allow any text, which the output format must not
    tag = _model_tag(model, pinned, tool_choice)
    if single_call:
        _limit_to_single_call(tag)
    if output_format is not None:
        from xgrammar import StructuralTag
        from xgrammar.structural_tag import OrFormat

        tag = StructuralTag(format=OrFormat(elements=[tag.format, output_format]))
    return json.dumps(tag.model_dump())


def _resolve_strictness(tools: Sequence[Mapping[str, Any]], tool_choice: Any,
                        strict_level: ToolStrictLevel) -> list[dict[str, Any]] | None:
    """Each tool with ``strict`` pinned, or ``None`` where ``auto`` needs no tag (vLLM's
    ``resolve_tool_strictness``)."""
    def strict(tool: Mapping[str, Any]) -> bool:
        return tool["function"].get("strict") is True

    if tool_choice == "auto" and strict_level == ToolStrictLevel.AUTO and not any(strict(t) for t in tools):
        return None
    return [{**tool, "function": {**tool["function"], "strict": strict_level >= ToolStrictLevel.PARAMETER or strict(tool)}}
            for tool in tools]


def _model_tag(model: str, tools: list[Any], tool_choice: Any) -> StructuralTag:
    import xgrammar

    if model == "hermes":
        function_tools, _, simplified = xgrammar.normalize_tool_choice(tools, tool_choice)
        return _hermes_tag(function_tools, simplified)
    if model not in XGRAMMAR_MODELS:
        raise ConfigError(f"Unknown structural tag format {model!r}: use one of "
                          f"{', '.join(sorted({*XGRAMMAR_MODELS, 'hermes'}))}.")
    return xgrammar.get_model_structural_tag(model=model, tools=tools, tool_choice=tool_choice, reasoning=False)


def _hermes_tag(tools: list[Any], tool_choice: str) -> StructuralTag:
    """vLLM's ``get_hermes_structural_tag``: ``<tool_call>{"name": "NAME", "arguments": ...}
    </tool_call>``, with or without the newlines inside the tags."""
    from xgrammar import StructuralTag
    from xgrammar.structural_tag import (
        AnyTextFormat,
        JSONSchemaFormat,
        TagFormat,
        TagsWithSeparatorFormat,
        TriggeredTagsFormat,
    )

    start, end = "<tool_call>", "</tool_call>"
    tags = [TagFormat(begin=begin + tool.function.name + '", "arguments": ',
                      content=JSONSchemaFormat(json_schema=_parameters(tool.function)), end=close)
            for tool in tools for begin, close in ((start + '\n{"name": "', "}\n" + end), (start + '{"name": "', "}" + end))]
    suffix: Any
    if tool_choice == "auto":
        suffix = TriggeredTagsFormat(triggers=[start], tags=tags) if tags else AnyTextFormat()
    else:
        suffix = TagsWithSeparatorFormat(tags=tags, separator="", at_least_one=True,
                                         stop_after_first=tool_choice == "forced")
    return StructuralTag(format=suffix)


def _parameters(function: Any) -> Any:
    """A tool's arguments schema in the tag: any JSON for a tool that is not strict."""
    if getattr(function, "strict", None) is False:
        return True
    return function.parameters if function.parameters is not None else True


def _limit_to_single_call(tag: StructuralTag) -> None:
    """Stop every list of calls after its first (vLLM's ``limit_to_single_tool_call``)."""
    from pydantic import BaseModel
    from xgrammar.structural_tag import TagsWithSeparatorFormat, TokenTriggeredTagsFormat, TriggeredTagsFormat

    def visit(node: Any) -> None:
        if isinstance(node, BaseModel):
            if isinstance(node, (TriggeredTagsFormat, TokenTriggeredTagsFormat, TagsWithSeparatorFormat)):
                node.stop_after_first = True
            for name in type(node).model_fields:
                visit(getattr(node, name))
        elif isinstance(node, (list, tuple)):
            for item in node:
                visit(item)

    visit(tag.format)


def _xgrammar_supports(params: StructuredOutputsParams) -> bool:
    try:
        structured.validate_xgrammar(msgspec.structs.replace(params))
    except ValidationError:
        return False
    return True


def _output_format(params: StructuredOutputsParams) -> Format | None:
    """The request's own constraint as a structural-tag format (vLLM's
    ``structured_outputs_to_format``)."""
    from xgrammar import Grammar, StructuralTag
    from xgrammar.structural_tag import (
        ConstStringFormat,
        GrammarFormat,
        JSONSchemaFormat,
        OrFormat,
        RegexFormat,
        TagFormat,
        TriggeredTagsFormat,
    )

    if params.json_object:
        return JSONSchemaFormat(json_schema={"type": "object"})
    if params.json is not None:
        schema = params.json
        if isinstance(schema, str):
            structured.check_json_nesting(schema)
            schema = json.loads(schema)
        return JSONSchemaFormat(json_schema=schema)
    if params.regex is not None:
        return RegexFormat(pattern=params.regex)
    if params.choice is not None:
        return OrFormat(elements=[ConstStringFormat(value=choice) for choice in params.choice])
    if params.grammar is not None:
        grammar = params.grammar
        if structured.grammar_is_likely_lark(grammar):
            try:
                grammar = str(Grammar.from_lark(grammar))
            except Exception as e:
                raise ValidationError("Invalid grammar specification.") from e
        return GrammarFormat(grammar=grammar)
    if params.structural_tag is not None:
        structured.check_json_nesting(params.structural_tag, structural_tag=True)
        payload = json.loads(params.structural_tag)
        if "structures" in payload:  # the legacy form
            return TriggeredTagsFormat(triggers=payload["triggers"], tags=[
                TagFormat(begin=s["begin"], content=JSONSchemaFormat(json_schema=s["schema"]), end=s["end"])
                for s in payload["structures"]])
        return StructuralTag.model_validate(payload).format
    return None


__all__ = ["XGRAMMAR_MODELS", "ToolStrictLevel", "enforce_strict_tool_calling",
           "tool_calls_structural_tag"]
