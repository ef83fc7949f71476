"""``llama3_json`` (and ``llama4_json``): JSON objects ``{"name": ..., "parameters": ...}``
(or ``"arguments"``), one after another or separated by ``;``, optionally after
``<|python_tag|>`` (Llama 3.1-3.3 and 4 with vLLM's JSON tool template).

A stream is read as vLLM 0.33's parser reads it, step by step: each step reads the text so far
with the ``partial_json_parser`` package (vLLM's dependency, so the partial readings are the
same) and compares it with the reading its previous step kept, so where the fragments are cut
depends on how the text arrived, as in vLLM."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import partial_json_parser
from partial_json_parser.core.options import Allow

from mmfront.serve.tool_parsers.base import (
    ExtractedToolCalls,
    PartialCall,
    StreamView,
    ToolCall,
    ToolParser,
    json_arguments,
    no_tool_calls,
)

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()
_SEPARATOR = "; "


class Llama3JsonToolParser(ToolParser):
    name = "llama3_json"
    structural_tag_model = "llama"
    start_markers = (PYTHON_TAG, "{")

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None) -> None:
        super().__init__(tools)
        self.steps = JsonCallSteps()

    def for_stream(self) -> Llama3JsonToolParser:
        return Llama3JsonToolParser(self.tools)

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

    def stream_view(self, text: str, final: bool) -> StreamView:
        """Content where the output does not open with a call (vLLM's stream reads JSON only
        there); else one of vLLM's steps per call (``final``: none, the last step's call gets
        what vLLM's chat server flushes at the end)."""
        opens_with_call = text.startswith((PYTHON_TAG, "{"))
        steps = self.steps
        touched = steps.last if final or not opens_with_call else steps.step(text)
        begun = max(len(steps.sent), max(steps.names, default=-1) + 1)
        sent = [*steps.sent, *[""] * (begun - len(steps.sent))]
        if final and touched is not None:
            sent[touched] += steps.unsent_arguments()
        calls = [PartialCall(steps.names.get(i), arguments or None) for i, arguments in enumerate(sent)]
        return StreamView("" if opens_with_call else text, calls, None if final else touched)


@dataclass
class JsonCallSteps:
    """vLLM 0.33's ``Llama3JsonToolParser`` stream state: the reading the last step kept, the
    call it is on, whether that call's name went out, and each call's arguments sent."""

    readings: list[Any] = field(default_factory=list)
    current: int = -1
    name_sent: bool = False
    names: dict[int, str] = field(default_factory=dict)
    sent: list[str] = field(default_factory=list)
    last: int | None = None
    """The call the last step sent a delta of (its name or a fragment, maybe empty)."""

    def step(self, text: str) -> int | None:
        """One step over the text so far: the call it sends a delta of, if any. A step whose
        reading fails sends nothing and keeps the state, as vLLM's parser does (it catches every
        exception of a step)."""
        try:
            self.last = self._step(text)
        except Exception:  # vLLM's parser skips the step on any error
            self.last = None
        return self.last

    def _step(self, text: str) -> int | None:
        flags = Allow.ALL if self.name_sent else Allow.ALL & ~Allow.STR  # a name goes out whole
        readings: list[Any] = []
        complete: list[bool] = []
        start = len(PYTHON_TAG) if text.startswith(PYTHON_TAG) else 0
        while start < len(text):
            try:
                obj, end = _partial_loads(text[start:], flags)
            except partial_json_parser.MalformedJSON:
                return None
            complete.append(_is_complete(text[start:start + end]))
            start += end + len(_SEPARATOR)
            if "parameters" in obj:
                if "arguments" in obj:
                    raise ValueError("the model wrote both parameters and arguments")
                obj["arguments"] = obj["parameters"]
            readings.append(obj)
        if not readings:
            return None
        current = readings[self.current]
        if len(readings) > self.current + 1:  # a new call: first what the last one's reading added
            touched = None
            arguments = current.get("arguments") if self.current >= 0 else None
            if arguments:
                self.sent[self.current] += json_arguments(arguments)[len(self.sent[self.current]):]
                touched = self.current
            self.current = len(readings) - 1
            self.name_sent = False
            self.sent.append("")
            return touched
        touched = None
        if not self.name_sent:
            name = current.get("name")
            if name:
                if not isinstance(name, str):
                    raise TypeError("a call's name is not a string")
                self.names[self.current] = name
                self.name_sent = True
                touched = self.current
        else:
            touched = self._arguments_step(current, readings, complete)
        self.readings = readings
        return touched

    def _arguments_step(self, current: Any, readings: list[Any], complete: list[bool]) -> int | None:
        """The current call's arguments: all that is unsent once its JSON is whole, else what
        this reading and the last one agree on (so a closing quote or brace the partial reading
        added waits)."""
        arguments = current.get("arguments")
        if not arguments:
            return None
        sent = len(self.sent[self.current])
        now = json_arguments(arguments)
        before = self.readings[self.current].get("arguments")
        if complete[self.current]:
            fragment = now[sent:]
        elif before:
            then = json_arguments(before)
            if now == then:
                return None
            fragment = _common_prefix(then, now)[sent:]
        else:
            return None
        self.sent[self.current] += fragment
        return self.current

    def unsent_arguments(self) -> str:
        """What vLLM's chat server appends to the last delta when the answer ends: the last
        kept reading's arguments beyond those sent."""
        if not self.readings or not isinstance(self.readings[-1], dict):
            return ""
        index = len(self.readings) - 1
        arguments = self.readings[index].get("arguments", {})
        expected = arguments if isinstance(arguments, str) else json_arguments(arguments)
        actual = self.sent[index] if index < len(self.sent) else ""
        return expected[len(actual):] if expected.startswith(actual) else ""


def _partial_loads(text: str, flags: Allow) -> tuple[Any, int]:
    """The JSON value ``text`` opens, read as far as written, and how far it reaches (the
    package reads no text after a whole value: the standard decoder does then)."""
    try:
        return partial_json_parser.loads(text, flags), len(text)
    except json.JSONDecodeError as e:
        if "Extra data" in e.msg:
            return _DECODER.raw_decode(text)
        raise


def _is_complete(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]
