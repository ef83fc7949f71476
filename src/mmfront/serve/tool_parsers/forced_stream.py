"""The JSON that ``tool_choice: "required"`` and a named tool constrain an answer to, streamed as
vLLM's chat server streams it for every parser it reads such answers with as JSON (those without
a structural tag in force, e.g. ``pythonic``; mistral reads them in its own way).

A named tool's answer is the call's arguments: each step of the stream sends its text as a
fragment of call 0 (even an empty one), the first also the call's id and name. ``required``'s
answer is an array of ``{"name": ..., "parameters": ...}``: a call begins once its name is a
whole JSON string and its ``parameters`` value has begun, with the arguments written so far; then
each step sends the text its ``parameters`` value has grown by. Where one element sits in the
text never changes as the text grows, so a step needs only the text before it and after it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum, auto

from mmfront.serve.tool_parsers.base import CallDelta, make_tool_call_id


@dataclass
class RequiredCallSpan:
    """Where one element of the ``required`` array sits: its name once its string is closed (and
    reads as JSON), just past that string, and the span of its ``parameters`` value (``end``
    ``None`` while the value is being written)."""

    name: str | None = None
    name_end: int | None = None
    args_start: int | None = None
    args_end: int | None = None

    @property
    def begun(self) -> bool:
        return self.name is not None and self.args_start is not None

    def begun_within(self, length: int) -> bool:
        """Whether the text's first ``length`` characters already began this call."""
        return (self.begun and self.name_end is not None and self.name_end <= length
                and self.args_start is not None and self.args_start < length)


class _Expect(Enum):
    """Where an element object's reading stands (only the element's own level is read)."""

    KEY = auto()
    COLON = auto()
    VALUE = auto()
    STRING = auto()
    NESTED = auto()
    SCALAR = auto()
    NEXT = auto()


class _ElementReader:
    """One element object of the array: its keys, and the values of ``name`` and ``parameters``."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.span = RequiredCallSpan()
        self.expect = _Expect.KEY
        self.key: str | None = None
        self.value_start = 0

    def begin_value(self, at: int, kind: _Expect) -> None:
        self.value_start = at
        if self.key == "parameters":
            self.span.args_start = at
        self.expect = kind

    def end_value(self, at: int) -> None:
        if self.key == "parameters":
            self.span.args_end = at
        elif self.key == "name" and self.expect is _Expect.STRING:
            try:
                self.span.name = json.loads(self.text[self.value_start:at])
                self.span.name_end = at
            except ValueError:  # never a name: the whole answer's reading refuses the array too
                self.span.name = None
        self.expect = _Expect.NEXT


def required_call_spans(text: str) -> list[RequiredCallSpan]:
    """The elements of a ``required`` array written so far, in order; text after the array (or
    text that does not open one) gives no more. Strings and nesting are followed, so nothing
    inside a value is read as the element's structure."""
    spans: list[RequiredCallSpan] = []
    depth = 0  # open brackets and braces; an element's keys sit at depth 2
    string_from: int | None = None
    escaped = False
    element: _ElementReader | None = None
    for i, ch in enumerate(text):
        own_level = depth == 2 and element is not None
        if string_from is not None:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                opened, string_from = string_from, None
                if own_level and element is not None:
                    if element.expect is _Expect.KEY:
                        element.key = text[opened + 1:i]
                        element.expect = _Expect.COLON
                    elif element.expect is _Expect.STRING:
                        element.end_value(i + 1)
        elif ch == '"':
            string_from = i
            if own_level and element is not None and element.expect is _Expect.VALUE:
                element.begin_value(i, _Expect.STRING)
        elif ch in "{[":
            if (depth == 0 and ch != "[") or (depth == 1 and ch != "{"):
                break
            if depth == 1:
                element = _ElementReader(text)
                spans.append(element.span)
            elif own_level and element is not None and element.expect is _Expect.VALUE:
                element.begin_value(i, _Expect.NESTED)
            depth += 1
        elif ch in "}]":
            if own_level and element is not None and element.expect is _Expect.SCALAR:
                element.end_value(i)
            depth -= 1
            if depth <= 0:
                break
            if depth == 1:
                element = None
            elif depth == 2 and element is not None and element.expect is _Expect.NESTED:
                element.end_value(i + 1)
        elif own_level and element is not None:
            if ch == ":":
                if element.expect is _Expect.COLON:
                    element.expect = _Expect.VALUE
            elif ch == ",":
                if element.expect is _Expect.SCALAR:
                    element.end_value(i)
                element.expect, element.key = _Expect.KEY, None
            elif ch.isspace():
                if element.expect is _Expect.SCALAR:
                    element.end_value(i)
            elif element.expect is _Expect.VALUE:
                element.begin_value(i, _Expect.SCALAR)
    return spans


def required_call_deltas(before: str, now: str) -> list[CallDelta]:
    """What a step of a ``required`` stream sends, the text having grown from ``before`` to
    ``now``: each call begun in this step (id, name and its arguments so far), and each earlier
    call's new arguments; calls are written in order, so the first not begun ends the list."""
    out: list[CallDelta] = []
    for index, span in enumerate(required_call_spans(now)):
        if not span.begun or span.args_start is None:
            break
        end = len(now) if span.args_end is None else span.args_end
        if span.begun_within(len(before)):
            if end > len(before):
                out.append(CallDelta(index, arguments=now[len(before):end]))
        else:
            out.append(CallDelta(index, make_tool_call_id(), "function", span.name, now[span.args_start:end]))
    return out


class ForcedCallStream:
    """One choice's stream of the constrained JSON: ``named``, the forced tool's name, or
    ``None`` for ``required``."""

    def __init__(self, named: str | None) -> None:
        self.named = named
        self.text = ""
        self.name_sent = False

    def feed(self, delta: str) -> list[CallDelta]:
        before, self.text = self.text, self.text + delta
        if self.named is None:
            return required_call_deltas(before, self.text)
        if self.name_sent:
            return [CallDelta(0, arguments=delta)]
        self.name_sent = True
        return [CallDelta(0, make_tool_call_id(), "function", self.named, delta)]


__all__ = ["ForcedCallStream", "RequiredCallSpan", "required_call_deltas", "required_call_spans"]
