"""What every tool-call parser shares: the parsed call, the result of parsing a whole output,
and the streaming driver that turns a parser of whole outputs into deltas.

A parser (``--tool-call-parser NAME``) knows one model family's format and reads a finished
output (:meth:`ToolParser.extract`). A parser that reads a stream's text so far
(:meth:`ToolParser.stream_view`: its content and the calls begun, each call's name once whole
and its arguments so far) streams as vLLM's does: a call's id, type and name in one delta as
soon as the name is whole, then its arguments in fragments as they are written, and with the
last token what it held back for what might follow, so an answer cut inside a call has sent the
call so far. The others stream the text before the tool section as content and send each call
whole once its end marker has arrived, and read what is left at the end, so the stream
assembles to the non-streamed answer.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mmfront.serve.tool_parsers.structural_tags import ToolStrictLevel


def make_tool_call_id() -> str:
    """vLLM's id for a call: ``chatcmpl-tool-`` and 32 hex digits."""
    return f"chatcmpl-tool-{secrets.token_hex(16)}"


@dataclass(frozen=True)
class ToolCall:
    """One call: the function's name and its arguments as a JSON string (OpenAI's shape)."""

    name: str
    arguments: str
    id: str = field(default_factory=make_tool_call_id)
    type: str = "function"


@dataclass(frozen=True)
class ExtractedToolCalls:
    """A whole output read by a parser: the calls, and the text that is the answer's content."""

    tools_called: bool
    tool_calls: list[ToolCall]
    content: str | None


def no_tool_calls(text: str) -> ExtractedToolCalls:
    return ExtractedToolCalls(False, [], text)


def json_arguments(value: Any) -> str:
    """Arguments as vLLM serializes them (``json.dumps``, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=False)


def partial_overlap(text: str, marker: str) -> int:
    """How many last characters of ``text`` could be the start of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class ToolParser:
    """One format of tool calls. Subclass it for a format mmfront lacks and register it in
    :data:`mmfront.serve.tool_parsers.TOOL_PARSERS`."""

    name: ClassVar[str]
    start_markers: ClassVar[tuple[str, ...]] = ()
    """Text that opens the tool section; content streams up to the first of them."""
    call_end: ClassVar[str | None] = None
    """Text that closes one call, so a stream can send each call as soon as it is complete."""
    supports_required_and_named: ClassVar[bool] = True
    """Whether ``tool_choice: "required"`` and named tools constrain the output to JSON (else
    they are read in the format's own syntax, as ``auto``); a format with a structural tag is
    read in its own syntax unless ``VLLM_ENFORCE_STRICT_TOOL_CALLING`` is off."""
    structural_tag_model: ClassVar[str | None] = None
    """The structural-tag format that constrains this format's calls (for ``required``, named
    tools, ``strict`` tools, ``parallel_tool_calls: false`` and ``--tool-strict-level``), by
    vLLM's names (:mod:`mmfront.serve.tool_parsers.structural_tags`)."""
    default_tool_strict_level: ClassVar[ToolStrictLevel] = ToolStrictLevel.AUTO
    """The strict level where ``--tool-strict-level`` is not given (vLLM's per-parser default)."""
    engine_based: ClassVar[bool] = False
    """vLLM reads this format with its grammar engine, which also answers ``tool_choice: "none"``
    with the content its reading leaves."""
    name_with_arguments: ClassVar[bool] = False
    """Whether vLLM's stream sends a call's name and the first of its arguments in one tool-call
    delta (its parser engine does), rather than as two deltas of the same index."""
    keeps_special_tokens: ClassVar[bool] = False
    """Whether the request's output keeps special tokens (the markers are special in the
    family's tokenizers; vLLM's parser sets ``skip_special_tokens`` false then)."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.tools = list(tools or [])

    def extract(self, text: str) -> ExtractedToolCalls:
        raise NotImplementedError

    def partial_calls(self, text: str) -> list[PartialCall] | None:
        """The calls a stream of ``text`` has begun, as vLLM's stream parser reads them: each
        call's name once it is whole (else the list stops there) and its arguments' text so far,
        which only grows. ``None``: this format streams each call whole."""
        return None

    def forced_calls_schema(self, named: str | None) -> dict[str, Any] | None:
        """The JSON schema this format's vLLM parser itself constrains ``tool_choice:
        "required"`` (``named``: ``None``) or a named tool to, where it does (else ``None``)."""
        return None

    def answers_step(self, before: str, now: str) -> bool:
        """Whether vLLM's parser answers a stream step that took the text from ``before`` to
        ``now`` with a delta even where it sends nothing (``"content": ""``, for a marker it
        consumed): vLLM's server sends that as a chunk of its own."""
        return False

    def new_call_id(self) -> str:
        """The id of a call this format's stream begins."""
        return make_tool_call_id()

    def for_stream(self) -> ToolParser:
        """The parser one stream reads with: this one, whose reading of a stream is a function
        of the text so far; a format whose vLLM parser keeps state from step to step returns a
        fresh parser that keeps it for one stream (a request's choices stream apart)."""
        return self

    def stream_view(self, text: str, final: bool) -> StreamView | None:
        """What a stream of ``text`` has shown so far: its content and the calls it has begun
        (both only grow as ``text`` does); ``final``: the answer has ended, so nothing is held
        back for what may follow. By default the content before the tool section and
        :meth:`partial_calls`; ``None``: this format streams each call whole."""
        calls = self.partial_calls(text)
        return None if calls is None else StreamView(text[:self.content_end(text)], calls)

    def streamed_content(self, text: str, result: ExtractedToolCalls) -> str:
        """All the content a stream of ``text`` sends (vLLM's streams may send more than the
        whole answer's ``content``); what a stream holds after its tool section opened and
        does not read as calls is never sent."""
        return result.content or "" if result.tools_called else ""

    def content_end(self, text: str) -> int:
        """How far ``text`` is surely content, in a stream: up to the first start marker, or
        short of a tail that may grow into one."""
        found = [i for i in (text.find(m) for m in self.start_markers) if i != -1]
        if found:
            return min(found)
        return len(text) - max((partial_overlap(text, m) for m in self.start_markers), default=0)

    def function_schema(self, name: str) -> Mapping[str, Any] | None:
        """The ``parameters`` schema of the request's tool ``name``."""
        for tool in self.tools:
            function = tool.get("function") if isinstance(tool, Mapping) else None
            if isinstance(function, Mapping) and function.get("name") == name:
                parameters = function.get("parameters")
                return parameters if isinstance(parameters, Mapping) else None
        return None


@dataclass(frozen=True)
class PartialCall:
    """A call as far as a stream has written it: the name (``None`` until it is whole) and the
    arguments' text so far (``None`` until they begin)."""

    name: str | None
    arguments: str | None = None


@dataclass(frozen=True)
class StreamView:
    """A stream's reading of the text so far (:meth:`ToolParser.stream_view`)."""

    content: str
    calls: list[PartialCall]
    fragment_of: int | None = None
    """A call this step sends a fragment of though its arguments have not grown: vLLM's parser
    then sends an empty one (a chunk with ``"arguments": ""``)."""


@dataclass
class CallDelta:
    """One tool-call delta of a stream (vLLM's ``DeltaToolCall``): a call's first delta carries
    its ``id``, ``type`` and ``name``; the others (same ``index``) fragments of its arguments."""

    index: int
    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: str | None = None

    @classmethod
    def whole(cls, index: int, call: ToolCall) -> CallDelta:
        return cls(index, call.id, call.type, call.name, call.arguments)


def join_call_deltas(first: list[CallDelta], then: list[CallDelta]) -> list[CallDelta]:
    """Two steps' tool-call deltas sent as one (the last token's and what the stream's end
    flushed): a fragment of the call the first ended with joins that call's last delta, as
    vLLM appends what its parser held back to the last token's delta."""
    if first and then and then[0].id is None and then[0].index == first[-1].index:
        last = first[-1]
        joined = CallDelta(last.index, last.id, last.type, last.name, (last.arguments or "") + (then[0].arguments or ""))
        return [*first[:-1], joined, *then[1:]]
    return [*first, *then]


@dataclass
class StreamDelta:
    """What one step of a stream adds: content (``""``: an empty delta vLLM sends as a chunk),
    and tool-call deltas."""

    content: str | None = None
    tool_calls: list[CallDelta] = field(default_factory=list)


class ToolCallStream:
    """A parser over a stream of text deltas (see the module's docstring)."""

    def __init__(self, parser: ToolParser) -> None:
        self.parser = parser.for_stream()
        self.text = ""
        self.sent_content = 0
        self.sent_calls = 0
        self.sent_arguments: dict[int, str] = {}
        self.read_upto = 0

    @property
    def tools_called(self) -> bool:
        return self.sent_calls > 0 or bool(self.sent_arguments)

    def feed(self, delta: str) -> StreamDelta:
        out = self._feed(delta)
        if out.content is None and not out.tool_calls and self.parser.answers_step(self.text[:-len(delta) or None],
                                                                                   self.text):
            out.content = ""
        return out

    def _feed(self, delta: str) -> StreamDelta:
        self.text += delta
        out = StreamDelta()
        view = self.parser.stream_view(self.text, final=False)
        if view is not None:
            self._add_view(view, out)
            return out
        end = self.parser.content_end(self.text)
        if end > self.sent_content:
            out.content = self.text[self.sent_content:end]
            self.sent_content = end
        marker = self.parser.call_end
        if marker is not None and end < len(self.text) and marker in self.text[-len(delta) - len(marker):]:
            closed = self.text.rfind(marker) + len(marker)  # a call closed in this delta: read the calls so far
            if closed > self.read_upto:
                self.read_upto = closed
                self._add_calls(self.parser.extract(self.text[:closed]), out)
        return out

    def finish(self) -> StreamDelta:
        """The rest, once the stream has ended: what a fragment-streaming parser held back for
        what might follow, or the calls of a format that streams them whole, read from the whole
        output."""
        out = StreamDelta()
        view = self.parser.stream_view(self.text, final=True)
        if view is not None:
            self._add_view(view, out)
            return out
        if self.parser.content_end(self.text) >= len(self.text):
            return out
        result = self.parser.extract(self.text)
        self._add_calls(result, out)
        content = self.parser.streamed_content(self.text, result)
        if content.startswith(self.text[:self.sent_content]) and len(content) > self.sent_content:
            out.content = content[self.sent_content:]
        self.sent_content = len(self.text)
        return out

    def _add_view(self, view: StreamView, out: StreamDelta) -> None:
        if len(view.content) > self.sent_content:
            out.content = view.content[self.sent_content:]
            self.sent_content = len(view.content)
        self._add_fragments(view.calls, out, view.fragment_of)

    def _add_fragments(self, calls: list[PartialCall], out: StreamDelta, fragment_of: int | None) -> None:
        """vLLM's diffing: a new call's id, type and name, then the arguments' text it has not
        sent (in the name's delta where the format's vLLM parser sends them together). A call
        without a name is not begun, unless the view has arguments for it: vLLM's llama3_json
        stream, given several calls in one step, may skip a call's name and send its arguments."""
        for index, call in enumerate(calls):
            begun = index in self.sent_arguments
            named = not begun and call.name is not None
            if not begun and not named and call.arguments is None:
                continue
            sent = self.sent_arguments.get(index, "")
            fragment = None
            if call.arguments is not None and len(call.arguments) > len(sent):
                fragment = call.arguments[len(sent):]
            elif index == fragment_of and not named:
                fragment = ""
            self.sent_arguments[index] = sent + (fragment or "")
            if named:
                self.sent_calls += 1
                together = self.parser.name_with_arguments
                out.tool_calls.append(CallDelta(index, self.parser.new_call_id(), "function", call.name,
                                                fragment if together else None))
                if together:
                    continue
            if fragment is not None:
                out.tool_calls.append(CallDelta(index, arguments=fragment))

    def _add_calls(self, result: ExtractedToolCalls, out: StreamDelta) -> None:
        if result.tools_called and len(result.tool_calls) > self.sent_calls:
            for index in range(self.sent_calls, len(result.tool_calls)):
                out.tool_calls.append(CallDelta.whole(index, result.tool_calls[index]))
            self.sent_calls = len(result.tool_calls)


def is_json(text: str) -> bool:
    """Whether ``text`` is one whole JSON value (a call's arguments complete, not cut short)."""
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


__all__ = ["CallDelta", "ExtractedToolCalls", "PartialCall", "StreamDelta", "StreamView", "ToolCall", "ToolCallStream",
           "ToolParser", "is_json", "join_call_deltas", "json_arguments", "make_tool_call_id", "no_tool_calls",
           "partial_overlap"]
