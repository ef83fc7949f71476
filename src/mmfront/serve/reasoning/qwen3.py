"""``qwen3``: ``<think>...</think>``; a ``<tool_call>`` also ends the reasoning. With
``chat_template_kwargs: {"enable_thinking": false}`` the template closes the block itself, so
the output is content."""

from __future__ import annotations

from mmfront.serve.reasoning.base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    implicit_ends = ("<tool_call>",)

    def extract(self, text: str, *, streamed: bool = False) -> tuple[str | None, str | None]:
        """vLLM's Qwen3 reader drops a ``<think>`` inside reasoning and a ``</think>`` inside
        content, whole or streamed; with thinking off, a whole output is content as it is."""
        if not self.chat_template_kwargs.get("enable_thinking", True):
            return None, text.replace(self.end, "") if streamed else text
        cut, skip = self._end(text)
        if cut == -1:
            return text.replace(self.start, ""), None
        return text[:cut].replace(self.start, ""), text[cut + skip:].replace(self.end, "") or None
