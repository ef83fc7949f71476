"""Reasoning split off a model's output: the text between a start and an end marker is the
answer's ``reasoning``, the rest its ``content``.

A stream is read the same way as a whole output: after each delta the text so far is split
again, short of a tail that may grow into a marker, and what is new in each part is sent; so a
stream assembles to exactly the non-streamed answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from mmfront.serve.tool_parsers.base import partial_overlap


class ReasoningParser:
    """One family's markers. Subclass it for a family mmfront lacks and register it in
    :data:`mmfront.serve.reasoning.REASONING_PARSERS`."""

    name: ClassVar[str]
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"
    implicit_ends: ClassVar[tuple[str, ...]] = ()
    """Text that ends reasoning without the end marker, and stays in the content (Qwen3's
    ``<tool_call>``)."""

    def __init__(self, chat_template_kwargs: Mapping[str, Any] | None = None) -> None:
        self.chat_template_kwargs = dict(chat_template_kwargs or {})

    def extract(self, text: str, *, streamed: bool = False) -> tuple[str | None, str | None]:
        """``(reasoning, content)`` of an output, as vLLM answers it whole or, ``streamed``, as
        its stream sends it: the stream drops every marker (each is one token, which vLLM's
        stream skips), and sends text before a start marker as reasoning (it cannot know yet
        that a start marker follows)."""
        if streamed:
            cut, skip = self._end(text)
            if cut == -1:
                return self._unmarked(text), None
            return self._unmarked(text[:cut]), self._unmarked(text[cut + skip:]) or None
        head, found, tail = text.partition(self.start)
        body = tail if found else head
        cut, skip = self._end(body)
        if cut == -1:
            return body, None
        return body[:cut], body[cut + skip:] or None

    def _unmarked(self, text: str) -> str:
        return text.replace(self.start, "").replace(self.end, "")

    def _end(self, body: str) -> tuple[int, int]:
        """Where reasoning ends in ``body`` and how long the marker to drop there is."""
        ends = [(i, len(self.end)) for i in [body.find(self.end)] if i != -1]
        ends += [(i, 0) for i in (body.find(m) for m in self.implicit_ends) if i != -1]
        return min(ends) if ends else (-1, 0)

    def markers(self) -> tuple[str, ...]:
        return (self.start, self.end, *self.implicit_ends)


@dataclass
class ReasoningDelta:
    reasoning: str | None = None
    content: str | None = None


class ReasoningStream:
    """A reasoning parser over a stream of text deltas (see the module's docstring)."""

    def __init__(self, parser: ReasoningParser) -> None:
        self.parser = parser
        self.text = ""
        self.sent_reasoning = 0
        self.sent_content = 0

    def feed(self, delta: str) -> ReasoningDelta:
        self.text += delta
        held = max((partial_overlap(self.text, m) for m in self.parser.markers()), default=0)
        return self._send(self.text[:len(self.text) - held])

    def finish(self) -> ReasoningDelta:
        return self._send(self.text)

    def _send(self, text: str) -> ReasoningDelta:
        reasoning, content = self.parser.extract(text, streamed=True)
        out = ReasoningDelta()
        reasoning, content = reasoning or "", content or ""
        if len(reasoning) > self.sent_reasoning:
            out.reasoning = reasoning[self.sent_reasoning:]
            self.sent_reasoning = len(reasoning)
        if len(content) > self.sent_content:
            out.content = content[self.sent_content:]
            self.sent_content = len(content)
        return out


__all__ = ["ReasoningDelta", "ReasoningParser", "ReasoningStream"]
