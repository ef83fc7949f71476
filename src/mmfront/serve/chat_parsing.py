"""A chat answer's text read as vLLM's ``Parser`` reads it: reasoning split off
(``--reasoning-parser``), then tool calls read out of the content (``--enable-auto-tool-choice
--tool-call-parser``, or the JSON that ``tool_choice: "required"`` and a named tool constrain the
output to), whole or as a stream of deltas.

:class:`ChatParsing` is the server's (the parsers it was started with, plugins loaded);
:meth:`ChatParsing.for_request` checks a request against them (vLLM's 400s) and gives the
request's :class:`RequestParsing`, which adjusts its sampling parameters (special tokens kept for
the markers, the JSON schema of ``required`` and named tools) and reads each choice.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import msgspec

from mmfront.errors import ConfigError, ValidationError
from mmfront.serve.protocol import ChatCompletionRequest, named_tool, template_kwargs
from mmfront.serve.reasoning import REASONING_PARSERS, ReasoningParser, ReasoningStream
from mmfront.serve.settings import ServeSettings
from mmfront.serve.tool_parsers import (
    TOOL_PARSERS,
    CallDelta,
    StreamDelta,
    ToolCall,
    ToolCallStream,
    ToolParser,
    join_call_deltas,
    make_tool_parser,
)
from mmfront.serve.tool_parsers.forced_stream import ForcedCallStream
from mmfront.serve.tool_parsers.mistral import MistralToolParser
from mmfront.serve.tool_parsers.structural_tags import (
    ToolStrictLevel,
    enforce_strict_tool_calling,
    tool_calls_structural_tag,
)
from mmfront.wire import SamplingParams
from mmfront.wire.params import StructuredOutputsParams


@dataclass(frozen=True)
class ParsedMessage:
    """A whole answer's message fields."""

    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall]


@dataclass
class ParsedDelta:
    """What one stream step adds to a choice's message."""

    reasoning: str | None = None
    content: str | None = None
    tool_calls: list[CallDelta] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    @property
    def sends_chunk(self) -> bool:
        """Whether vLLM's stream sends a chunk for this step: one with something, or an empty
        delta (``"content": ""``) its parser answered with."""
        return bool(self) or self.content == ""

    def then(self, later: ParsedDelta) -> ParsedDelta:
        return ParsedDelta(_cat(self.reasoning, later.reasoning), _cat(self.content, later.content),
                           join_call_deltas(self.tool_calls, later.tool_calls))


def _cat(a: str | None, b: str | None) -> str | None:
    return None if a is None and b is None else (a or "") + (b or "")


def load_plugin(path: str, what: str) -> None:
    """Run a plugin file (``--tool-parser-plugin``, ``--reasoning-parser-plugin``), which
    registers its parsers in mmfront's tables."""
    file = Path(path)
    spec = importlib.util.spec_from_file_location(f"mmfront_plugin_{file.stem}", file)
    if not file.is_file() or spec is None or spec.loader is None:
        raise ConfigError(f"--{what}-plugin {path}: no such Python file.")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise ConfigError(f"--{what}-plugin {path} failed to load ({type(e).__name__}: {e}); a plugin registers "
                          "mmfront parsers, not vLLM's.") from e


class ChatParsing:
    """The server's parsers (vLLM's: a tool parser only with ``--enable-auto-tool-choice``)."""

    def __init__(self, settings: ServeSettings, tokenizer: Any) -> None:
        if settings.tool_parser_plugin:
            load_plugin(settings.tool_parser_plugin, "tool-parser")
        if settings.reasoning_parser_plugin:
            load_plugin(settings.reasoning_parser_plugin, "reasoning-parser")
        name = settings.tool_call_parser if settings.enable_auto_tool_choice else None
        if name is not None and name not in TOOL_PARSERS:
            raise ConfigError(f"invalid tool call parser: {name} (chose from {{ {','.join(TOOL_PARSERS)} }})")
        if settings.reasoning_parser and settings.reasoning_parser not in REASONING_PARSERS:
            raise ConfigError(f"invalid reasoning parser: {settings.reasoning_parser} (chose from "
                              f"{{ {','.join(REASONING_PARSERS)} }})")
        self.tool_parser = name
        self.reasoning_parser = settings.reasoning_parser or None
        self.exclude_tools_when_none = settings.exclude_tools_when_tool_choice_none
        self.tool_strict_level = (None if settings.tool_strict_level is None
                                  else ToolStrictLevel.from_name(settings.tool_strict_level))
        self.structural_tags = enforce_strict_tool_calling()
        self.reasoning_effort_map = settings.reasoning_effort_map
        self.tokenizer = tokenizer

    def token_id(self, token: str) -> int | None:
        """The id of a marker that is one token in the model's vocabulary."""
        found = self.tokenizer.convert_tokens_to_ids(token)
        return found if isinstance(found, int) and found != self.tokenizer.unk_token_id else None

    @cached_property
    def vocab(self) -> Mapping[str, int]:
        """The tokenizer's vocabulary, which tells Mistral's two call formats apart."""
        return dict(self.tokenizer.get_vocab())

    def for_request(self, request: ChatCompletionRequest) -> RequestParsing:
        """The request's parsing; a ``tool_choice`` the server cannot honour is refused (400)."""
        choice = request.tool_choice
        if self.tool_parser is None and choice not in (None, "none"):
            if choice == "auto":
                raise ValidationError('"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser '
                                      "to be set")
            described = f'function "{named_tool(request)}"' if isinstance(choice, msgspec.Struct) else f'"{choice}"'
            raise ValidationError(f"tool_choice={described} requires --tool-call-parser to be set")
        return RequestParsing(self, request)


class RequestParsing:
    """One request's reading of its choices."""

    def __init__(self, server: ChatParsing, request: ChatCompletionRequest) -> None:
        self.server = server
        self.request = request
        tools = [msgspec.to_builtins(t) for t in request.tools or []]
        kwargs = template_kwargs(request, server.reasoning_effort_map)
        self.reasoning_cls = REASONING_PARSERS[server.reasoning_parser] if server.reasoning_parser else None
        self.reasoning_kwargs = kwargs
        self.named = named_tool(request)
        self.required = request.tool_choice == "required"
        self.tools: ToolParser | None = None
        if server.tool_parser is not None:
            vocab = server.vocab if TOOL_PARSERS[server.tool_parser] is MistralToolParser else None
            self.tools = make_tool_parser(server.tool_parser, tools, vocab,
                                          forced=self.required or self.named is not None)
        self.tag_model = self.tools.structural_tag_model if self.tools is not None and server.structural_tags else None
        json_choices = self.tools is not None and self.tools.supports_required_and_named and self.tag_model is None
        self.constrained = json_choices and (self.required or self.named is not None)
        self.auto = self.tools is not None and (request.tool_choice in ("auto", None) or (
            not json_choices and (self.required or self.named is not None)))
        self.keeps_calls = self.required or self.named is not None or (
            self.tools is not None and request.tool_choice == "auto" and bool(request.tools))

    @property
    def active(self) -> bool:
        """Whether answers are read at all (else the text is the content, as it is)."""
        return self.tools is not None or self.reasoning_cls is not None

    def reasoning_tokens(self, token_ids: Sequence[int]) -> int | None:
        """How many of ``token_ids`` lie between reasoning markers (vLLM's count, reported as
        ``completion_tokens_details.reasoning_tokens`` whenever a reasoning parser runs)."""
        if self.reasoning_cls is None:
            return None
        start, end = self.server.token_id(self.reasoning_cls.start), self.server.token_id(self.reasoning_cls.end)
        count = depth = 0
        for token in token_ids:
            if token == start:
                depth += 1
            elif token == end:
                depth = max(depth - 1, 0)
            elif depth:
                count += 1
        return count

    def reasoning_parser(self) -> ReasoningParser | None:
        return self.reasoning_cls(self.reasoning_kwargs) if self.reasoning_cls is not None else None

    def adjust(self, params: SamplingParams) -> SamplingParams:
        """The parser's request adjustments: keep special tokens where markers are special, and
        constrain the calls as vLLM does: with the format's structural tag where it has one
        (:mod:`mmfront.serve.tool_parsers.structural_tags`), else ``required`` and named tools to
        the JSON that is read back."""
        changes: dict[str, Any] = {}
        if self.tools is not None and self.tools.keeps_special_tokens and self.request.tools and (
                self.request.tool_choice != "none"):
            changes["skip_special_tokens"] = False
        tag = self._structural_tag(params.structured_outputs)
        forced = self._forced_calls_schema()
        if tag is not None:
            changes["structured_outputs"] = StructuredOutputsParams(structural_tag=tag)
        elif self.constrained:
            changes["structured_outputs"] = StructuredOutputsParams(json=self._tool_schema())
        elif forced is not None:
            changes["structured_outputs"] = StructuredOutputsParams(json=forced)
        return msgspec.structs.replace(params, **changes) if changes else params

    def _forced_calls_schema(self) -> dict[str, Any] | None:
        """The schema the tool parser itself sends for ``required`` and named tools (Mistral's),
        unless the request brings ``structured_outputs`` or a structural-tag ``response_format``
        (vLLM replaces another ``response_format`` with it)."""
        request = self.request
        if (self.tools is None or not request.tools or not (self.required or self.named is not None)
                or request.structured_outputs is not None
                or (request.response_format is not None and request.response_format.type == "structural_tag")):
            return None
        return self.tools.forced_calls_schema(self.named)

    def _structural_tag(self, structured_outputs: StructuredOutputsParams | None) -> str | None:
        if self.tag_model is None or self.tools is None or not self.request.tools:
            return None
        level = self.server.tool_strict_level
        choice = self.request.tool_choice if self.named is None else {"type": "function",
                                                                       "function": {"name": self.named}}
        return tool_calls_structural_tag(
            self.tag_model, [_without_nulls(msgspec.to_builtins(t)) for t in self.request.tools], choice,
            parallel_tool_calls=self.request.parallel_tool_calls,
            strict_level=self.tools.default_tool_strict_level if level is None else level,
            structured_outputs=structured_outputs)

    def _tool_schema(self) -> dict[str, Any]:
        """vLLM's ``get_json_schema_from_tools``: a named tool's parameters, or an array of
        ``{"name", "parameters"}`` objects, one of each tool."""
        tools = self.request.tools or []
        if self.named is not None:
            params = next(t.function.parameters for t in tools if t.function.name == self.named)
            return params or {"type": "object", "properties": {}}
        defs: dict[str, Any] = {}
        items = []
        for tool in tools:
            params = dict(tool.function.parameters) if tool.function.parameters is not None else None
            if params is not None:
                found = params.pop("$defs", {})
                if not isinstance(found, dict):
                    raise ValidationError(f"`$defs` in the parameters of tool '{tool.function.name}' must be an "
                                          f"object, got {type(found).__name__}.", parameter="tools")
                for name, definition in found.items():
                    if name in defs and defs[name] != definition:
                        raise ValidationError(f"Tool definition '{name}' has multiple schemas, which is not "
                                              "supported.", parameter="tools")
                    defs[name] = definition
            items.append({"properties": {"name": {"type": "string", "enum": [tool.function.name]},
                                         "parameters": params or {"type": "object", "properties": {}}},
                          "required": ["name", "parameters"]})
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": items}}
        if self.request.parallel_tool_calls is False:
            schema["maxItems"] = 1
        if defs:
            schema["$defs"] = defs
        return schema

    # --- whole answers --------------------------------------------------------------------------

    def whole(self, text: str) -> ParsedMessage:
        reasoning: str | None = None
        content: str | None = text
        parser = self.reasoning_parser()
        if parser is not None:
            reasoning, content = parser.extract(text)
        if not self.request.include_reasoning:
            reasoning = None
        calls, content = self._calls(content)
        if not self.keeps_calls:
            calls = []
        elif self.required or self.named is not None:
            content = content or ""
        if self.request.parallel_tool_calls is False:
            calls = calls[:1]
        return ParsedMessage(reasoning, content, calls)

    def _calls(self, content: str | None) -> tuple[list[ToolCall], str | None]:
        if self.tools is None:
            return [], content
        if self.request.tool_choice == "none":
            if self.tools.engine_based:
                return [], self.tools.extract(content or "").content
            return [], content
        blank = content is None or not content.strip()
        if self.constrained and self.named is not None:
            return ([], None) if blank else ([ToolCall(self.named, content or "")], None)
        if self.constrained:
            return _required_calls(content or ""), None
        if not self.auto:
            return [], content
        result = self.tools.extract(content or "")
        if result.tools_called:
            text = result.content
            return result.tool_calls, None if text is not None and not text.strip() else text
        if (self.required or self.named is not None) and blank:
            return [], None
        if self.tools.engine_based:
            return [], result.content or None
        return [], content

    def finish_reason(self, engine_reason: str | None, calls_made: bool) -> str | None:
        """``tool_calls`` when calls were made and the model stopped on its own, unless a named
        tool was forced (OpenAI says ``stop`` then); a ``length`` cut stays visible."""
        if engine_reason is None:
            return None
        if calls_made and engine_reason == "stop" and self.named is None:
            return "tool_calls"
        return engine_reason

    # --- streams --------------------------------------------------------------------------------

    def stream(self, prompt_token_ids: Sequence[int]) -> ChoiceStream:
        return ChoiceStream(self, self._reasoning_ended(prompt_token_ids))

    def _reasoning_ended(self, prompt_token_ids: Sequence[int]) -> bool:
        """vLLM's stream reads no reasoning when the prompt's last marker closed it (a template
        that wrote ``<think></think>`` for thinking turned off)."""
        if self.reasoning_cls is None:
            return True
        start, end = self.server.token_id(self.reasoning_cls.start), self.server.token_id(self.reasoning_cls.end)
        for token in reversed(prompt_token_ids):
            if token == start:
                return False
            if token == end:
                return True
        return False


def _without_nulls(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as vLLM dumps it for xgrammar (``exclude_none``)."""
    function = {k: v for k, v in tool["function"].items() if v is not None}
    return {**{k: v for k, v in tool.items() if v is not None}, "function": function}


def _required_calls(text: str) -> list[ToolCall]:
    """The JSON array ``tool_choice: "required"`` constrains the output to; what does not read
    as one gives no calls."""
    try:
        items = json.loads(text)
    except ValueError:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("name"), str)
                                              for i in items):
        return []
    return [ToolCall(i["name"], json.dumps(i.get("parameters"), ensure_ascii=False)) for i in items]


class ChoiceStream:
    """One choice's stream: reasoning first, then the content through the tool parser, or the
    constrained JSON of ``required`` and named tools as vLLM streams it
    (:mod:`mmfront.serve.tool_parsers.forced_stream`)."""

    def __init__(self, parsing: RequestParsing, reasoning_ended: bool) -> None:
        self.parsing = parsing
        parser = None if reasoning_ended else parsing.reasoning_parser()
        self.reasoning = ReasoningStream(parser) if parser is not None else None
        reads_calls = parsing.tools is not None and parsing.auto and parsing.keeps_calls
        self.tools = ToolCallStream(parsing.tools) if reads_calls and parsing.tools is not None else None
        self.forced = ForcedCallStream(parsing.named) if parsing.constrained else None
        self.reading_calls = self.reasoning is None
        self.calls_made = False

    def feed(self, text: str) -> ParsedDelta:
        return self._step(self.reasoning.feed(text) if self.reasoning is not None else None, text, final=False)

    def finish(self) -> ParsedDelta:
        return self._step(self.reasoning.finish() if self.reasoning is not None else None, "", final=True)

    def _step(self, split: Any, text: str, *, final: bool) -> ParsedDelta:
        out = ParsedDelta()
        content: str | None = text
        if split is not None:
            out.reasoning = split.reasoning if self.parsing.request.include_reasoning else None
            content = split.content
        if self.forced is not None:
            # vLLM's stream reads the JSON from the step the reasoning ends in; the end adds only
            # what the reasoning parser held back
            self.reading_calls = self.reading_calls or content is not None
            if self.reading_calls and (content or not final):
                out.tool_calls = [c for c in self.forced.feed(content or "")
                                  if self.parsing.request.parallel_tool_calls is not False or c.index == 0]
        elif self.tools is not None:
            # the end is no token of its own: only text the reasoning parser held back is fed
            delta = self.tools.feed(content or "") if content or not final else StreamDelta()
            if final:
                rest = self.tools.finish()
                delta.content = _cat(delta.content, rest.content)
                delta.tool_calls = join_call_deltas(delta.tool_calls, rest.tool_calls)
            out.content = delta.content
            out.tool_calls = [c for c in delta.tool_calls
                              if self.parsing.request.parallel_tool_calls is not False or c.index == 0]
        else:
            out.content = content or None
        if out.content == "" and not self.parsing.request.include_reasoning:
            out.content = None  # vLLM drops a delta left empty once the reasoning is taken out
        self.calls_made = self.calls_made or bool(out.tool_calls)
        return out


__all__ = ["ChatParsing", "ChoiceStream", "ParsedDelta", "ParsedMessage", "RequestParsing", "load_plugin"]
